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

from curvcal.errors import InputError
from curvcal.results import Report
from curvcal.settings.calibrate import CalibrateSettings
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import groups, record
from curvcal.settings.scores import ScoresSettings

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.console import Reporter
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.load.scores.logits import LogitsData
    from curvcal.pipeline.calibrator import CalibratorFile, CalibratorProvenance
    from curvcal.pipeline.session import Session
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

DEFAULT_VAL_SPLIT = 0.5

#: Called with the analysis and the provenance of its fit to write the files the options ask
#: for (calibrator, plot).
WriteOutputs = Callable[["CalibrationAnalysis", "CalibratorProvenance"], None]


@dataclass(frozen=True)
class CalibrateRequest:
    """What ``curvcal calibrate`` reads and writes beyond its calibration settings: the
    checkpoint and data, and ``files``: the data to fit on and the file the logits are saved to."""

    checkpoint: Path
    checkpoint_options: CheckpointSettings
    data_options: DataSettings
    files: CalibrateSettings


@dataclass(frozen=True)
class MetricsRequest:
    """What ``curvcal metrics`` reads beyond its calibration settings: the logits file and how
    to read it (``scores``: its kind and keys, the file to fit on or the saved calibrators to
    apply)."""

    logits: Path
    scores: ScoresSettings


@dataclass(frozen=True)
class CalibrationRun:
    """A finished calibration run: the analysis and its report."""

    analysis: CalibrationAnalysis
    report: Report


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
    features: Any = None,
    fit_features: Any = None,
) -> CalibrationAnalysis:
    """The calibration analysis of ``scores``: maps fitted on ``fit`` (a separate split named
    ``fit_split``), else on a stratified ``fraction`` of the rows (seeded by the settings), else
    nothing fitted; every stage measured on the evaluation rows only. ``features`` and
    ``fit_features``: the model's last-layer inputs of the same rows (Laplace), or ``None``."""
    from curvcal.calibration.analysis import analyse_calibration, analyse_val_split
    from curvcal.load.datasets.labels import stratified_split

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
            features=None if features is None else (fit_features, features),
        )
    if fraction is not None:
        fit_idx, eval_idx = stratified_split(labels, fraction, settings.seed, source)
        return analyse_val_split(
            scores, labels, fit_idx, eval_idx, kind, settings, fraction, source, features
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
    """Predict every sample of the data (and fit data) in one run session, then fit and
    measure the maps as ``settings`` ask (``settings.method`` resolved: ``none`` fits nothing).

    Under torchrun every rank predicts its shard and leaves; rank 0 gets the logits of all
    samples (rows with a NaN or Inf handled by ``--nan-policy``), runs the analysis and returns
    the run (the other ranks return ``None``).
    """
    from curvcal.calibration.inputs import looks_like_probabilities
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibration_warnings import (
        analysis_warnings,
        missing_classes,
        probabilities_as_logits,
    )
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.pipeline.compatibility import single_class_warning
    from curvcal.pipeline.provenance import environment
    from curvcal.pipeline.session import open_session

    fit_data = request.files.fit_data
    if fit_data is not None:
        _refuse_fit_on_itself(request.data_options.spec, fit_data, "--fit-data", "--data")
    fraction = None
    if settings.method != "none" and fit_data is None:
        fraction = settings.val_split or DEFAULT_VAL_SPLIT
    settings = settings.replace(val_split=fraction)
    data_options, batch_size = request.data_options, request.data_options.batch_size
    with open_session(
        request.checkpoint_options, reporter, (request.data_options, request.files, settings)
    ) as session:
        # the maps run where the model does (calibrate's one --device)
        settings = settings.replace(device=str(session.device))
        loaded = session.model(request.checkpoint)
        applied = None
        if request.files.apply is not None:
            applied = _calibrators_for(request.files.apply, loaded)
        data = session.dataset(loaded, data_options)
        fit_loaded = None
        if fit_data is not None:
            fit_loaded = session.dataset(loaded, data_options.replace(data=fit_data), "--fit-data")
        said = len(session.warnings)  # the preprocessing warnings, already said
        wants_features = settings.method in ("laplace", "all") or (
            applied is not None and "laplace" in applied.calibrators
        )
        optional = settings.method == "all"
        predictions, features, fit_predictions, fit_features = predict_with_fit(
            session,
            loaded,
            (data, fit_loaded),
            batch_size,
            ("--data", "--fit-data"),
            settings.nan_policy,
            wants_features,
            optional,
        )
    if predictions is None:
        return None
    logits, labels, dropped = predictions
    warnings, timings = session.warnings, session.timings
    if logits.shape[1] == 1:
        warnings.insert(said, single_class_warning(str(request.checkpoint)))
    if request.files.save_logits is not None:
        from curvcal.load.scores.logits import save_logits

        save_logits(request.files.save_logits, logits, labels)

    began = time.perf_counter()
    source = f"--data {data.spec}"
    fit = None if fit_predictions is None else fit_predictions[:2]
    if looks_like_probabilities(logits):
        warnings.append(
            probabilities_as_logits(
                f"the outputs of {request.checkpoint}",
                "if the model ends in a softmax, save its outputs with --save-logits and read "
                "them with curvcal metrics --input-kind probs",
            )
        )
    splits = [(source, labels)]
    if fit_predictions is not None:
        splits.append((f"--fit-data {fit_data}", fit_predictions[1]))
    for where, rows in splits:
        missing = missing_classes(rows, int(logits.shape[1]), where)
        if missing:
            warnings.append(missing)
    for warning in warnings[said:]:
        session.reporter.warn(warning)
    session.reporter.stage(
        "evaluating the saved calibrators"
        if applied is not None
        else f"fitting and evaluating the calibration maps (--method {settings.method})"
    )
    if applied is not None:
        from curvcal.calibration.analysis import evaluate_calibrators

        _check_applied(applied, request, loaded, int(logits.shape[1]))
        _warn_in_sample(applied, request, data.files, warnings, session.reporter)
        analysis = evaluate_calibrators(
            logits,
            labels,
            "logits",
            applied.calibrators,
            settings,
            source,
            features,
            calibrators_source=str(request.files.apply),
        )
    else:
        analysis = analyse(
            logits,
            labels,
            "logits",
            settings,
            source,
            fit=fit,
            fit_source=f"--fit-data {fit_data}",
            fraction=fraction,
            features=features,
            fit_features=fit_features,
        )
    timings["calibration"] = time.perf_counter() - began
    map_devices = where_maps_ran(analysis, session.reporter)
    _warn(analysis_warnings(analysis, data.subset), warnings, session.reporter)
    inputs: dict[str, Any] = {
        "checkpoint": loaded.describe(),
        "data": {**data.describe(), "dropped_rows": dropped},
    }
    if fit_loaded is not None and fit_predictions is not None:
        inputs["fit_data"] = {**fit_loaded.describe(), "dropped_rows": fit_predictions[2]}
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
        settings=groups(
            request.checkpoint_options.replace(device=str(session.device)),
            data_options,
            settings,
            request.files,
        ),
        timings=timings,
        environment={
            **environment(loaded.device),
            "world_size": session.context.world_size,
            "map_devices": map_devices,
        },
        warnings=warnings,
    )
    return CalibrationRun(analysis, report)


