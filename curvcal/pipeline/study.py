"""``curvcal study``: several checkpoints measured the same way, and the rank correlations
between their curvature and their calibration.

In one run session (:mod:`curvcal.pipeline.session`) the data is loaded once and every
checkpoint is checked against it before any is measured; then, one checkpoint at a time, the
Hessian's λmax and trace on the curvature data (the session's Hessian, as ``curvcal hessian``
measures them) and calibration on a stratified split of the data, the same split for every
checkpoint. The arithmetic (summaries, Spearman correlations) is :mod:`curvcal.study`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.calibration.registry import MAPS, fitted_stages
from curvcal.errors import CurvcalError, InputError
from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT
from curvcal.pipeline.calibration_warnings import analysis_warnings, missing_classes
from curvcal.results import Report
from curvcal.settings.fields import groups

if TYPE_CHECKING:
    from curvcal.console import Reporter
    from curvcal.curvature.operator import HessianOperator
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.pipeline.session import Session
    from curvcal.settings.calibration import CalibrationSettings
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.settings.hessian import HessianSettings
    from curvcal.settings.study import StudySettings
    from curvcal.study.summary import CurvatureSummary, StudyResult

#: Metadata key of the trace-penalty weight λ a checkpoint was trained with (CE + λ·tr(H)).
PENALTY_METADATA_KEY = "curvcal.trace_penalty"


@dataclass(frozen=True)
class StudyRequest:
    """What ``curvcal study`` was asked: the checkpoint files (globs expanded), the data and
    the settings every checkpoint is measured with: the Hessian's (``hessian``; its ``seed``
    also draws the ``--val-split``), the study's own (``study``: the curvature data, the plot
    folder) and the calibration's (``calibration``: ``val_split``, ``gammas``, ``bins`` and the
    Laplace map's ``laplace_*``)."""

    checkpoints: tuple[Path, ...]
    checkpoint_options: CheckpointSettings
    data_options: DataSettings
    hessian: HessianSettings
    study: StudySettings
    calibration: CalibrationSettings


@dataclass(frozen=True)
class StudyRun:
    """The study's rows and correlations, its report, and whether this process speaks for
    the run (rank 0; the only one that writes)."""

    result: StudyResult
    report: Report
    is_main: bool = True


