"""One module per CLI command; each is a thin shell over the library.

Commands are imported only when they run (or when their own ``--help`` is asked for), so
``curvcal --help`` and a command that needs no torch do not pay for torch. A command is listed
here only once it works.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from curvcal.commands.repeats import RefuseRepeats
from curvcal.errors import StdoutClosed

#: name -> (module, attribute, one-line help shown by ``curvcal --help``)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "calibrate": (
        "curvcal.commands.calibrate",
        "calibrate",
        "Calibration metrics of a checkpoint before and after TS / focal TS.",
    ),
    "check": (
        "curvcal.commands.check",
        "check",
        "Measure what a policy gates on a checkpoint and judge it (CI gate).",
    ),
    "compare": (
        "curvcal.commands.compare",
        "compare",
        "Judge a saved report against a policy, with another report as baseline.",
    ),
    "demo": ("curvcal.commands.demo", "demo", "Run curvcal on the bundled digits example."),
    "hessian": (
        "curvcal.commands.hessian",
        "hessian",
        "Top Hessian eigenvalues and trace of the mean loss over a dataset.",
    ),
    "inspect": (
        "curvcal.commands.inspect",
        "inspect",
        "What a checkpoint holds, without running any of its code.",
    ),
    "landscape": (
        "curvcal.commands.landscape",
        "landscape",
        "Loss, accuracy and ECE along the top Hessian eigenvectors or random directions.",
    ),
    "metrics": (
        "curvcal.commands.metrics",
        "metrics",
        "Calibration metrics (and fits) from a saved logits file.",
    ),
    "study": (
        "curvcal.commands.study",
        "study",
        "Curvature vs calibration across checkpoints, with rank correlations.",
    ),
    "version": ("curvcal.commands.version", "version", "Versions of curvcal, torch and device."),
}


def load_command(name: str) -> click.Command:
    """Import and return the command registered as ``name``."""
    module, attribute, _help = COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{module}.{attribute} is not a click command")
    return command


class LazyGroup(RefuseRepeats, click.Group):
    """A click group whose commands are imported on first use; like every command, it refuses
    a single-valued option given twice with different values."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a broken stdout pipe leaves as :class:`StdoutClosed`, since click
        would turn the BrokenPipeError into a silent exit 1 ("a check failed")."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise StdoutClosed() from exc

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        return load_command(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the registry's one-line help (no command is imported)."""
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
