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
from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.calibration_options import refuse_unused_map_options
from curvcal.commands.checkpoint_options import checkpoint_options as checkpoint_options_decorator
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import data_options as data_options_decorator
from curvcal.commands.repeats import Command
from curvcal.errors import InputError
from curvcal.paths import readable_file
from curvcal.report.study import draw_plots, plot_files, plot_paths, study_tables
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import click_options
from curvcal.settings.hessian import HessianSettings
from curvcal.settings.study import STUDY_HESSIAN_OPTIONS, StudySettings

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

#: the calibration options study takes (its --seed, the Hessian's, also draws the split and
#: seeds the Laplace folds and draws)
STUDY_CALIBRATION_OPTIONS = (
    "val_split",
    "gammas",
    "bins",
    "laplace_structure",
    "laplace_predictive",
    "laplace_samples",
    "laplace_prior",
)


def _refuse_unused_map_options(values: dict[str, Any]) -> None:
    """A map option typed with ``--maps`` that fits no map it shapes is refused, as
    ``calibrate`` refuses it with ``--method``."""
    refuse_unused_map_options(values, "maps")


@click.command(cls=Command)
@click.argument("checkpoints", nargs=-1, required=True, metavar="CKPT...")
@checkpoint_options_decorator
@data_options_decorator()
@click_options(
    CalibrationSettings,
    "calibration",
    only=STUDY_CALIBRATION_OPTIONS,
    before=_refuse_unused_map_options,
)
@click_options(HessianSettings, "hessian", only=STUDY_HESSIAN_OPTIONS)
@click_options(StudySettings, "study_settings")
@output_options
def study(
    checkpoints: tuple[str, ...],
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    calibration: CalibrationSettings,
    hessian: HessianSettings,
    study_settings: StudySettings,
) -> int:
    """λmax and tr(H) against ECE, AdaECE, NLL and the calibration maps (TS and focal TS, or
    --maps) for several checkpoints, with Spearman rank correlations.

    \b
    CKPT... are files or quoted globs ('runs/*.safetensors'). Every checkpoint is measured with
    the same settings: the Hessian of the mean --loss over all of --curvature-data (default
    --data), as `curvcal hessian` measures it (λmax; tr(H) by --trace-method auto), and
    calibration on --data, the --maps fitted on a stratified --val-split part (drawn with
    --seed) and every metric measured on the rest.
    """
    from curvcal.commands.clashes import (
        arch_inputs,
        checkpoint_inputs,
        data_inputs,
        tokenizer_inputs,
    )
    from curvcal.pipeline.study import StudyRequest, run_study

    paths = expand_checkpoints(checkpoints)
    output, reporter = start(
        inputs=[
            *(
                named
                for path in paths
                for named in checkpoint_inputs(
                    "CKPT", path, checkpoint_options.arch, checkpoint_options.base_model
                )
            ),
            *arch_inputs("--arch", checkpoint_options.arch),
            *data_inputs("--data", data_options.data, data_options.data_root),
            *data_inputs("--curvature-data", study_settings.curvature_data, data_options.data_root),
            *tokenizer_inputs("--tokenizer", data_options.tokenizer),
        ],
        outputs=[
            ("--plot", path)
            for path in plot_files(study_settings.plot, study_settings.plot_format).values()
        ],
    )
    plots = plot_paths(study_settings.plot, output.force, study_settings.plot_format)
    request = StudyRequest(
        checkpoints=tuple(paths),
        checkpoint_options=checkpoint_options,
        data_options=data_options,
        hessian=hessian,
        study=study_settings,
        calibration=calibration,
    )
    run = run_study(request, reporter)
    if not run.is_main:  # under torchrun, rank 0 writes
        return 0
    if plots is not None:
        named = paths[0].name if len(paths) == 1 else f"{len(paths)} checkpoints"
        caption = f"{named} on {data_options.data}"
        for note in draw_plots(run.result, plots, caption):
            reporter.info(note)
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
