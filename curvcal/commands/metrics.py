"""`curvcal metrics LOGITS`: calibration metrics (and optional fits) from a logits file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.calibration_options import (
    CalibrationOptions,
    calibration_options,
    dropped_warning,
    nan_policy_option,
    settings_record,
    write_outputs,
)
from curvcal.commands.common import finish, output_options, start
from curvcal.pipeline.fitness import single_class_warning
from curvcal.report.calibration import calibration_tables

if TYPE_CHECKING:
    from curvcal.load.logits import LogitsData

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command()
@click.argument("logits", type=_FILE)
@click.option(
    "--input-kind",
    type=click.Choice(("logits", "probs", "logprobs")),
    default="logits",
    show_default=True,
    help="What the scores are (never guessed).",
)
@click.option(
    "--scores-key", default="logits", show_default=True, help="Name of the scores in the files."
)
@click.option(
    "--labels-key", default="labels", show_default=True, help="Name of the labels in the files."
)
@click.option(
    "--fit",
    "fit_file",
    type=_FILE,
    metavar="FILE",
    help="Fit the maps on this logits file (same kind and keys) and evaluate on LOGITS.",
)
@click.option(
    "--apply",
    "apply_file",
    type=_FILE,
    metavar="CALIBRATOR.json",
    help="Measure the calibrators saved by --save-calibrator on LOGITS (fits nothing).",
)
@calibration_options("Default: none, or both with --fit or --val-split.")
@nan_policy_option
@output_options
def metrics(
    logits: Path,
    input_kind: str,
    scores_key: str,
    labels_key: str,
    fit_file: Path | None,
    apply_file: Path | None,
    calibration: CalibrationOptions,
    nan_policy: str,
) -> int:
    """Calibration metrics of saved logits, probabilities or log-probabilities.

    \b
    With --fit FILE or --val-split F, also fit temperature scaling and focal temperature
    scaling on that split and measure them on the rest; with --apply, measure saved
    calibrators on all of LOGITS.
    """
    from curvcal.calibration.analysis import (
        analyse_calibration,
        analyse_val_split,
        evaluate_calibrators,
    )
    from curvcal.load.data import stratified_split
    from curvcal.load.logits import load_logits
    from curvcal.pipeline.calibrator import load_calibrators
    from curvcal.provenance import environment, file_info
    from curvcal.results import Report

    inputs = [("LOGITS", logits), ("--fit", fit_file), ("--apply", apply_file)]
    output, reporter = start(
        inputs=[(name, path) for name, path in inputs if path is not None],
        outputs=calibration.outputs(),
    )
    method = _resolve_method(calibration, fit_file, apply_file)
    settings = calibration.settings(method)
    calibration.check_outputs(output.force)

    timings: dict[str, float] = {}
    began = time.perf_counter()
    warnings: list[str] = []
    data = load_logits(logits, input_kind, scores_key, labels_key, nan_policy)
    described: dict[str, Any] = {"logits": _describe(logits, data, warnings)}
    fit_data = None
    if fit_file is not None:
        fit_data = load_logits(fit_file, input_kind, scores_key, labels_key, nan_policy)
        described["fit"] = _describe(fit_file, fit_data, warnings)
    for warning in warnings:
        reporter.warn(warning)
    calibrators = None
    if apply_file is not None:
        calibrators = load_calibrators(apply_file)
        described["calibrator"] = file_info(apply_file)
    timings["load"] = time.perf_counter() - began

    began = time.perf_counter()
    source = str(logits)
    if calibrators is not None:
        analysis = evaluate_calibrators(
            data.scores, data.labels, input_kind, calibrators, settings, source
        )
    elif fit_data is not None:
        analysis = analyse_calibration(
            fit_data.scores,
            fit_data.labels,
            data.scores,
            data.labels,
            input_kind,
            settings,
            "fit-file",
            fit_source=str(fit_file),
            eval_source=source,
        )
    elif calibration.val_split is not None:
        fit_idx, eval_idx = stratified_split(data.labels, calibration.val_split, settings.seed)
        analysis = analyse_val_split(
            data.scores,
            data.labels,
            fit_idx,
            eval_idx,
            input_kind,
            settings,
            calibration.val_split,
            f"{source}",
        )
    else:
        analysis = analyse_calibration(
            None, None, data.scores, data.labels, input_kind, settings, "none", eval_source=source
        )
    timings["calibration"] = time.perf_counter() - began
    began = time.perf_counter()
    write_outputs(analysis, calibration)
    timings["outputs"] = time.perf_counter() - began

    report = Report(
        command="metrics",
        results=analysis,
        inputs=described,
        settings={
            **settings_record(calibration, settings),
            "input_kind": input_kind,
            "scores_key": scores_key,
            "labels_key": labels_key,
            "fit": fit_file,
            "apply": apply_file,
            "nan_policy": nan_policy,
        },
        timings=timings,
        environment=environment(),
        warnings=warnings,
    )
    return finish(report, calibration_tables(analysis, chart=output.fmt == "table"))


def _resolve_method(
    calibration: CalibrationOptions, fit_file: Path | None, apply_file: Path | None
) -> str:
    """``--method`` as given, else ``both`` with a fit split and ``none`` without one."""
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


def _describe(path: Path, data: LogitsData, warnings: list[str]) -> dict[str, Any]:
    """The file's provenance and shape; rows left out by --nan-policy drop add a warning."""
    from curvcal.provenance import file_info

    info = file_info(path)
    n_samples, n_classes = data.scores.shape
    if n_classes == 1:
        warnings.append(single_class_warning(str(path)))
    if data.dropped_rows:
        warnings.append(
            dropped_warning(data.dropped_rows, n_samples + data.dropped_rows, str(path))
        )
    return {
        "path": info.path,
        "size_bytes": info.size_bytes,
        "sha256": info.sha256,
        "n_samples": int(n_samples),
        "n_classes": int(n_classes),
        "dropped_rows": data.dropped_rows,
    }