def run_study(request: StudyRequest, reporter: Reporter) -> StudyRun:
    """Measure every checkpoint of ``request`` (a progress count on ``reporter``) in one run
    session: each checkpoint is loaded once where the models fit in memory together (else
    loaded again to be measured, said in a note), checked against the data before any pass."""
    from curvcal.calibration.analysis import analyse_val_split
    from curvcal.load.datasets.labels import stratified_split
    from curvcal.load.models.adapters import is_adapter_folder
    from curvcal.load.texts.text import text_model_at, text_model_of
    from curvcal.pipeline.provenance import environment
    from curvcal.pipeline.session import open_session
    from curvcal.study.summary import (
        StudyResult,
        StudyRow,
        calibration_summary,
        duplicate_checkpoints,
        duplicate_warning,
        rank_correlations,
        row_stages,
    )

    began = time.perf_counter()
    hessian, curvature_data = request.hessian, request.study.curvature_data
    seed = hessian.seed
    val_split = request.calibration.val_split or DEFAULT_VAL_SPLIT
    maps = request.study.maps
    calibration = request.calibration.replace(method=maps, seed=seed, val_split=val_split)
    wants_features = any(MAPS[stage].input == "features" for stage in fitted_stages(maps))
    data_options, batch_size = request.data_options, request.data_options.batch_size
    paths = list(request.checkpoints)
    rows: list[StudyRow] = []
    inputs: list[dict[str, Any]] = []
    said: set[str] = set()  # parameter choices already noted on stderr
    fit_warnings: list[str] = []
    with open_session(
        request.checkpoint_options,
        reporter,
        (request.data_options, request.hessian, request.study, request.calibration),
    ) as session:
        calibration = calibration.replace(device=str(session.device))  # maps run by the models
        # text data is tokenized once, with the first checkpoint's tokenizer (or --tokenizer);
        # an adapter's is its base's (a causal LM's makes multiple-choice rows)
        text_model = text_model_at(paths[0], request.checkpoint_options.arch)
        if text_model is None and is_adapter_folder(paths[0]):
            text_model = text_model_of(session.model(paths[0]))
        data = session.dataset(None, data_options, text_model=text_model, check=False)
        hessian_data = data
        if curvature_data is not None:
            hessian_data = session.dataset(
                None,
                data_options.replace(data=curvature_data),
                "--curvature-data",
                text_model=text_model,
                check=False,
            )
        fit_idx, eval_idx = stratified_split(data.labels, val_split, seed, data.spec)
        check_every_checkpoint(session, paths, data, hessian_data, curvature_data, maps)
        with session.reporter.progress("checkpoints", len(paths)) as advance:
            for path in paths:
                with naming_the_checkpoint(path):
                    loaded = session.model(path)
                    trained_loss, trained_gamma, penalty = training_loss(loaded)
                    curvature = measure_curvature(
                        session, loaded, hessian_data, hessian, batch_size, said
                    )
                    predictions, features = predict_for_maps(
                        session, loaded, data, batch_size, wants_features, maps
                    )
                    session.release(path)
                    if predictions is not None:  # rank 0 gets every row
                        logits, labels, _dropped = predictions
                        analysis = analyse_val_split(
                            logits,
                            labels,
                            fit_idx,
                            eval_idx,
                            "logits",
                            calibration,
                            val_split,
                            f"{path} on --data {data.spec}",
                            features,
                        )
                        # what calibrate says of the same data and fits, per checkpoint; said
                        # with the study's own warnings once every checkpoint is measured
                        missing = missing_classes(
                            labels, int(logits.shape[1]), f"{path} on --data {data.spec}"
                        )
                        fit_warnings += [missing] if missing else []
                        fit_warnings += [f"{path}: {w}" for w in analysis_warnings(analysis)]
                        rows.append(
                            StudyRow(
                                checkpoint=path.name,
                                training_loss=trained_loss,
                                training_gamma=trained_gamma,
                                penalty=penalty,
                                curvature=curvature,
                                calibration=calibration_summary(analysis, maps),
                            )
                        )
                    inputs.append(loaded.describe())
                advance(1)

    n_fit, n_eval = len(fit_idx), len(eval_idx)
    columns = column_provenance(
        hessian.loss,
        hessian.gamma,
        hessian_data,
        data,
        n_fit,
        n_eval,
        calibration.bins,
        maps,
        row_stages(rows),
    )
    result = StudyResult(tuple(rows), rank_correlations(rows), columns)
    messages = (
        session.warnings
        + fit_warnings
        + [
            duplicate_warning(group)
            for group in duplicate_checkpoints(
                [str(p) for p in paths], [i["sha256"] for i in inputs]
            )
        ]
    )
    for message in messages[len(session.warnings) :]:
        session.reporter.warn(message)
    report = Report(
        command="study",
        results=result,
        inputs={
            "checkpoints": inputs,
            "data": data.describe(),
            "curvature_data": hessian_data.describe(),
        },
        settings=groups(
            request.checkpoint_options.replace(device=str(session.device)),
            data_options,
            hessian,
            request.study,
            calibration,
        ),
        timings={"total": time.perf_counter() - began},
        environment=environment(session.device),
        warnings=messages,
    )
    return StudyRun(result, report, session.is_main)


