"""`curvcal metrics LOGITS`: calibration metrics (and optional fits) from a logits file."""

from __future__ import annotations

from pathlib import Path

import click

from curvcal.commands.calibration_options import (
    check_outputs,
    refuse_unused_map_options,
    write_outputs,
)
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.repeats import Command
from curvcal.report.calibration import calibration_tables
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import click_options
from curvcal.settings.scores import ScoresSettings

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command(cls=Command)
@click.argument("logits", type=_FILE)
@click_options(ScoresSettings, "scores")
@click_options(CalibrationSettings, "calibration", before=refuse_unused_map_options)
@output_options
def metrics(
    logits: Path,
    scores: ScoresSettings,
    calibration: CalibrationSettings,
) -> int:
    """Calibration metrics of saved logits, probabilities or log-probabilities.

    \b
    With --fit FILE or --val-split F, also fit temperature scaling and focal temperature
    scaling on that split and measure them on the rest; with --apply, measure saved
    calibrators on all of LOGITS.
    """
    from curvcal.pipeline.calibration import MetricsRequest, run_metrics

    inputs = [("LOGITS", logits), ("--fit", scores.fit), ("--apply", scores.apply)]
    output, reporter = start(
        inputs=[(name, path) for name, path in inputs if path is not None],
        outputs=calibration.outputs(),
    )
    method = _resolve_method(calibration, scores.fit, scores.apply)
    if scores.apply_anyway and scores.apply is None:
        raise click.UsageError("--apply-anyway needs --apply")
    check_outputs(calibration, output.force)
    request = MetricsRequest(logits=logits, scores=scores)
    run = run_metrics(
        request,
        calibration.replace(method=method),
        reporter,
        lambda analysis, provenance: write_outputs(analysis, provenance, calibration, logits.name),
    )
    return finish(run.report, calibration_tables(run.analysis, chart=output.fmt == "table"))


def _resolve_method(
    calibration: CalibrationSettings, fit_file: Path | None, apply_file: Path | None
) -> str:
    """``--method`` as given, else ``both`` with a fit split and ``none`` without one."""
    if calibration.method == "laplace":
        raise click.UsageError(
            "--method laplace needs the model, not only logits (the posterior is over the "
            "weights of its last layer): run curvcal calibrate CHECKPOINT --data SPEC "
            "--method laplace"
        )
    has_split = fit_file is not None or calibration.val_split is not None
    if fit_file is not None and calibration.val_split is not None:
        raise click.UsageError("give --fit or --val-split, not both")
    if apply_file is not None:
        if has_split or calibration.method is not None:
            raise click.UsageError(
                "--apply measures saved calibrators and fits nothing: drop "
                "--fit/--val-split/--method"
            )
        if calibration.save_calibrator is not None:
            raise click.UsageError("--save-calibrator needs a fit, and --apply fits nothing")
        return "none"
    method = calibration.method or ("both" if has_split else "none")
    if method != "none" and not has_split:
        raise click.UsageError(f"--method {method} needs a fit split: give --fit or --val-split")
    if method == "none" and has_split:
        raise click.UsageError("--method none fits nothing: drop --fit/--val-split")
    if method == "none" and calibration.save_calibrator is not None:
        raise click.UsageError("--save-calibrator needs a fit: give --fit or --val-split")
    return method