def _calibrators_for(path: Path, loaded: LoadedModel) -> CalibratorFile:
    """The calibrators of ``calibrate --apply FILE``, refused before any inference when a
    Laplace calibrator in it was not fitted on this checkpoint: it is a posterior over this
    model's last layer and acts on that layer's inputs, so the SHA-256 of the checkpoint it
    records must be this one's."""
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibrator import load_calibrator_file

    read = load_calibrator_file(path)
    if "laplace" not in read.calibrators:
        return _belonging(read, loaded, path)
    saved = (read.provenance.model or {}) if read.provenance is not None else {}
    digest = file_info(loaded.path).sha256
    if saved.get("sha256") != digest:
        recorded = saved.get("sha256")
        raise InputError(
            str(path),
            "holds a Laplace calibrator fitted on "
            + (f"checkpoint sha256 {recorded[:12]}..." if recorded else "an unrecorded model")
            + f", not on {loaded.path} (sha256 {digest[:12]}...)",
            "a Laplace calibrator applies only to the checkpoint it was fitted on",
        )
    return _belonging(read, loaded, path)


def _belonging(read: CalibratorFile, loaded: LoadedModel, path: Path) -> CalibratorFile:
    """``read`` once every map in it has checked itself against the model (a map of scores
    belongs to any model; a Laplace posterior must be over this model's head)."""
    for calibrator in read.calibrators.values():
        calibrator.check_model(loaded.module, str(path))
    return read


def _warn_in_sample(
    applied: CalibratorFile,
    request: CalibrateRequest,
    files: tuple[Path, ...],
    warnings: list[str],
    reporter: Reporter,
) -> None:
    """A warning when ``calibrate --apply``'s calibrators were fitted on the data they are
    measured on (the first of its ``files`` is their fit data's): the fitted rows are then
    counted as evaluation rows. A warning, not a refusal: calibrate has no --apply-anyway."""
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibrator import fitted_on_these

    if applied.provenance is None or not files:
        return
    why = fitted_on_these(applied.provenance, file_info(files[0]).sha256)
    if why is not None:
        _warn([f"{request.files.apply} is {why}"], warnings, reporter)


