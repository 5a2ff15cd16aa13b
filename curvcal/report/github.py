"""``--format github``: GitHub Actions workflow commands, then the markdown summary.

An ``::error`` line per broken bound and a ``::warning`` line per bound that held but whose
95 % interval straddles it (:attr:`~curvcal.policy.evaluate.VerdictRow.borderline`); GitHub
shows them as annotations on the run and its pull request. Then the markdown summary
(:mod:`curvcal.report.markdown`), verdict first.

Escaping follows GitHub's rules for workflow commands: in a message ``%``, ``\\r`` and ``\\n``
become ``%25``, ``%0D`` and ``%0A``; in a property value (``title``, ``file``) also ``:`` and
``,`` (``%3A``, ``%2C``), which would end the property.
"""

from __future__ import annotations

from collections.abc import Sequence

from curvcal.policy.evaluate import VerdictRow
from curvcal.report.judged import JudgedRun, row_message
from curvcal.report.markdown import markdown_report
from curvcal.report.tables import Table
from curvcal.results import Report


def escape_data(text: str) -> str:
    """A workflow command's message, escaped: ``%`` → ``%25``, ``\\r`` → ``%0D``,
    ``\\n`` → ``%0A`` (``%`` first, so an escape is never escaped twice)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value, escaped as a message and ``:`` → ``%3A``,
    ``,`` → ``%2C``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_commands(judged: JudgedRun) -> list[str]:
    """``::error`` for each broken bound, ``::warning`` for each borderline bound that held,
    in the verdict's order; the title names the model and the bound."""
    lines = []
    for row in judged.verdict.rows:
        if not row.passed:
            lines.append(_command("error", judged, row, "broken"))
        elif row.borderline:
            lines.append(_command("warning", judged, row, "borderline"))
    return lines


def _command(level: str, judged: JudgedRun, row: VerdictRow, word: str) -> str:
    title = f"curvcal {judged.command} {word}: {row.metric} {row.bound_text} ({judged.model.name})"
    message = row_message(row)
    if word == "borderline":
        message += " (held, but the 95% interval straddles the bound)"
    return f"::{level} title={escape_property(title)}::{escape_data(message)}"


def github_report(
    report: Report, judged: JudgedRun, tables: Sequence[Table], explain: bool = False
) -> str:
    """The workflow commands of ``judged``, then ``report``'s markdown summary."""
    lines = workflow_commands(judged)
    head = "\n".join(lines) + "\n" if lines else ""
    return head + markdown_report(report, tables, explain)
