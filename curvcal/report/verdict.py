"""The verdict table shared by ``curvcal check`` and ``curvcal compare``."""

from __future__ import annotations

import math

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
