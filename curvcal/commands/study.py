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
from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT
from curvcal.report.study import draw_plots, plot_files, plot_paths, study_tables
from curvcal.settings.fields import click_options
from curvcal.settings.hessian import HessianSettings
from curvcal.settings.study import STUDY_HESSIAN_OPTIONS, StudySettings

if TYPE_CHECKING:
    from curvcal.load.checkpoint import CheckpointOptions
    from curvcal.load.data import DataOptions


@click.command(cls=Command)
@click.argument("checkpoints", nargs=-1, required=True, metavar="CKPT...")
@checkpoint_options_decorator
@data_options_decorator()
@click.option(
    "--val-split",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=DEFAULT_VAL_SPLIT,
    show_default=True,
    metavar="F",
    help="Fit TS and focal TS on a stratified fraction F of --data, measure on the rest.",
)
@click.option(
    "--gammas",
    metavar="G1,G2,...",
    help="γ grid of focal temperature scaling [default: 0,0.25,0.5,0.75,1,1.5,2,3,5,7].",
)
@click.option(
    "--bins",
    type=click.IntRange(1, choices.MAX_BINS),
    default=15,
    show_default=True,
    help="ECE/AdaECE bins.",
)
@click_options(HessianSettings, "hessian", only=STUDY_HESSIAN_OPTIONS)
@click_options(StudySettings, "study_settings")
@output_options
def study(
    checkpoints: tuple[str, ...],
    checkpoint_options: CheckpointOptions,
    data_options: DataOptions,
    batch_size: int,
    val_split: float,
    gammas: str | None,
    bins: int,
    hessian: HessianSettings,
    study_settings: StudySettings,
) -> int:
    """λmax and tr(H) against ECE, AdaECE, NLL, temperature and focal TS for several
    checkpoints, with Spearman rank correlations.

    \b
    CKPT... are files or quoted globs ('runs/*.safetensors'). Every checkpoint is measured with
    the same settings: the Hessian of the mean --loss over all of --curvature-data (default
    --data), as `curvcal hessian` measures it (λmax; tr(H) by --trace-method auto), and
    calibration on --data, maps fitted on a stratified --val-split part (drawn with --seed) and
    every metric measured on the rest.
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
            *data_inputs("--data", data_options.spec, data_options.root),
            *data_inputs("--curvature-data", study_settings.curvature_data, data_options.root),
            *tokenizer_inputs("--tokenizer", data_options.tokenizer),
        ],
        outputs=[("--plot", path) for path in plot_files(study_settings.plot).values()],
    )
    plots = plot_paths(study_settings.plot, output.force)
    request = StudyRequest(
        checkpoints=tuple(paths),
        checkpoint_options=checkpoint_options,
        data_options=data_options,
        batch_size=batch_size,
        hessian=hessian,
        study=study_settings,
        val_split=val_split,
        gammas=_gamma_grid(gammas) if gammas is not None else None,
        bins=bins,
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


def _gamma_grid(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError("--gammas", f"takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise InputError("--gammas", "needs at least one value")
    return values
