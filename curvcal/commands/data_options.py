"""The dataset options of the commands that read data, derived from
:class:`~curvcal.settings.data.DataSettings`' fields.

``@data_options()`` adds ``--data`` (required unless ``required=False``) and every other field
as an option, and passes ``data_options``: a :class:`DataSettings`, or ``None`` when ``--data``
is optional and not given (any other data option then is refused). Trust for ``py:``
factories is not one of these options: the command passes ``--trust-checkpoint`` on with
``data_options.replace(trust_checkpoint=...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from curvcal.commands.checkpoint_options import checkpoint_options
from curvcal.settings.data import TEXT_FIELDS, DataSettings
from curvcal.settings.fields import cli_fields, click_options, default_of, gather, option_name

F = TypeVar("F", bound=Callable[..., Any])


def _optional(kwargs: dict[str, Any]) -> DataSettings | None:
    """Without ``--data``: ``None``, refusing any other data option given."""
    if kwargs.get("data") is not None:
        return gather(DataSettings, kwargs)
    given = []
    for field, _spec in cli_fields(DataSettings):
        value = kwargs.pop(field.name)
        if field.name not in ("data", "batch_size") and value not in (None, default_of(field)):
            given.append(option_name(field.name))
    if given:
        raise click.UsageError(f"{', '.join(given)} given without --data")
    return None


def data_options(required: bool = True) -> Callable[[F], F]:
    """Decorator factory adding the dataset options (``--data`` required unless told not)."""
    if required:
        return click_options(DataSettings, "data_options", required=("data",))
    return click_options(DataSettings, "data_options", build=_optional)


def text_options(func: F) -> F:
    """Only the text data options (``check``, whose data a policy names); each arrives under its
    own keyword (``text_key``, ``label_key``, ...)."""
    from curvcal.settings.fields import click_option

    command: Any = func
    for field, spec in reversed(cli_fields(DataSettings, only=TEXT_FIELDS)):
        command = click_option(DataSettings, field, spec)(command)
    return command


def checkpoint_on_data(function: F) -> F:
    """What a command that runs one checkpoint on ``--data`` takes first: the CHECKPOINT
    argument, the checkpoint options (``checkpoint_options``) and the dataset options
    (``data_options``, ``--data`` required), in that order on the command line and in help."""
    with_data = data_options()(function)
    return click.argument("checkpoint", type=click.Path(path_type=Path))(
        checkpoint_options(with_data)
    )
