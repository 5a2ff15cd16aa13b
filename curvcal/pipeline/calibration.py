"""``curvcal calibrate`` and ``curvcal metrics``: scores in (predicted by a checkpoint, or read
from a logits file), the split, the calibration analysis and its report out.

Both share one last step, :func:`analyse`: fit the maps on the fit split (another dataset or
file, or a stratified fraction) and measure every stage on the evaluation split only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError, NumericalError
from curvcal.results import Report
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import groups, record

if TYPE_CHECKING:
    import torch

    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.console import Reporter
    from curvcal.load.logits import LogitsData
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

DEFAULT_VAL_SPLIT = 0.5

#: Called with the analysis and the provenance of its fit to write the files the options ask
#: for (calibrator, plot).
WriteOutputs = Callable[["CalibrationAnalysis", "CalibratorProvenance"], None]


@dataclass(frozen=True)
class CalibrateRequest:
    """What ``curvcal calibrate`` reads and writes beyond its calibration settings: the
    checkpoint and data (with ``fit_data`` to fit on), and the ``save_logits`` file."""

    checkpoint: Path
    checkpoint_options: CheckpointSettings
    data_options: DataSettings
    batch_size: int
    fit_data: str | None = None
    save_logits: Path | None = None


@dataclass(frozen=True)
class MetricsRequest:
    """What ``curvcal metrics`` reads beyond its calibration settings: the logits file and how
    to read it, the ``fit_file`` to fit on or the ``apply_file`` of saved calibrators, and
    whether to refuse probability-like logits (``strict``) or a calibrator that does not match
    them (unless ``apply_anyway``)."""

    logits: Path
    input_kind: str
    scores_key: str
    labels_key: str
    fit_file: Path | None = None
    apply_file: Path | None = None
    strict: bool = False
    apply_anyway: bool = False


@dataclass(frozen=True)
class CalibrationRun:
    """A finished calibration run: the analysis and its report."""

    analysis: CalibrationAnalysis
    report: Report


def dropped_warning(count: int, total: int, source: str) -> str:
    """The warning for rows left out by ``--nan-policy drop``."""
    return f"{source}: left out {count} of {total} rows with a NaN or Inf (--nan-policy drop)"


def analyse(
    scores: Any,
    labels: Any,
    kind: str,
    settings: CalibrationSettings,
    source: str,
    *,
    fit: tuple[Any, Any] | None = None,
    fit_source: str = "",
    fit_split: str = "fit-data",
    fraction: float | None = None,
) -> CalibrationAnalysis:
    """The calibration analysis of ``scores``: maps fitted on ``fit`` (a separate split named
    ``fit_split``), else on a stratified ``fraction`` of the rows (seeded by the settings), else
    nothing fitted; every stage measured on the evaluation rows only."""
    from curvcal.calibration.analysis import analyse_calibration, analyse_val_split
    from curvcal.load.labels import stratified_split

    if fit is not None:
        return analyse_calibration(
            *fit,
            scores,
            labels,
            kind,
            settings,
            fit_split,
            fit_source=fit_source,
            eval_source=source,
        )
    if fraction is not None:
        fit_idx, eval_idx = stratified_split(labels, fraction, settings.seed, source)
        return analyse_val_split(
            scores, labels, fit_idx, eval_idx, kind, settings, fraction, source
        )
    return analyse_calibration(
        None, None, scores, labels, kind, settings, "none", eval_source=source
    )


def _timed_write(
    analysis: CalibrationAnalysis,
    provenance: CalibratorProvenance,
    write: WriteOutputs | None,
    timings: dict[str, float],
) -> None:
    began = time.perf_counter()
    if write is not None:
        write(analysis, provenance)
    timings["outputs"] = time.perf_counter() - began


def _fit_record(
    analysis: CalibrationAnalysis, source: str, files: list[Any]
) -> dict[str, Any] | None:
    """The fit data of a calibrator's provenance: where it came from and the first file's
    path, size and SHA-256 (``None`` each when it was no file, e.g. a torchvision dataset)."""
    if analysis.split.method == "none":
        return None
    first = files[0] if files else None
    return {
        "source": source,
        "path": getattr(first, "path", None),
        "sha256": getattr(first, "sha256", None),
        "size_bytes": getattr(first, "size_bytes", None),
        "n_samples": analysis.split.n_fit,
    }


def _split_source(analysis: CalibrationAnalysis, source: str) -> str:
    split = analysis.split
    if split.fraction is None:
        return source
    return f"--val-split {split.fraction:g} of {source} (seed {split.seed})"


def run_calibrate(
    request: CalibrateRequest,
    settings: CalibrationSettings,
    reporter: Reporter,
    write: WriteOutputs | None = None,
) -> CalibrationRun | None:
    """Predict every sample of the data (and fit data), then fit and measure the maps as
    ``settings`` ask (``settings.method`` resolved: ``none`` fits nothing).

    Under torchrun every rank predicts its shard and leaves; rank 0 gets the logits of all
    samples, runs the analysis and returns the run (the other ranks return ``None``).
    """
    import dataclasses

    from curvcal.calibration.inputs import looks_like_probabilities
    from curvcal.console import Reporter
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.digest import file_info
    from curvcal.load.text import text_model_of
    from curvcal.pipeline.calibration_warnings import analysis_warnings, probabilities_as_logits
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.pipeline.compatibility import (
        check_compatible,
        say_preprocessing,
        single_class_warning,
    )
    from curvcal.pipeline.runtime import distributed_run, predict
    from curvcal.provenance import environment

    fit_data = request.fit_data
    if fit_data is not None:
        _refuse_fit_on_itself(request.data_options.spec, fit_data, "--fit-data", "--data")
    fraction = None
    if settings.method != "none" and fit_data is None:
        fraction = settings.val_split or DEFAULT_VAL_SPLIT
    settings = settings.replace(val_split=fraction)
    timings: dict[str, float] = {}
    warnings: list[str] = []
    began = time.perf_counter()
    with distributed_run(request.checkpoint_options.device) as (device, context):
        if not context.is_main:  # rank 0 speaks for the run
            reporter = Reporter(quiet=True)
        loaded = load_model(
            request.checkpoint,
            dataclasses.replace(request.checkpoint_options, device=str(device)),
        )
        trust = request.checkpoint_options.trust_checkpoint
        data = load_dataset(
            request.data_options.replace(trust_checkpoint=trust),
            loaded.preprocessing,
            text_model_of(loaded),
        )
        n_classes = check_compatible(loaded, data, "--data")
        fit_loaded = None
        if fit_data is not None:
            fit_loaded = load_dataset(
                request.data_options.replace(data=fit_data, trust_checkpoint=trust),
                loaded.preprocessing,
                text_model_of(loaded),
            )
            check_compatible(loaded, fit_loaded, "--fit-data")
        say_preprocessing(data, reporter, warnings)
        if fit_loaded is not None:
            say_preprocessing(fit_loaded, reporter, warnings, "--fit-data")
        if n_classes == 1:
            warnings.append(single_class_warning(str(request.checkpoint)))
            reporter.warn(warnings[-1])
        timings["load"] = time.perf_counter() - began

        began = time.perf_counter()
        with reporter.progress("inference", _shard_size(data, context)) as advance:
            predictions = predict(loaded, data, request.batch_size, advance)
        fit_predictions = None
        if fit_loaded is not None:
            with reporter.progress(
                "inference (fit data)", _shard_size(fit_loaded, context)
            ) as advance:
                fit_predictions = predict(
                    loaded, fit_loaded, request.batch_size, advance, "--fit-data"
                )
        timings["inference"] = time.perf_counter() - began
    if predictions is None:
        return None
    logits, labels = predictions
    if request.save_logits is not None:
        from curvcal.load.logits import save_logits

        save_logits(request.save_logits, logits, labels)

    began = time.perf_counter()
    source = f"--data {data.spec}"
    dropped = {"data": 0, "fit_data": 0}
    shown = len(warnings)
    logits, labels, dropped["data"] = _finite_rows(
        logits, labels, settings.nan_policy, source, warnings
    )
    if fit_predictions is not None:
        fit_logits, fit_labels, dropped["fit_data"] = _finite_rows(
            *fit_predictions, settings.nan_policy, f"--fit-data {fit_data}", warnings
        )
        fit_predictions = (fit_logits, fit_labels)
    if looks_like_probabilities(logits):
        warnings.append(
            probabilities_as_logits(
                f"the outputs of {request.checkpoint}",
                "if the model ends in a softmax, save its outputs with --save-logits and read "
                "them with curvcal metrics --input-kind probs",
            )
        )
    for warning in warnings[shown:]:
        reporter.warn(warning)
    analysis = analyse(
        logits,
        labels,
        "logits",
        settings,
        source,
        fit=fit_predictions,
        fit_source=f"--fit-data {fit_data}",
        fraction=fraction,
    )
    timings["calibration"] = time.perf_counter() - began
    _warn(analysis_warnings(analysis), warnings, reporter)
    inputs: dict[str, Any] = {
        "checkpoint": loaded.describe(),
        "data": {**data.describe(), "dropped_rows": dropped["data"]},
    }
    if fit_loaded is not None:
        inputs["fit_data"] = {**fit_loaded.describe(), "dropped_rows": dropped["fit_data"]}
    fitted_on = fit_loaded if fit_loaded is not None else data
    names = tuple(loaded.labels) if len(loaded.labels) == analysis.n_classes else None
    provenance = CalibratorProvenance(
        n_classes=analysis.n_classes,
        input_kind="logits",
        class_names=names or None,
        fit_data=_fit_record(
            analysis,
            f"--fit-data {fit_data}" if fit_loaded is not None else _split_source(analysis, source),
            [file_info(path) for path in fitted_on.files],
        ),
        model={"path": str(request.checkpoint), "sha256": inputs["checkpoint"]["sha256"]},
    )
    _timed_write(analysis, provenance, write, timings)
    report = Report(
        command="calibrate",
        results=analysis,
        inputs=inputs,
        settings={
            **groups(
                request.checkpoint_options.replace(device=str(device)),
                request.data_options,
                settings,
            ),
            "calibrate": {"fit_data": fit_data, "save_logits": request.save_logits},
        },
        timings=timings,
        environment={**environment(loaded.device), "world_size": context.world_size},
        warnings=warnings,
    )
    return CalibrationRun(analysis, report)


def _shard_size(data: Any, context: Any) -> int:
    from curvcal.distributed import shard_indices

    return len(shard_indices(data.n_samples, context.rank, context.world_size))


def _finite_rows(
    logits: torch.Tensor, labels: torch.Tensor, policy: str, source: str, warnings: list[str]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The model's logits under ``--nan-policy``: rows with a NaN or Inf stop the run (exit 3,
    naming the data and the first such sample) or are left out with a warning."""
    from curvcal.load.logits import drop_rows, nonfinite_rows

    rows = nonfinite_rows(logits)
    count, total = int(rows.numel()), int(logits.shape[0])
    if count == 0:
        return logits, labels, 0
    if policy == "error" or count == total:
        raise NumericalError(
            source,
            f"the model's logits are NaN or Inf for {count} of {total} samples, the first "
            f"being sample {int(rows[0])}",
            "check the weights and inputs"
            + ("; --nan-policy drop leaves such samples out" if count < total else ""),
        )
    warnings.append(dropped_warning(count, total, source))
    kept_logits, kept_labels = drop_rows(logits, labels, rows)
    return kept_logits, kept_labels, count


