"""The checkpoint options of every command that loads a checkpoint, derived from
:class:`~curvcal.settings.checkpoint.CheckpointSettings`' fields; the command receives them as
one ``checkpoint_options`` keyword argument."""

from __future__ import annotations

from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.fields import click_options

checkpoint_options = click_options(CheckpointSettings, "checkpoint_options")
