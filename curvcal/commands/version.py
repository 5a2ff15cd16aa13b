"""`curvcal version`: the software and machine the numbers would be computed with."""

from __future__ import annotations

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.repeats import Command
from curvcal.report.tables import Table
from curvcal.results import Report


@click.command(cls=Command)
@click.option("--device", default="auto", show_default=True, help="Device to describe.")
@output_options
def version(device: str) -> int:
    """Show versions of curvcal, torch and the device in use."""
    import torch

    from curvcal.pipeline.provenance import environment

    start()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(device)
    env.pop("command_line", None)
    report = Report(command="version", results=env, environment=environment(device))
    rows = tuple((key, str(value)) for key, value in env.items())
    return finish(report, [Table(title="curvcal", columns=("item", "value"), rows=rows)])
