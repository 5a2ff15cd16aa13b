"""The verdict table shared by ``curvcal check`` and ``curvcal compare``."""

from __future__ import annotations

import math

from curvcal.policy.evaluate import Verdict, VerdictRow
from curvcal.report.judged import value_text
from curvcal.report.tables import Table, fmt_float

VERDICT_COLUMNS = ("metric", "value", "bound", "baseline", "change", "result", "note")


def verdict_table(verdict: Verdict, title: str) -> Table:
    """One row per judged bound; the caption says PASS or FAIL and how many bounds broke."""
    rows = tuple(_row(row) for row in verdict.rows)
    return Table(title=title, columns=VERDICT_COLUMNS, rows=rows, caption=verdict_words(verdict))


def verdict_words(verdict: Verdict) -> str:
    """``PASS: all 8 bounds hold`` or ``FAIL: 2 of 8 bounds broken``, and how many bounds
    are borderline (their 95 % interval straddles the bound, :attr:`VerdictRow.borderline`)."""
    total = len(verdict.rows)
    if verdict.passed:
        words = f"PASS: all {total} bounds hold"
    else:
        words = f"FAIL: {len(verdict.failed_rows)} of {total} bounds broken"
    borderline = sum(row.borderline for row in verdict.rows)
    if borderline:
        words += f" ({borderline} borderline: the 95% interval straddles the bound)"
    return words


def verdict_line(verdict: Verdict) -> str:
    """:func:`verdict_words` behind a mark that reads at a glance: ✅ or ❌."""
    return ("✅ " if verdict.passed else "❌ ") + verdict_words(verdict)


def _row(row: VerdictRow) -> tuple[str, ...]:
    return (
        row.metric,
        value_text(row),
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
