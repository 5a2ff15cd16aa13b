"""`curvcal landscape CKPT --data SPEC`: the loss, accuracy and ECE of a checkpoint moved along
its top Hessian eigenvectors or random filter-normalised directions, as PyHessian plots them.

A shell over :func:`curvcal.pipeline.landscape.run_landscape`: the options arrive as one
:class:`~curvcal.settings.landscape.LandscapeSettings`; it runs them and hands the result to
the report (and the plot to ``--plot``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import checkpoint_on_data
from curvcal.commands.repeats import Command
from curvcal.settings.fields import click_options
from curvcal.settings.landscape import LandscapeSettings

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings


@click.command(cls=Command)
@checkpoint_on_data
@click_options(LandscapeSettings, "settings")
@output_options
def landscape(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    settings: LandscapeSettings,
) -> int:
    """Loss, accuracy and ECE along the top Hessian eigenvectors or random directions.

    Each point is the model at θ + α·d1 (+ β·d2 with --dims 2), measured on every sample of
    --data in eval mode; the checkpoint's model is restored afterwards.
    """
    from curvcal.commands.clashes import model_and_data_inputs
    from curvcal.pipeline.landscape import run_landscape
    from curvcal.report.landscape import landscape_plot, landscape_tables

    options, reporter = start(
        inputs=model_and_data_inputs(checkpoint, checkpoint_options, data_options),
        outputs=[("--plot", settings.plot)] if settings.plot is not None else [],
    )
    if settings.plot is not None:
        from curvcal.report.hessian import plot_paths

        plot_paths(settings.plot, False, options.force)
    run = run_landscape(checkpoint, checkpoint_options, data_options, settings, reporter)
    caption = f"{checkpoint.name} on {data_options.data}"
    code = finish(run.report, landscape_tables(run.analysis, caption))
    if settings.plot is not None:
        landscape_plot(run.analysis, settings.plot, caption)
    return code
