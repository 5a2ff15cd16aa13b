"""One module per CLI command; each is a thin shell over the library."""

from __future__ import annotations

import click


def commands() -> list[click.Command]:
    """The registered commands (a command is listed here only once it works)."""
    from curvcal.commands.compare import compare
    from curvcal.commands.demo import demo
    from curvcal.commands.hessian import hessian
    from curvcal.commands.inspect import inspect
    from curvcal.commands.version import version

    return [compare, demo, hessian, inspect, version]