def _check_applied(
    applied: CalibratorFile, request: CalibrateRequest, loaded: LoadedModel, n_classes: int
) -> None:
    """The classes, input kind and model recorded with ``calibrate --apply``'s calibrators
    must match the checkpoint's logits (every mismatch named in one line)."""
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibrator import provenance_mismatches

    saved = applied.provenance
    if saved is None:
        return
    names = tuple(loaded.labels) if len(loaded.labels) == n_classes else None
    mismatches = provenance_mismatches(
        saved, n_classes, "logits", names, file_info(loaded.path).sha256
    )
    if mismatches:
        raise InputError(
            str(request.files.apply),
            f"does not match {request.checkpoint}: {'; '.join(mismatches)}",
            "apply it to the model and classes it was fitted on",
        )


def predict_with_features(
    session: Session,
    loaded: LoadedModel,
    data: LoadedData,
    batch_size: int,
    option: str,
    nan_policy: str,
    features: bool,
    optional: bool = False,
) -> tuple[Any, Any]:
    """The session's predictions of ``data`` and, when ``features`` is asked (Laplace), the
    inputs of the model's last layer for the same rows (``None`` otherwise, and on ranks but 0).
    ``optional`` (``--method all``): a model whose head gives no features is said in a warning
    and yields ``None`` (the Laplace map is then skipped) instead of stopping the run."""
    if not features:
        return session.predict(loaded, data, batch_size, option=option, nan_policy=nan_policy), None
    from curvcal.pipeline.laplace import capture_head, head_features

    try:
        with capture_head(loaded) as capture:
            predictions = session.predict(
                loaded, data, batch_size, option=option, nan_policy=nan_policy
            )
        shard = session.shard(data, option)
        local_rows = data.n_samples if shard is None else len(shard)
        logits = None if predictions is None else predictions[0]
        return predictions, head_features(capture, data, local_rows, logits)
    except InputError as error:
        if not optional:
            raise
        session.warnings.append(f"--method all: the Laplace map is skipped: {error}")
        return session.predict(loaded, data, batch_size, option=option, nan_policy=nan_policy), None


def predict_with_fit(
    session: Session,
    loaded: LoadedModel,
    datasets: tuple[LoadedData, LoadedData | None],
    batch_size: int,
    options: tuple[str, str],
    nan_policy: str,
    features: bool,
    optional: bool,
    predict: Callable[..., tuple[Any, Any]] = predict_with_features,
) -> tuple[Any, Any, Any, Any]:
    """``predict`` (:func:`predict_with_features` or a wrapper of it) of the data and, when
    there is one, of the fit data (``datasets``, named by ``options``): ``(predictions,
    features, fit predictions, fit features)``. The fit data's features are asked for only
    when the data's came or had to (not ``optional``), and the data's are dropped when the fit
    data's did not come: a map fitted from features sees them on both or on neither."""
    data, fit = datasets
    predictions, data_features = predict(
        session, loaded, data, batch_size, options[0], nan_policy, features, optional
    )
    if fit is None:
        return predictions, data_features, None, None
    fit_predictions, fit_features = predict(
        session,
        loaded,
        fit,
        batch_size,
        options[1],
        nan_policy,
        features and (data_features is not None or not optional),
        optional,
    )
    if fit_features is None:
        data_features = None
    return predictions, data_features, fit_predictions, fit_features


