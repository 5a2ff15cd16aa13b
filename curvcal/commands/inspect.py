"""`curvcal inspect CKPT`: what a checkpoint holds, read without running any of its code."""

from __future__ import annotations

import time
from pathlib import Path

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.repeats import Command
from curvcal.report.inspect import inspect_tables
from curvcal.results import Report


@click.command(cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--allow-global",
    "allow_globals",
    metavar="module.Class",
    multiple=True,
    help="Let a weights-only read build this plain data class (never a function or a class "
    "that reaches the OS or the interpreter); repeatable.",
)
@output_options
def inspect(checkpoint: Path, allow_globals: tuple[str, ...]) -> int:
    """Show a checkpoint's format, keys, tensors and the classes a pickle would import.

    Never runs code from the file: pickles are scanned opcode by opcode and only loaded
    weights-only when everything they need is allowlisted.
    """
    from curvcal.load.checkpoint import inspect_checkpoint
    from curvcal.load.digest import file_info
    from curvcal.provenance import environment

    start(inputs=[("CHECKPOINT", checkpoint)])
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
