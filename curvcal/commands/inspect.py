"""`curvcal inspect CKPT`: what a checkpoint holds, read without running any of its code."""

from __future__ import annotations

import time
from pathlib import Path

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.repeats import Command
from curvcal.report.inspect import inspect_tables
from curvcal.results import Report
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.fields import click_options


@click.command(cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click_options(CheckpointSettings, "checkpoint_options", only=("allow_global",))
@output_options
def inspect(checkpoint: Path, checkpoint_options: CheckpointSettings) -> int:
    """Show a checkpoint's format, keys, tensors and the classes a pickle would import.

    Never runs code from the file: pickles are scanned opcode by opcode and only loaded
    weights-only when everything they need is allowlisted.
    """
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.load.checkpoints.inspect import inspect_checkpoint
    from curvcal.pipeline.provenance import environment

    start(inputs=[("CHECKPOINT", checkpoint)])
    began = time.perf_counter()
    info = inspect_checkpoint(checkpoint, checkpoint_options.allow_global)
    elapsed = time.perf_counter() - began
    report = Report(
        command="inspect",
        results=info,
        inputs={"checkpoint": file_info(checkpoint)},
        settings={"checkpoint": {"allow_global": list(checkpoint_options.allow_global)}},
        timings={"inspect": elapsed},
        environment=environment(),
    )
    return finish(report, inspect_tables(info))
