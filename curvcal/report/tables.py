"""Presentation: tables (rich for people, markdown for CI summaries) and JSON files.

Commands describe what to show as :class:`Table` objects; this module decides how they look.
Files are written atomically so that a report on disk is never half-written; which format goes
where is :mod:`curvcal.report.outputs`'s.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table as RichTable

from curvcal import interrupt
from curvcal.atomic import atomic_output, mark_output, refuse_special, temp_prefix
from curvcal.console import stdout_console
from curvcal.errors import InputError, bounded
from curvcal.inputs import refuse_output
from curvcal.results import Report


@dataclass(frozen=True)
class Table:
    """A titled grid of already-formatted cells; a ``detail`` table is shown on the terminal
    and in markdown only with ``--verbose`` (its numbers are in the JSON either way)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str | None = None
    detail: bool = False


def shown(tables: Sequence[Table], verbose: bool = False) -> list[Table]:
    """The tables a person sees: all with ``verbose``, else those not marked ``detail``."""
    return [table for table in tables if verbose or not table.detail]


def chosen_preprocessing_table(report: Report) -> Table | None:
    """The preprocessing curvcal chose on its own for each dataset the report read (the
    ``chosen_preprocessing`` of its inputs), as the first table; None when it chose nothing."""
    rows: list[tuple[str, ...]] = []
    for role, described in report.inputs.items():
        if isinstance(described, dict):
            for note in described.get("chosen_preprocessing", ()):
                rows.append((f"{role} {described.get('spec', '')}".strip(), str(note)))
    if not rows:
        return None
    return Table(
        title="preprocessing chosen by curvcal (not given as options)",
        columns=("input", "chose"),
        rows=tuple(rows),
    )


def fmt_float(value: float | None, digits: int = 4) -> str:
    """Format a number for a table cell: ``digits`` significant digits, ``-`` for missing."""
    if value is None:
        return "-"
    if value != value:  # NaN
        return "nan"
    return f"{value:.{digits}g}"


def to_json_text(report: Report) -> str:
    """The report as strict JSON text (no NaN/Infinity tokens)."""
    return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"


#: a caption longer than this many characters (two lines at 80 columns) keeps its first
#: clauses; the rest is shown with ``--explain``
CAPTION_CHARACTERS = 156


def short_caption(caption: str | None, explain: bool = False) -> str | None:
    """``caption`` as shown: whole with ``explain``; otherwise its first ``; ``-separated
    clauses that fit in :data:`CAPTION_CHARACTERS`, and ``(more: --explain)`` when some were
    left out."""
    if caption is None or explain or len(caption) <= CAPTION_CHARACTERS:
        return caption
    marker = " (more: --explain)"
    kept = ""
    for clause in caption.split("; "):
        candidate = clause if not kept else f"{kept}; {clause}"
        if len(candidate) + len(marker) > CAPTION_CHARACTERS:
            break
        kept = candidate
    if not kept:  # one long clause: cut at a word
        kept = caption[: CAPTION_CHARACTERS - len(marker) - 1].rsplit(" ", 1)[0] + "…"
    return kept + marker


def _grid(table: Table) -> RichTable:
    grid = RichTable(title=table.title, box=box.SIMPLE_HEAVY, show_header=any(table.columns))
    for i, column in enumerate(table.columns):
        # a cell too long for its column wraps (folding a word if it must), never ends in "…"
        grid.add_column(
            column, justify="right" if numeric_column(table, i) else "left", overflow="fold"
        )
    for row in table.rows:
        grid.add_row(*row)
    return grid


def _transposed(table: Table) -> Table:
    """``table`` with rows and columns exchanged: one column per row (headed by the row's first
    cell), one row per column."""
    columns = (table.columns[0], *(row[0] for row in table.rows))
    rows = tuple(
        (name, *(row[i] if i < len(row) else "" for row in table.rows))
        for i, name in enumerate(table.columns)
        if i > 0
    )
    return Table(title=table.title, columns=columns, rows=rows)


def _per_row(table: Table) -> list[Table]:
    """``table`` as one two-column table per row (column, value), titled by the row's first
    cell."""
    return [
        Table(
            title=f"{table.title}: {row[0]}",
            columns=(table.columns[0], row[0]),
            rows=tuple(zip(table.columns[1:], row[1:], strict=False)),
        )
        for row in table.rows
    ]


def _fits(console: Console, table: Table) -> bool:
    from rich.measure import Measurement

    # a table's minimum width keeps every column as wide as its longest word
    # (measured without the console's limit, which the measurement would be clamped to)
    unbounded = console.options.update_width(1_000_000)
    return Measurement.get(console, unbounded, _grid(table)).minimum <= console.width


