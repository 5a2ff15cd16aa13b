"""`curvcal inspect CKPT`: what a checkpoint holds, read without running any of its code."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from curvcal.load.checkpoint import CheckpointInfo

from curvcal.commands.common import finish, output_options, start
from curvcal.report.tables import Table
from curvcal.results import Report

TENSOR_ROWS = 40
_LIST_CELL = 8


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--allow-global",
    "allow_globals",
    metavar="module.Class",
    multiple=True,
    help="Treat this class as safe for a weights-only load; repeatable.",
)
@output_options
def inspect(checkpoint: Path, allow_globals: tuple[str, ...]) -> int:
    """Show a checkpoint's format, keys, tensors and the classes a pickle would import.

    Never runs code from the file: pickles are scanned opcode by opcode and only loaded
    weights-only when everything they need is allowlisted.
    """
    from curvcal.load.checkpoint import inspect_checkpoint
    from curvcal.provenance import environment, file_info

    start()
    began = time.perf_counter()
    info = inspect_checkpoint(checkpoint, tuple(allow_globals))
    elapsed = time.perf_counter() - began
    report = Report(
        command="inspect",
        results=info,
        inputs={"checkpoint": file_info(checkpoint)},
        settings={"allow_globals": list(allow_globals)},
        timings={"inspect": elapsed},
        environment=environment(),
    )
    return finish(report, inspect_tables(info))


def inspect_tables(info: CheckpointInfo) -> list[Table]:
    """The checkpoint summary table and (when tensors are listed) the tensor table."""
    rows: list[tuple[str, str]] = [
        ("file", str(info.path)),
        ("format", info.format),
        ("container", info.container),
        ("top-level type", info.top_level_type or "-"),
        ("top-level keys", _short_list(info.top_level_keys)),
        ("state-dict key", info.state_dict_key or "-"),
        ("prefix", info.detected_prefix or "-"),
        ("tensors", str(len(info.tensors)) if info.tensors else "-"),
        ("parameters", f"{info.parameter_count:,}" if info.parameter_count is not None else "-"),
        ("classes", str(info.num_classes) if info.num_classes is not None else "-"),
        ("unsafe globals", _short_list(info.unsafe_globals, limit=len(info.unsafe_globals))),
        ("needs --trust-checkpoint", "yes" if info.needs_trust else "no"),
    ]
    rows += [(f"metadata: {key}", value) for key, value in info.metadata.items()]
    tables = [Table(title="checkpoint", columns=("item", "value"), rows=tuple(rows))]
    if info.tensors:
        shown = info.tensors[:TENSOR_ROWS]
        caption = None
        if len(info.tensors) > TENSOR_ROWS:
            caption = f"... and {len(info.tensors) - TENSOR_ROWS} more (all in --json)"
        tables.append(
            Table(
                title="tensors",
                columns=("name", "shape", "dtype"),
                rows=tuple(
                    (s.name, "×".join(map(str, s.shape)) or "scalar", s.dtype) for s in shown
                ),
                caption=caption,
            )
        )
    return tables


def _short_list(items: tuple[str, ...], limit: int = _LIST_CELL) -> str:
    if not items:
        return "-"
    text = ", ".join(items[:limit])
    if len(items) > limit:
        text += f", ... ({len(items) - limit} more)"
    return text
