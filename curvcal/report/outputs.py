"""Every output format of a report, in one table, and the one function that emits them.

``--format`` picks what goes to stdout; ``-o FILE`` writes a file whose format follows its
suffix (:data:`FILE_FORMATS`: ``.json`` the JSON result, ``.xml`` JUnit, ``.html`` the page,
``.md`` markdown, ``.yml``/``.yaml`` the model card; any other suffix the JSON result, as
before). Each format is a renderer of the same :class:`~curvcal.results.Report` and the
command's tables; nothing is computed again. The file goes through
:func:`~curvcal.report.tables.write_atomic` (atomic, never replacing an input, exclusive
without ``--force``), whatever its format.

``junit``, ``github`` and ``model-card`` render a verdict: only the commands that judge
(:data:`~curvcal.report.judged.JUDGING_COMMANDS`) offer them, and
:func:`refuse_unjudged_formats` says so before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from curvcal.errors import InputError
from curvcal.report import tables as grids
from curvcal.report.judged import JUDGING_COMMANDS, judged_run
from curvcal.report.tables import Table
from curvcal.results import Report

#: the values of ``--format``
FORMATS = ("table", "json", "markdown", "junit", "github", "html", "model-card")

#: the formats that render a verdict (``check`` and ``compare`` only)
VERDICT_FORMATS = ("junit", "github", "model-card")

#: the format of an ``-o`` file by its suffix (lower-cased); any other suffix: ``json``
FILE_FORMATS = {
    ".json": "json",
    ".xml": "junit",
    ".html": "html",
    ".htm": "html",
    ".md": "markdown",
    ".yml": "model-card",
    ".yaml": "model-card",
}


def file_format(path: Path) -> str:
    """The format ``-o path`` is written in: :data:`FILE_FORMATS` by suffix, else ``json``."""
    return FILE_FORMATS.get(path.suffix.lower(), "json")


def refuse_unjudged_formats(command: str, fmt: str, output: Path | None) -> None:
    """Refuse, before any work, a verdict format (``--format`` or an ``-o`` suffix) asked of a
    command that judges nothing."""
    if command in JUDGING_COMMANDS:
        return
    asked = [(f"--format {fmt}", fmt)]
    if output is not None:
        asked.append((str(output), file_format(output)))
    for where, chosen in asked:
        if chosen in VERDICT_FORMATS:
            raise InputError(
                where,
                f"{chosen} output renders a verdict, and curvcal {command} judges nothing",
                "use it with curvcal check or curvcal compare; "
                "for this command write .json, .md or .html",
            )


def _verdict_renderer(
    render: Callable[..., str],
) -> Callable[[Report, Sequence[Table], bool], str]:
    def rendered(report: Report, tables: Sequence[Table], explain: bool) -> str:
        judged = judged_run(report)
        if judged is None:  # refused before the run by refuse_unjudged_formats
            raise InputError(
                f"curvcal {report.command}", "has no verdict to render", "use check or compare"
            )
        return render(report, judged, tables, explain)

    return rendered


def _renderers() -> dict[str, Callable[[Report, Sequence[Table], bool], str]]:
    from curvcal.report.github import github_report
    from curvcal.report.html import html_report
    from curvcal.report.junit import junit_xml
    from curvcal.report.markdown import markdown_report
    from curvcal.report.model_card import model_card_yaml

    return {
        "json": lambda report, _tables, _explain: grids.to_json_text(report),
        "markdown": markdown_report,
        "html": html_report,
        "junit": _verdict_renderer(lambda _r, judged, _t, _e: junit_xml(judged)),
        "github": _verdict_renderer(github_report),
        "model-card": _verdict_renderer(
            lambda report, judged, _t, _e: model_card_yaml(report, judged)
        ),
    }


def render(fmt: str, report: Report, tables: Sequence[Table], explain: bool = False) -> str:
    """``report`` (with the command's ``tables``) as text in ``fmt`` (any of :data:`FORMATS`
    but ``table``, which :func:`~curvcal.report.tables.render_rich` draws on the terminal)."""
    return _renderers()[fmt](report, tables, explain)


def emit(
    report: Report,
    tables: Sequence[Table],
    fmt: str,
    output: Path | None,
    explain: bool = False,
    header: Table | None = None,
    verbose: bool = False,
) -> None:
    """Show ``report`` on stdout in ``fmt`` and, with ``output``, write it to that file in the
    format its suffix says (:func:`file_format`). ``header``, what was measured
    (:func:`~curvcal.report.header.measured_table`), comes first; ``explain`` shows captions
    whole; ``detail`` tables are shown only with ``verbose`` (:func:`~curvcal.report.tables.shown`)."""
    from curvcal.console import stdout_console

    text = grids.to_json_text(report)  # also validates that the report is JSON-clean
    tables = grids.shown(tables, verbose)
    chosen = grids.chosen_preprocessing_table(report)
    if chosen is not None:
        tables = [chosen, *tables]
    if header is not None:
        tables = [header, *tables]
    if output is not None:
        written = file_format(output)
        grids.write_atomic(
            output, text if written == "json" else render(written, report, tables, explain)
        )
    if fmt == "json":
        stdout_console().out(text, end="", highlight=False)
    elif fmt == "table":
        grids.render_rich(tables, explain)
    else:
        stdout_console().out(render(fmt, report, tables, explain), end="", highlight=False)
