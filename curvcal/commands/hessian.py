"""`curvcal hessian CKPT --data SPEC`: eigenvalues, trace, density and per-module curvature of the
Hessian of a checkpoint's mean loss over a dataset.

A shell over :func:`curvcal.pipeline.hessian.run_hessian`: the options arrive as one
:class:`~curvcal.settings.hessian.HessianSettings`; it runs them and hands the result to the report. Under ``torchrun`` every rank measures its shard of
the data, products are summed across ranks, and only rank 0 prints or writes anything.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.common import end_with, finish, output_options, start, typed_options
from curvcal.commands.data_options import checkpoint_on_data
from curvcal.commands.repeats import Command
from curvcal.report.hessian import hessian_tables, plot_outputs, plot_paths, write_plots
from curvcal.report.landscape import eigenvector_path, write_eigenvectors
from curvcal.settings.fields import click_options, option_name
from curvcal.settings.hessian import HessianSettings

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings


#: the fields whose options only shape the trace
_TRACE_FIELDS = ("trace_method", "probes", "trace_rtol", "probe_dist")


def _refuse_unused_trace_options(values: dict[str, Any]) -> None:
    """Options typed for a trace that will not use them are a mistake to report, not to ignore:
    any trace option with --no-trace, and --probe-dist with the exact Gauss–Newton trace (which
    draws no probe). --per-layer's layer traces use --probes and --probe-dist whatever the
    whole trace does."""
    from curvcal.errors import InputError

    layers_use = ("probes", "probe_dist") if values["per_layer"] else ()
    unused = [name for name in _TRACE_FIELDS if name not in layers_use]
    typed = [option_name(name) for name in typed_options(unused)]
    if not values["trace"] and typed:
        raise InputError(
            "--no-trace", f"no trace is computed, so {', '.join(typed)} would do nothing",
            "leave them out, or drop --no-trace",
        )  # fmt: skip
    if values["trace_method"] == "gauss-newton" and "--probe-dist" in typed:
        raise InputError(
            "--probe-dist",
            "the gauss-newton trace is exact and draws no probe",
            "leave out --probe-dist, or pick an estimator with --trace-method",
        )


@click.command(cls=Command)
@checkpoint_on_data
@click_options(HessianSettings, "settings", before=_refuse_unused_trace_options)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the top-k spectrum (and the density with --density) to a .png, .svg or .pdf "
    "file; with --per-layer also a bar chart to FILE's name + '-layers' (needs matplotlib).",
)
@click.option(
    "--save-eigenvectors",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the top-k eigenvectors to a .safetensors file, one tensor per eigenvector and "
    "parameter ('v0/fc.weight' for λmax), with the eigenvalues and the checkpoint's SHA-256 "
    "in its metadata.",
)
@output_options
def hessian(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    settings: HessianSettings,
    plot: Path | None,
    save_eigenvectors: Path | None,
) -> int:
    """Top eigenvalues, trace and more of the Hessian of the mean loss over a dataset.

    The loss is averaged over every sample of --data, in eval mode unless --mode train.
    """
    from curvcal.commands.clashes import model_and_data_inputs
    from curvcal.pipeline.hessian import run_hessian

    options, reporter = start(
        inputs=model_and_data_inputs(checkpoint, checkpoint_options, data_options),
        outputs=[
            *plot_outputs(plot, settings.per_layer),
            *([("--save-eigenvectors", save_eigenvectors)] if save_eigenvectors else []),
        ],
    )
    plots = plot_paths(plot, settings.per_layer, options.force) if plot is not None else None
    if save_eigenvectors is not None:
        eigenvector_path(save_eigenvectors, options.force)
    save_vectors = (
        None
        if save_eigenvectors is None
        else functools.partial(write_eigenvectors, save_eigenvectors)
    )
    run = run_hessian(
        checkpoint, checkpoint_options, data_options, settings, reporter, save_vectors
    )
    if not run.is_main:
        return run.exit_code
    code = finish(run.report, hessian_tables(run.analysis, run.device))
    if plots is not None:
        write_plots(run.analysis, *plots, caption=f"{checkpoint.name} on {data_options.data}")
    return end_with(run.failure, code)
