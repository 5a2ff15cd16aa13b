"""The tables of a check: the verdict, then the settings that shaped it (``curvcal check`` and
``curvcal demo``)."""

from __future__ import annotations

from typing import Any, Protocol

from curvcal.policy.evaluate import Verdict
from curvcal.report.tables import Table
from curvcal.report.verdict import verdict_table


class CheckOutcome(Protocol):
    """What the check tables read from the result of a check run."""

    @property
    def verdict(self) -> Verdict: ...

    @property
    def settings(self) -> dict[str, Any]: ...

    @property
    def sources(self) -> dict[str, str]: ...


def check_tables(result: CheckOutcome, title: str) -> list[Table]:
    """The verdict table, then the settings that shaped the numbers and where each came from."""
    shown = [
        (name, _setting_text(value), result.sources[name])
        for name, value in result.settings.items()
        if result.sources[name] != "default"
    ]
    tables = [verdict_table(result.verdict, title)]
    if shown:
        tables.append(
            Table(
                title="settings",
                columns=("setting", "value", "from"),
                rows=tuple(shown),
                caption="an option on the command line overrides the policy; settings not "
                "shown are at their defaults",
            )
        )
    return tables


def _setting_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)
