"""One module per CLI command; each is a thin shell over the library."""

from __future__ import annotations

import click


def commands() -> list[click.Command]:
    """The registered commands (a command is listed here only once it works)."""
    from curvcal.commands.calibrate import calibrate
    from curvcal.commands.compare import compare
    from curvcal.commands.demo import demo
    from curvcal.commands.inspect import inspect
    from curvcal.commands.metrics import metrics
    from curvcal.commands.version import version

    return [calibrate, compare, demo, inspect, metrics, version]