def run_metrics(
    request: MetricsRequest,
    settings: CalibrationSettings,
    reporter: Reporter,
    write: WriteOutputs | None = None,
) -> CalibrationRun:
    """Read the scores (and the fit file or saved calibrators), then fit and measure the maps,
    or measure the saved calibrators, as ``settings`` ask (``settings.method`` resolved)."""
    from curvcal.calibration.analysis import evaluate_calibrators
    from curvcal.load.digest import file_info
    from curvcal.load.logits import load_logits
    from curvcal.pipeline.calibration_warnings import analysis_warnings
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.provenance import environment
    from curvcal.settings.calibration import CalibrationSettings

    timings: dict[str, float] = {}
    began = time.perf_counter()
    warnings: list[str] = []
    keys = (request.input_kind, request.scores_key, request.labels_key, settings.nan_policy)
    if request.fit_file is not None:
        _refuse_fit_on_itself(request.logits, request.fit_file)
    data = load_logits(request.logits, *keys)
    described: dict[str, Any] = {"logits": _describe(request.logits, data, warnings)}
    _check_kind(request.logits, data, request, warnings)
    fit_data = None
    if request.fit_file is not None:
        fit_data = load_logits(request.fit_file, *keys)
        described["fit"] = _describe(request.fit_file, fit_data, warnings)
        _check_kind(request.fit_file, fit_data, request, warnings)
    for warning in warnings:
        reporter.warn(warning)
    calibrators = None
    if request.apply_file is not None:
        calibrators, described["calibrator"] = _applied_calibrators(
            request, int(data.scores.shape[1]), reporter, warnings
        )
    timings["load"] = time.perf_counter() - began

    began = time.perf_counter()
    source = str(request.logits)
    if calibrators is not None:
        analysis = evaluate_calibrators(
            data.scores, data.labels, request.input_kind, calibrators, settings, source
        )
    else:
        analysis = analyse(
            data.scores,
            data.labels,
            request.input_kind,
            settings,
            source,
            fit=None if fit_data is None else (fit_data.scores, fit_data.labels),
            fit_source=str(request.fit_file),
            fit_split="fit-file",
            fraction=settings.val_split,
        )
    timings["calibration"] = time.perf_counter() - began
    _warn(analysis_warnings(analysis), warnings, reporter)
    fit_path = request.fit_file or request.logits
    provenance = CalibratorProvenance(
        n_classes=analysis.n_classes,
        input_kind=request.input_kind,
        fit_data=_fit_record(
            analysis,
            f"--fit {fit_path}" if request.fit_file else _split_source(analysis, source),
            [file_info(fit_path)],
        ),
    )
    _timed_write(analysis, provenance, write, timings)

    report = Report(
        command="metrics",
        results=analysis,
        inputs=described,
        settings={
            "logits": {
                "input_kind": request.input_kind,
                "scores_key": request.scores_key,
                "labels_key": request.labels_key,
                "fit": request.fit_file,
                "apply": request.apply_file,
                "strict": request.strict,
            },
            CalibrationSettings.GROUP: record(settings),
        },
        timings=timings,
        environment=environment(),
        warnings=warnings,
    )
    return CalibrationRun(analysis, report)


