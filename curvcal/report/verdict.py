"""The verdict table shared by ``curvcal check`` and ``curvcal compare``, and the tables of a
check (verdict, then the settings that shaped it)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from curvcal.policy.evaluate import Verdict, VerdictRow
from curvcal.report.tables import Table, fmt_float

VERDICT_COLUMNS = ("metric", "value", "bound", "baseline", "change", "result", "note")


def verdict_table(verdict: Verdict, title: str) -> Table:
    """One row per judged bound; the caption says PASS or FAIL and how many bounds broke."""
    rows = tuple(_row(row) for row in verdict.rows)
    broken = len(verdict.failed_rows)
    if verdict.passed:
        caption = f"PASS: all {len(verdict.rows)} bounds hold"
    else:
        caption = f"FAIL: {broken} of {len(verdict.rows)} bounds broken"
    return Table(title=title, columns=VERDICT_COLUMNS, rows=rows, caption=caption)


def _row(row: VerdictRow) -> tuple[str, ...]:
    value = fmt_float(row.value)
    if row.interval is not None:
        value += f" [{fmt_float(row.interval[0])}, {fmt_float(row.interval[1])}]"
    return (
        row.metric,
        value,
        row.bound_text,
        fmt_float(row.baseline),
        _change(row),
        "pass" if row.passed else "FAIL",
        row.reason,
    )


def _change(row: VerdictRow) -> str:
    if row.change is None:
        return "-"
    if row.bound in ("max_rel_increase", "max_rel_decrease"):
        if math.isinf(row.change):
            return "+inf" if row.change > 0 else "-inf"
        return f"{100 * row.change:+.4g}%"
    return f"{row.change:+.4g}"


class CheckOutcome(Protocol):
    """What the check tables read from a run's result (``curvcal.gate.CheckResult``)."""

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
