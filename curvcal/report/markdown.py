"""``--format markdown``: a report as GitHub-flavoured markdown, for a CI job summary.

A judged run (``check``, ``compare``) opens with its verdict, ``✅ PASS: ...`` or
``❌ FAIL: 2 of 8 bounds broken``, and the baseline it was compared with (file, tag, commit,
digest), then the verdict table, then the other tables; any other report is its tables
(:func:`~curvcal.report.tables.render_markdown`).
"""

from __future__ import annotations

from collections.abc import Sequence

from curvcal.report.judged import JudgedRun, judged_run
from curvcal.report.tables import Table, markdown_code, markdown_inline, render_markdown
from curvcal.report.verdict import VERDICT_COLUMNS, verdict_line
from curvcal.results import Report


def markdown_report(report: Report, tables: Sequence[Table], explain: bool = False) -> str:
    """``tables`` as markdown, behind the verdict of a judged ``report``."""
    judged = judged_run(report)
    if judged is None:
        return render_markdown(tables, explain)
    verdicts = [table for table in tables if table.columns == VERDICT_COLUMNS]
    others = [table for table in tables if table.columns != VERDICT_COLUMNS]
    return verdict_heading(judged) + "\n" + render_markdown([*verdicts, *others], explain)


def verdict_heading(judged: JudgedRun) -> str:
    """The lines a summary opens with: the verdict, what was judged, and against what."""
    lines = [f"## {verdict_line(judged.verdict)}", ""]
    about = f"**{markdown_inline(judged.model.describe())}**"
    if judged.data_spec:
        n = f", N = {judged.n_samples}" if judged.n_samples is not None else ""
        about += f" on {markdown_code(judged.data_spec)}{n}"
    if judged.policy:
        about += f", policy {markdown_code(judged.policy)}"
    lines.append(f"curvcal {judged.command}: {about}  ")
    if judged.baseline is not None:
        lines.append(f"baseline: {markdown_inline(judged.baseline.describe())}")
    else:
        lines.append("baseline: none")
    lines.append("")
    return "\n".join(lines)