def measure_curvature(
    session: Session,
    loaded: LoadedModel,
    data: LoadedData,
    settings: HessianSettings,
    batch_size: int,
    said: set[str],
) -> CurvatureSummary:
    """λmax and tr(H) of one checkpoint, by the session's Hessian (the analysis behind
    ``curvcal hessian``) with the study's ``settings``: ``--loss own`` resolved to the
    checkpoint's recorded loss, every trainable parameter (the token embeddings of a text model
    left out, said once per choice; ``said`` holds the choices already said), and FLSD-53's γ
    groups counted on the same operator."""
    from curvcal.curvature.flsd53 import flsd53_group_sizes
    from curvcal.study.summary import curvature_summary

    resolved = session.hessian_settings(loaded, settings)
    if resolved.choice in said:
        resolved = replace(resolved, choice=None)
    elif resolved.choice is not None:
        said.add(resolved.choice)
    groups: list[tuple[float, int]] = []

    def count_groups(operator: HessianOperator) -> None:
        if resolved.settings.loss == "flsd53":
            groups.extend(flsd53_group_sizes(operator))

    curvature = session.hessian(loaded, data, resolved, batch_size, on_operator=count_groups)
    return curvature_summary(curvature.analysis, tuple(groups))


def check_every_checkpoint(
    session: Session,
    paths: list[Path],
    data: LoadedData,
    hessian_data: LoadedData,
    curvature_data: str | None,
    maps: str = "both",
) -> None:
    """Every checkpoint loads and fits --data (and --curvature-data) before any is measured,
    so a misfit late in the list stops the run in seconds, not after the others' passes; a map
    named by ``--maps`` (not ``all``) that does not apply to a checkpoint's K classes (Platt
    and beta: K = 2 only) is refused then too. The
    models stay loaded for their measurement while they fit in half the free memory together;
    one that does not is dropped after its check and loaded again when its turn comes (said
    in a note)."""
    from curvcal.curvature.memory import FREE_FRACTION, free_memory
    from curvcal.pipeline.compatibility import check_compatible

    free = free_memory(session.device)
    held = 0
    reloads = 0
    for path in paths:
        with naming_the_checkpoint(path):
            loaded = session.model(path)
            n_classes = check_compatible(loaded, data, "--data")
            check_maps_apply(maps, n_classes, path)
            if curvature_data is not None:
                check_compatible(loaded, hessian_data, "--curvature-data")
            size = sum(t.numel() * t.element_size() for t in loaded.module.state_dict().values())
            if free is not None and held + size > FREE_FRACTION * free:
                session.release(path)
                reloads += 1
            else:
                held += size
    if reloads and session.is_main:
        session.reporter.info(
            f"curvcal: note: {reloads} of the {len(paths)} checkpoints do not fit in memory "
            "together: each is loaded again when it is measured"
        )


def check_maps_apply(maps: str, n_classes: int, path: Path) -> None:
    """Refuse ``--maps`` naming a map that does not apply to ``n_classes`` logits (``all``
    skips such maps instead, saying why)."""
    from curvcal.calibration.registry import ALL, applicable_stages

    if maps == ALL:
        return
    _kept, skipped = applicable_stages(fitted_stages(maps), n_classes, True)
    if skipped:
        raise InputError(
            f"--maps {maps}",
            f"does not apply to {path}: {next(iter(skipped.values()))}",
            "choose a map for these scores, or --maps all to fit every map that applies",
        )


def predict_for_maps(
    session: Session,
    loaded: LoadedModel,
    data: LoadedData,
    batch_size: int,
    features: bool,
    maps: str,
) -> tuple[Any, Any]:
    """The checkpoint's predictions of ``data`` and, when a map reads the model's features
    (Laplace), the inputs of its last layer for the same rows (as ``calibrate`` gets them).
    With ``--maps all``, a model whose head gives no features is said in a warning and its
    Laplace map skipped; with ``--maps laplace`` it stops the run (exit 2)."""
    from curvcal.calibration.registry import ALL
    from curvcal.pipeline.calibration import predict_with_features

    if not features:
        return session.predict(loaded, data, batch_size), None
    try:
        return predict_with_features(session, loaded, data, batch_size, "--data", "error", True)
    except InputError as error:
        if maps != ALL:
            raise
        message = f"--maps all: the Laplace map is skipped for {loaded.path}: {error}"
        session.warnings.append(message)
        session.reporter.warn(message)
        return session.predict(loaded, data, batch_size), None


