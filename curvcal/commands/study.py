"""`curvcal study CKPT... --data SPEC`: curvature and calibration of several checkpoints measured
the same way, one table, and the rank correlations between the two.

A shell over :func:`curvcal.pipeline.study.run_study`, which loads each checkpoint, measures
λmax and tr(H) of the Hessian on ``--curvature-data`` (default ``--data``) and calibrates on
``--data`` (maps fitted on a stratified ``--val-split`` part, every metric on the rest); the rows
go to the report.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from curvcal import choices
from curvcal.commands.checkpoint_options import checkpoint_options as checkpoint_options_decorator
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import data_options as data_options_decorator
from curvcal.commands.repeats import Command
from curvcal.errors import InputError
from curvcal.paths import readable_file
from curvcal.report.study import PLOT_FILES, draw_plots, plot_files, plot_paths, study_tables
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import click_options

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

#: the calibration options study takes (its --seed seeds the Hessian's vectors and the split)
STUDY_CALIBRATION_OPTIONS = ("val_split", "gammas", "bins")


@click.command(cls=Command)
@click.argument("checkpoints", nargs=-1, required=True, metavar="CKPT...")
@checkpoint_options_decorator
@data_options_decorator()
@click.option(
    "--curvature-data",
    metavar="SPEC",
    help="Measure the Hessian on this dataset (same data options as --data); default --data.",
)
@click.option(
    "--loss",
    type=click.Choice(choices.HESSIAN_LOSSES),
    default="ce",
    show_default=True,
    help="Hessian of: ce, focal (with --gamma), or own: each checkpoint's training loss from "
    "its metadata (ce, focal γ, flsd53).",
)
@click.option("--gamma", type=click.FloatRange(min=0), help="γ of --loss focal.")
@click.option(
    "--method",
    type=click.Choice(choices.EIGEN_METHODS),
    default="lanczos",
    show_default=True,
    help="Eigenvalue method for λmax.",
)
@click.option(
    "--tol",
    type=click.FloatRange(min=0, min_open=True),
    default=1e-4,
    show_default=True,
    help="Relative tolerance of λmax.",
)
@click.option("--max-iter", type=click.IntRange(min=1), help="Iteration budget of λmax.")
@click.option(
    "--probes",
    type=click.IntRange(min=4),
    default=50,
    show_default=True,
    help="Hessian-vector products for the Hutch++ estimate of tr(H); tr(H) is exact by "
    "Gauss–Newton instead where the logits are linear in each parameter tensor and the classes "
    "are at most this plus one.",
)
@click_options(CalibrationSettings, "calibration", only=STUDY_CALIBRATION_OPTIONS)
@click.option(
    "--seed",
    type=click.IntRange(0, choices.MAX_SEED),
    default=0,
    show_default=True,
    help="Seed of the Lanczos start, the probes and --val-split.",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=f"Write {PLOT_FILES['gamma']} and {PLOT_FILES['ece']} into DIR (needs matplotlib).",
)
@output_options
def study(
    checkpoints: tuple[str, ...],
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    curvature_data: str | None,
    loss: str,
    gamma: float | None,
    method: str,
    tol: float,
    max_iter: int | None,
    probes: int,
    calibration: CalibrationSettings,
    seed: int,
    plot_dir: Path | None,
) -> int:
    """λmax and tr(H) against ECE, AdaECE, NLL, temperature and focal TS for several
    checkpoints, with Spearman rank correlations.

    \b
    CKPT... are files or quoted globs ('runs/*.safetensors'). Every checkpoint is measured with
    the same settings: the Hessian of the mean --loss over all of --curvature-data (default
    --data), and calibration on --data, maps fitted on a stratified --val-split part and every
    metric measured on the rest.
    """
    from curvcal.outputs import arch_inputs, checkpoint_inputs, data_inputs, tokenizer_inputs
    from curvcal.pipeline.study import StudyRequest, run_study

    paths = expand_checkpoints(checkpoints)
    output, reporter = start(
        inputs=[
            *(
                named
                for path in paths
                for named in checkpoint_inputs("CKPT", path, checkpoint_options.arch)
            ),
            *arch_inputs("--arch", checkpoint_options.arch),
            *data_inputs("--data", data_options.data, data_options.data_root),
            *data_inputs("--curvature-data", curvature_data, data_options.data_root),
            *tokenizer_inputs("--tokenizer", data_options.tokenizer),
        ],
        outputs=[("--plot", path) for path in plot_files(plot_dir).values()],
    )
    plots = plot_paths(plot_dir, output.force)
    request = StudyRequest(
        checkpoints=tuple(paths),
        checkpoint_options=checkpoint_options,
        data_options=data_options,
        batch_size=data_options.batch_size,
        curvature_data=curvature_data,
        loss=loss,
        gamma=gamma,
        method=method,
        tol=tol,
        max_iter=max_iter,
        probes=probes,
        calibration=calibration,
        seed=seed,
        plot_dir=plot_dir,
    )
    run = run_study(request, reporter)
    if plots is not None:
        draw_plots(run.result, plots)
    return finish(run.report, study_tables(run.result))


def expand_checkpoints(arguments: tuple[str, ...]) -> list[Path]:
    """Files named on the command line, a quoted glob expanded in sorted order; each must
    exist and be named once."""
    paths: list[Path] = []
    for argument in arguments:
        if os.path.lexists(argument):  # a loop or a broken link gets its own message
            if not os.path.isdir(
                argument
            ):  # a folder is a model folder, or the loader says why not
                readable_file(Path(argument), expected="checkpoint file")
            paths.append(Path(argument))
            continue
        matches = sorted(glob.glob(argument)) if glob.has_magic(argument) else []
        if not matches:
            raise InputError(argument, "no such checkpoint file (nor a glob matching one)")
        paths.extend(Path(m) for m in matches)
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise InputError(str(path), "is named twice", "give each checkpoint once")
        seen.add(path.resolve())
    return paths