def _applied_calibrators(
    request: MetricsRequest, n_classes: int, reporter: Reporter, warnings: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The calibrators of ``--apply`` and their record for the report's inputs. A file whose
    provenance disagrees with LOGITS (classes, input kind) is refused, naming the file and
    every mismatch, unless ``--apply-anyway`` (then each mismatch is a warning); a file with
    no provenance is a warning."""
    from dataclasses import asdict

    from curvcal.load.digest import file_info
    from curvcal.pipeline.calibrator import load_calibrator_file, provenance_mismatches

    assert request.apply_file is not None
    where = str(request.apply_file)
    read = load_calibrator_file(request.apply_file)
    saved = read.provenance
    record: dict[str, Any] = {
        **asdict(file_info(request.apply_file)),
        "provenance": None if saved is None else saved.to_dict(),
    }
    if saved is None:
        _warn(
            [
                f"{where} has no provenance (a schema 1.0 file): its classes, input kind "
                "and model cannot be checked against LOGITS"
            ],
            warnings,
            reporter,
        )
        return dict(read.calibrators), record
    fit = saved.fit_data or {}
    model = (saved.model or {}).get("sha256")
    reporter.info(
        f"note: {where}: fitted on {saved.n_classes} classes of {saved.input_kind} from "
        f"{fit.get('source', 'unrecorded data')} (sha256 {fit.get('sha256')}, "
        f"{fit.get('size_bytes')} bytes, {fit.get('n_samples')} samples); "
        + (f"model sha256 {model}" if model else "no model recorded (scores from a file)")
    )
    mismatches = provenance_mismatches(saved, n_classes, request.input_kind)
    if mismatches and not request.apply_anyway:
        raise InputError(
            where,
            f"does not match {request.logits}: {'; '.join(mismatches)}",
            "apply it to scores like those it was fitted on, or pass --apply-anyway",
        )
    _warn(
        [f"{where} applied despite: {mismatch} (--apply-anyway)" for mismatch in mismatches],
        warnings,
        reporter,
    )
    return dict(read.calibrators), record


def _warn(messages: list[str], warnings: list[str], reporter: Reporter) -> None:
    """Add ``messages`` to the report's warnings and say them on stderr."""
    for message in messages:
        warnings.append(message)
        reporter.warn(message)


def _check_kind(path: Path, data: LogitsData, request: MetricsRequest, warnings: list[str]) -> None:
    """Scores read as logits that look like probabilities: a warning, or under ``--strict``
    an :class:`~curvcal.errors.InputError` naming the file."""
    from curvcal.calibration.inputs import looks_like_probabilities
    from curvcal.errors import InputError
    from curvcal.pipeline.calibration_warnings import PROBS_REMEDY, probabilities_as_logits

    if request.input_kind != "logits" or not looks_like_probabilities(data.scores):
        return
    if request.strict:
        raise InputError(
            str(path),
            "every score is non-negative and every row sums to 1, so these look like "
            "probabilities, but --input-kind is logits (refused under --strict)",
            PROBS_REMEDY,
        )
    warnings.append(probabilities_as_logits(str(path)))


def _refuse_fit_on_itself(
    evaluated: str | Path,
    fitted: str | Path,
    fit_option: str = "--fit",
    evaluated_name: str = "the evaluation file",
) -> None:
    """Refuse a fit split that is the evaluation data itself (the same spec or file, or a file
    with the same bytes): maps fitted and measured on the same rows look better than they are,
    and the report would present an in-sample number as a held-out one."""
    from curvcal.load.digest import file_info

    first, second = Path(evaluated), Path(fitted)
    same = str(evaluated) == str(fitted)
    if not same and first.is_file() and second.is_file():
        same = first.resolve() == second.resolve()
        same = same or file_info(first).sha256 == file_info(second).sha256
    if same:
        raise InputError(
            f"{fit_option} {fitted}",
            f"is {evaluated_name} {evaluated} itself (same contents): fitting and measuring "
            "on the same rows flatters every map",
            f"give held-out data to {fit_option}, or --val-split F to carve it out",
        )


def _describe(path: Path, data: LogitsData, warnings: list[str]) -> dict[str, Any]:
    """The file's provenance and shape; rows left out by --nan-policy drop add a warning."""
    from curvcal.load.digest import file_info
    from curvcal.pipeline.compatibility import single_class_warning

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
