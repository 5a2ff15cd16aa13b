"""`curvcal calibrate CKPT --data SPEC`: predict, fit calibration maps, measure every stage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from curvcal.commands.calibration_options import (
    check_outputs,
    refuse_unused_map_options,
    write_outputs,
)
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import checkpoint_on_data
from curvcal.commands.repeats import Command
from curvcal.errors import EXIT_OK
from curvcal.report.calibration import calibration_tables
from curvcal.report.tables import check_output_path
from curvcal.settings.calibrate import CalibrateSettings
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import click_options

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings


@click.command(cls=Command)
@checkpoint_on_data
@click_options(CalibrateSettings, "files")
# the maps run where the model does: --device is the checkpoint's (CheckpointSettings.device)
@click_options(
    CalibrationSettings, "calibration", exclude=("device",), before=refuse_unused_map_options
)
@output_options
def calibrate(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    files: CalibrateSettings,
    calibration: CalibrationSettings,
) -> int:
    """Fit temperature scaling and focal temperature scaling on one split of the data and
    measure ECE, AdaECE, NLL, Brier and friends on another.

    \b
    The fit split is --val-split F of --data (stratified, default 0.5, seeded by --seed), or
    all of --fit-data. Every metric is measured on the evaluation split only.
    """
    from curvcal.commands.clashes import model_and_data_inputs
    from curvcal.pipeline.calibration import CalibrateRequest, run_calibrate

    written = calibration.outputs()
    if files.save_logits is not None:
        written.append(("--save-logits", files.save_logits))
    output, reporter = start(
        inputs=[
            *model_and_data_inputs(
                checkpoint, checkpoint_options, data_options, [("--fit-data", files.fit_data)]
            ),
            *([("--apply", files.apply)] if files.apply is not None else []),
        ],
        outputs=written,
    )
    if files.apply is not None:
        if (
            calibration.method is not None
            or calibration.val_split is not None
            or files.fit_data is not None
        ):
            raise click.UsageError(
                "--apply measures saved calibrators and fits nothing: drop "
                "--method/--val-split/--fit-data"
            )
        if calibration.save_calibrator is not None:
            raise click.UsageError("--save-calibrator needs a fit, and --apply fits nothing")
    method = calibration.method or ("none" if files.apply is not None else "both")
    if method == "none" and (calibration.val_split is not None or files.fit_data is not None):
        raise click.UsageError("--method none fits nothing: drop --val-split/--fit-data")
    if files.fit_data is not None and calibration.val_split is not None:
        raise click.UsageError("give --val-split or --fit-data, not both")
    if method == "none" and calibration.save_calibrator is not None:
        raise click.UsageError("--save-calibrator needs a fit: --method ts, focal-ts or both")
    check_outputs(calibration, output.force)
    if files.save_logits is not None:
        _check_logits_path(files.save_logits, output.force)
    request = CalibrateRequest(
        checkpoint=checkpoint,
        checkpoint_options=checkpoint_options,
        data_options=data_options,
        files=files,
    )
    run = run_calibrate(
        request,
        calibration.replace(method=method),
        reporter,
        lambda analysis, provenance: write_outputs(
            analysis, provenance, calibration, f"{checkpoint.name} on {data_options.data}"
        ),
    )
    if run is None:  # a rank other than 0 under torchrun: rank 0 reports
        return EXIT_OK
    return finish(run.report, calibration_tables(run.analysis, chart=output.fmt == "table"))


def _check_logits_path(path: Path, force: bool) -> None:
    from curvcal.load.files.tensorfile import is_tensor_file

    if not is_tensor_file(path):
        raise click.BadParameter(
            f"cannot tell the format of {path} (name a .npz, .pt or .safetensors file)",
            param_hint="'--save-logits'",
        )
    check_output_path(path, force)