def render_rich(tables: Sequence[Table], explain: bool = False) -> None:
    """Each table on stdout, its caption below it at the console's full width (two lines at
    most unless ``explain``, :func:`short_caption`). A table that cannot fit the console's
    width with its words whole (a wide ``study`` table at 80 columns) is shown transposed (a
    column per row) or, if that does not fit either, as a small table per row, rather than
    with its cells cut."""
    console = stdout_console()
    for table in tables:
        if len(table.columns) <= 2 or _fits(console, table):
            parts = [table]
        else:
            turned = _transposed(table)
            parts = [turned] if _fits(console, turned) else _per_row(table)
        for part in parts:
            console.print(_grid(part))
        caption = short_caption(table.caption, explain)
        if caption:
            console.print(caption, style="dim", highlight=False, markup=False)
            console.print()


def numeric_column(table: Table, index: int) -> bool:
    """Whether column ``index`` of ``table`` holds numbers (right-aligned in every output): not
    the first column (it names the rows), and every cell :func:`_looks_numeric`."""
    cells = [row[index] for row in table.rows if index < len(row)]
    return index > 0 and all(_looks_numeric(cell) for cell in cells)


def _looks_numeric(cell: str) -> bool:
    """Numbers (with ``±``, ``%``, ``,`` or a trailing unit word stripped) are right-aligned."""
    words = cell.split()  # a value may carry its interval on a second line
    head = (words[0] if words else "").replace(",", "").rstrip("%").lstrip("±")
    if head in ("-", "nan", "inf", "-inf"):
        return True
    try:
        float(head)
    except ValueError:
        return False
    return True


def render_markdown(tables: Sequence[Table], explain: bool = False) -> str:
    """GitHub-flavoured markdown: a heading and a pipe table per :class:`Table` (captions
    shortened as on the terminal unless ``explain``). Columns align as on the terminal
    (:func:`numeric_column`: numbers right, text left); a table without column names (what was
    measured) is a list of ``**name**: value`` lines, not a pipe table under an empty header."""
    parts: list[str] = []
    for table in tables:
        parts.append(f"### {markdown_inline(table.title)}\n")
        if not any(table.columns) and all(len(row) == 2 for row in table.rows):
            parts.extend(
                f"- **{markdown_inline(row[0])}**: {markdown_inline(row[1])}" for row in table.rows
            )
        else:
            parts.append("| " + " | ".join(markdown_inline(c) for c in table.columns) + " |")
            rules = (
                "---:" if numeric_column(table, i) else ":---" for i in range(len(table.columns))
            )
            parts.append("|" + "|".join(rules) + "|")
            for row in table.rows:
                parts.append("| " + " | ".join(markdown_inline(c) for c in row) + " |")
        caption = short_caption(table.caption, explain)
        if caption:
            parts.append(f"\n{markdown_inline(caption)}")
        parts.append("")
    return "\n".join(parts)


def markdown_code(text: str) -> str:
    """``text`` as a markdown code span on one line: fenced by one backtick more than its
    longest run of backticks (a name holding `` ` `` would end a one-backtick span early and
    the rest would be read as markdown), with a space inside the fence when it needs one."""
    line = " ".join(bounded(text).splitlines())
    longest = max((len(run) for run in re.findall(r"`+", line)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def markdown_inline(text: str) -> str:
    """``text`` (a title, a cell, a name) as markdown that stays where it is put: on one line
    (a line break in a file's name would start a new heading or list item in a job summary),
    its ``|`` escaped (it would end a table cell), a long name cut in the middle with its length
    as on the terminal (:func:`~curvcal.errors.bounded`: a person reads the summary, and a
    300,000-character state-dict key would fill a job summary's size limit; the JSON keeps it
    whole)."""
    return " ".join(bounded(text).replace("|", "\\|").splitlines())


def check_output_path(path: Path, force: bool) -> None:
    """Refuse, before any work is done, an output path that cannot be written or would be
    overwritten without ``--force``."""
    if str(path) == "-":  # the usual spelling of standard output, not a file to create
        raise InputError(
            "-o -", "reports are written to files, not to standard output", "use --json to print it"
        )
    refuse_special(path)
    refuse_output(path)  # an input of the run (so far), whatever --force says
    if path.exists() and not force:
        raise InputError(str(path), "already exists", "pass --force to overwrite it")
    # without --force, a file that takes the name while the run works is not replaced either
    mark_output(path, replace=force)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(str(path), f"directory {parent} does not exist")
    # Permissions alone do not tell (root ignores them; a read-only or virtual file system
    # does not): create and remove a scratch file where the report's temporary file will go.
    with interrupt.held():  # Ctrl-C waits until the scratch file is gone again
        try:
            handle, probe = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".probe", dir=parent)
        except OSError as exc:
            raise InputError(
                str(path), f"directory {parent} is not writable ({exc.strerror or exc})"
            ) from None
        os.close(handle)
        Path(probe).unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename,
    so readers see either the old file or the whole new one."""
    with atomic_output(path) as out:
        out.write(text.encode("utf-8"))