def run_metrics(
    request: MetricsRequest,
    settings: CalibrationSettings,
    reporter: Reporter,
    write: WriteOutputs | None = None,
) -> CalibrationRun:
    """Read the scores (and the fit file or saved calibrators), then fit and measure the maps,
    or measure the saved calibrators, as ``settings`` ask (``settings.method`` resolved)."""
    from curvcal.calibration.analysis import evaluate_calibrators
    from curvcal.load.checkpoints.device import resolve_device
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.load.scores.logits import load_logits
    from curvcal.pipeline.calibration_warnings import analysis_warnings
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.pipeline.provenance import environment
    from curvcal.settings.calibration import CalibrationSettings

    # a device that is no device, or is absent, is refused before any file is read
    device = resolve_device(settings.device)
    settings = settings.replace(device=str(device))
    timings: dict[str, float] = {}
    began = time.perf_counter()
    warnings: list[str] = []
    keys = (
        request.scores.input_kind,
        request.scores.scores_key,
        request.scores.labels_key,
        settings.nan_policy,
    )
    if request.scores.fit is not None:
        _refuse_fit_on_itself(request.logits, request.scores.fit)
    data = load_logits(request.logits, *keys)
    described: dict[str, Any] = {"logits": _describe(request.logits, data, warnings)}
    _check_kind(request.logits, data, request, warnings)
    fit_data = None
    if request.scores.fit is not None:
        fit_data = load_logits(request.scores.fit, *keys)
        fit_warnings: list[str] = []
        described["fit"] = _describe(request.scores.fit, fit_data, fit_warnings)
        _check_kind(request.scores.fit, fit_data, request, fit_warnings)
        if fit_data.scores.shape[1] == data.scores.shape[1]:
            # a fit file of another class count is refused by the analysis in one line;
            # warnings about its rows would only come before that line
            warnings.extend(fit_warnings)
    for warning in warnings:
        reporter.warn(warning)
    calibrators = None
    if request.scores.apply is not None:
        calibrators, described["calibrator"] = _applied_calibrators(
            request, int(data.scores.shape[1]), reporter, warnings, described["logits"]["sha256"]
        )
    timings["load"] = time.perf_counter() - began

    began = time.perf_counter()
    source = str(request.logits)
    if calibrators is not None:
        analysis = evaluate_calibrators(
            data.scores,
            data.labels,
            request.scores.input_kind,
            calibrators,
            settings,
            source,
            calibrators_source=str(request.scores.apply),
        )
    else:
        analysis = analyse(
            data.scores,
            data.labels,
            request.scores.input_kind,
            settings,
            source,
            fit=None if fit_data is None else (fit_data.scores, fit_data.labels),
            fit_source=str(request.scores.fit),
            fit_split="fit-file",
            fraction=settings.val_split,
        )
    timings["calibration"] = time.perf_counter() - began
    map_devices = where_maps_ran(analysis, reporter)
    _warn(analysis_warnings(analysis), warnings, reporter)
    fit_path = request.scores.fit or request.logits
    provenance = CalibratorProvenance(
        n_classes=analysis.n_classes,
        input_kind=request.scores.input_kind,
        fit_data=_fit_record(
            analysis,
            f"--fit {fit_path}" if request.scores.fit else _split_source(analysis, source),
            [file_info(fit_path)],
        ),
    )
    _timed_write(analysis, provenance, write, timings)

    report = Report(
        command="metrics",
        results=analysis,
        inputs=described,
        settings={
            ScoresSettings.GROUP: record(request.scores),
            CalibrationSettings.GROUP: record(settings),
        },
        timings=timings,
        environment={**environment(device), "map_devices": map_devices},
        warnings=warnings,
    )
    return CalibrationRun(analysis, report)


def where_maps_ran(analysis: CalibrationAnalysis, reporter: Reporter) -> dict[str, str]:
    """``{stage: device}`` of every map the analysis fitted or applied, and of the metrics
    (:func:`curvcal.calibration.device.placement`), for the report's environment; on a device,
    the maps that ran on the CPU all the same are said once, with why."""
    from curvcal.calibration.device import cpu_note, placement

    stages = [stage for stage, _fit in analysis.fits.present()] + list(analysis.applied)
    note = cpu_note(stages, analysis.settings.device)
    if note is not None:
        reporter.info(f"note: {note}")
    return placement(stages, analysis.settings.device)


def _applied_calibrators(
    request: MetricsRequest,
    n_classes: int,
    reporter: Reporter,
    warnings: list[str],
    scores_sha256: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The calibrators of ``--apply`` and their record for the report's inputs. A file whose
    provenance disagrees with LOGITS (classes, input kind, or fit data whose SHA-256 is
    ``scores_sha256``, that of LOGITS: in-sample rows) is refused, naming the file and every
    mismatch, unless ``--apply-anyway`` (then each mismatch is a warning); a file with
    no provenance is a warning."""
    from dataclasses import asdict

    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibrator import load_calibrator_file, provenance_mismatches

    assert request.scores.apply is not None
    where = str(request.scores.apply)
    read = load_calibrator_file(request.scores.apply)
    if "laplace" in read.calibrators:
        raise InputError(
            where,
            "holds a Laplace calibrator, which acts on the inputs of its model's last layer, "
            "not on logits",
            "apply it with curvcal calibrate CHECKPOINT --data SPEC --apply FILE, with the "
            "checkpoint it was fitted on",
        )
    saved = read.provenance
    record: dict[str, Any] = {
        **asdict(file_info(request.scores.apply)),
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
    mismatches = provenance_mismatches(
        saved, n_classes, request.scores.input_kind, scores_sha256=scores_sha256
    )
    if mismatches and not request.scores.apply_anyway:
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

    if request.scores.input_kind != "logits" or not looks_like_probabilities(data.scores):
        return
    if request.scores.strict:
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
    from curvcal.load.checkpoints.digest import file_info

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
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.calibration_warnings import missing_classes
    from curvcal.pipeline.compatibility import single_class_warning
    from curvcal.pipeline.session import dropped_warning

    info = file_info(path)
    n_samples, n_classes = data.scores.shape
    if n_classes == 1:
        warnings.append(single_class_warning(str(path)))
    missing = missing_classes(data.labels, int(n_classes), str(path))
    if missing:
        warnings.append(missing)
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