@contextmanager
def naming_the_checkpoint(path: Path) -> Iterator[None]:
    """Errors raised while measuring one of several checkpoints name it (unless they do)."""
    try:
        yield
    except CurvcalError as error:
        if str(path) in error.message:
            raise
        raise type(error)(str(path), f"{error.what}: {error.why}", error.hint) from None


def training_loss(loaded: LoadedModel) -> tuple[str | None, float | None, float | None]:
    """``(loss, γ, λ)`` from the metadata: ``ce``/``focal``/``flsd53`` (``None`` when not
    recorded), the focal γ (``None`` for FLSD-53 and unknown losses, 0 for ce) and the trace
    penalty λ of a CE + λ·tr(H) training (``None`` without one)."""
    from curvcal.load.checkpoints.metadata import GAMMA_METADATA_KEY, LOSS_METADATA_KEY

    meta = loaded.metadata
    raw = (meta.get(LOSS_METADATA_KEY) or "").strip().lower()
    penalty = _number(meta.get(PENALTY_METADATA_KEY))
    if raw == "flsd53":
        return "flsd53", None, penalty
    if raw in ("ce", "cross_entropy", "cross-entropy"):
        return "ce", 0.0, penalty
    if raw == "focal":
        return "focal", _number(meta.get(GAMMA_METADATA_KEY)), penalty
    return None, None, penalty


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def column_provenance(
    loss: str,
    gamma: float | None,
    hessian_data: LoadedData,
    data: LoadedData,
    n_fit: int,
    n_eval: int,
    bins: int,
    maps: str = "both",
    stages: tuple[str, ...] = ("ts", "focal_ts"),
) -> dict[str, str]:
    """Which loss and which samples every column of the table comes from (``bins``: the
    equal-width bins of the ECE columns; ``maps``: the ``--maps`` selection, ``stages``: the
    maps it fitted)."""
    from curvcal.study.summary import DEFAULT_MAPS, calibration_measures, hessian_loss_label

    hessian = (
        "each checkpoint's own training loss (column 'H loss')"
        if loss == "own"
        else hessian_loss_label(loss, gamma)
    )
    curvature = (
        f"Hessian of the mean {hessian} over all {hessian_data.n_samples} samples of "
        f"{hessian_data.spec} (eval mode)"
    )
    evaluation = f"evaluation split ({n_eval} of {data.n_samples} samples of {data.spec})"
    fit = f"fitted on the other {n_fit} samples (stratified)"
    columns = {
        "λmax": f"largest eigenvalue of the {curvature}",
        "tr(H)": f"trace of the {curvature}: exact by Gauss–Newton where the logits are linear "
        "in each tensor, else its Gauss–Newton part exact and Hutch++ on the rest",
        "accuracy": evaluation,
        "ECE": f"{bins}-bin top-label ECE (bins (a,b]) on the {evaluation}, uncalibrated",
        "AdaECE": f"equal-mass ECE on the {evaluation}, uncalibrated",
        "NLL": f"mean −log p_y on the {evaluation}, uncalibrated",
    }
    if "ts" in stages:
        columns["T"] = f"temperature scaling (NLL objective) {fit}"
    if "focal_ts" in stages:
        columns["FTS γ, T"] = f"focal temperature scaling (ECE objective) {fit}"
    if maps == DEFAULT_MAPS:
        columns["ECE after TS"] = f"ECE on the {evaluation} after TS"
        columns["ECE after FTS"] = f"ECE on the {evaluation} after focal TS"
        return columns
    names = calibration_measures(stages)
    titles = [names[key].removeprefix("ECE after ") for key in names if key.startswith("ece_")]
    columns["ECE, NLL after each map"] = (
        f"ECE and mean −log p_y on the {evaluation} after each map ({', '.join(titles)}), {fit}"
    )
    if maps == "all":
        columns["best by NLL"] = (
            f"the stage of lowest NLL on the {evaluation} (calibrate --method all's ranking)"
        )
    return columns
