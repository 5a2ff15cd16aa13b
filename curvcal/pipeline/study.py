"""``curvcal study``: several checkpoints measured the same way, and the rank correlations
between their curvature and their calibration.

The data is loaded once and every checkpoint is checked against it before any is measured;
then, one checkpoint at a time, the Hessian's λmax and trace on the curvature data
(:func:`curvcal.study.measure_curvature`) and calibration on a stratified split of the data,
the same split for every checkpoint. The arithmetic (summaries, Spearman correlations) is
:mod:`curvcal.study`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import CurvcalError
from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT
from curvcal.results import Report

if TYPE_CHECKING:
    from curvcal.console import Reporter
    from curvcal.load.loaded_data import LoadedData
    from curvcal.load.loaded_model import LoadedModel
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.study import StudyResult

#: Metadata key of the trace-penalty weight λ a checkpoint was trained with (CE + λ·tr(H)).
PENALTY_METADATA_KEY = "curvcal.trace_penalty"


@dataclass(frozen=True)
class StudyRequest:
    """What ``curvcal study`` was asked: the checkpoint files (globs expanded), the data and
    options every checkpoint is measured with, and the plot folder (recorded only)."""

    checkpoints: tuple[Path, ...]
    checkpoint_options: CheckpointSettings
    data_options: DataSettings
    batch_size: int
    curvature_data: str | None = None
    loss: str = "ce"
    gamma: float | None = None
    method: str = "lanczos"
    tol: float = 1e-4
    max_iter: int | None = None
    probes: int = 50
    val_split: float = DEFAULT_VAL_SPLIT
    gammas: tuple[float, ...] | None = None
    bins: int = 15
    seed: int = 0
    plot_dir: Path | None = None


@dataclass(frozen=True)
class StudyRun:
    """The study's rows and correlations, and its report."""

    result: StudyResult
    report: Report


def run_study(request: StudyRequest, reporter: Reporter) -> StudyRun:
    """Measure every checkpoint of ``request`` (a progress count on ``reporter``)."""
    from curvcal.calibration.analysis import CalibrationSettings, analyse_val_split
    from curvcal.load.batches import iter_batches
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.labels import stratified_split
    from curvcal.load.text import text_model_at
    from curvcal.pipeline.inference import predict_logits
    from curvcal.pipeline.session import default_params
    from curvcal.provenance import environment
    from curvcal.settings.fields import record
    from curvcal.settings.hessian import HessianSettings
    from curvcal.study import (
        CurvatureSettings,
        StudyResult,
        StudyRow,
        calibration_summary,
        duplicate_checkpoints,
        duplicate_warning,
        measure_curvature,
        rank_correlations,
    )

    began = time.perf_counter()
    loss, gamma, seed = request.loss, request.gamma, request.seed
    HessianSettings(loss=loss, gamma=gamma)  # the --loss/--gamma rules
    curvature_settings = CurvatureSettings(
        method=request.method,
        tol=request.tol,
        max_iter=request.max_iter,
        probes=request.probes,
        seed=seed,
    )
    calibration_settings = CalibrationSettings(method="both", bins=request.bins, seed=seed)
    if request.gammas is not None:
        calibration_settings = dataclasses.replace(calibration_settings, gammas=request.gammas)

    checkpoint_options, data_options = request.checkpoint_options, request.data_options
    trust = checkpoint_options.trust_checkpoint
    # text data is tokenized once, with the first checkpoint's tokenizer (or --tokenizer)
    text_model = text_model_at(request.checkpoints[0], checkpoint_options.arch)
    data = load_dataset(data_options.replace(trust_checkpoint=trust), None, text_model)
    hessian_data = data
    if request.curvature_data is not None:
        hessian_data = load_dataset(
            data_options.replace(data=request.curvature_data, trust_checkpoint=trust),
            None,
            text_model,
        )
    fit_idx, eval_idx = stratified_split(data.labels, request.val_split, seed, data.spec)
    paths = list(request.checkpoints)
    check_every_checkpoint(paths, checkpoint_options, data, hessian_data, request.curvature_data)

    rows: list[StudyRow] = []
    inputs: list[dict[str, Any]] = []
    batch_size = request.batch_size
    said: set[str] = set()  # parameter choices already noted on stderr
    with reporter.progress("checkpoints", len(paths)) as advance:
        for path in paths:
            with naming_the_checkpoint(path):
                loaded = load_model(path, checkpoint_options)
                trained_loss, trained_gamma, penalty = training_loss(loaded)
                hessian_loss, hessian_gamma = _hessian_loss(loaded, loss, gamma)

                def batches(source: LoadedData = hessian_data) -> Any:
                    return iter_batches(source.dataset, batch_size)

                params, choice, say_choice = default_params(loaded, ())
                if say_choice and choice not in said:
                    said.add(choice)
                    reporter.warn(f"Hessian over {choice}")
                curvature = measure_curvature(
                    loaded.module,
                    batches,
                    hessian_loss,
                    hessian_gamma,
                    curvature_settings,
                    params=params or None,
                )
                logits, labels = predict_logits(
                    loaded.module, iter_batches(data.dataset, batch_size), loaded.device
                )
                analysis = analyse_val_split(
                    logits,
                    labels,
                    fit_idx,
                    eval_idx,
                    "logits",
                    calibration_settings,
                    request.val_split,
                    f"{path} on --data {data.spec}",
                )
                rows.append(
                    StudyRow(
                        checkpoint=path.name,
                        training_loss=trained_loss,
                        training_gamma=trained_gamma,
                        penalty=penalty,
                        curvature=curvature,
                        calibration=calibration_summary(analysis),
                    )
                )
                inputs.append(loaded.describe())
            advance(1)

    n_fit, n_eval = len(fit_idx), len(eval_idx)
    columns = column_provenance(loss, gamma, hessian_data, data, n_fit, n_eval)
    result = StudyResult(tuple(rows), rank_correlations(rows), columns)
    messages = [
        duplicate_warning(group)
        for group in duplicate_checkpoints([str(p) for p in paths], [i["sha256"] for i in inputs])
    ]
    for message in messages:
        reporter.warn(message)
    report = Report(
        command="study",
        results=result,
        inputs={
            "checkpoints": inputs,
            "data": data.describe(),
            "curvature_data": hessian_data.describe(),
        },
        settings={
            "loss": loss,
            "gamma": gamma,
            "curvature": curvature_settings,
            "calibration": calibration_settings,
            "val_split": request.val_split,
            "batch_size": batch_size,
            "checkpoint": record(checkpoint_options),
            "data": record(data_options),
            "curvature_data": request.curvature_data,
            "plot": request.plot_dir,
        },
        timings={"total": time.perf_counter() - began},
        environment=environment(loaded.device),
        warnings=messages,
    )
    return StudyRun(result, report)


def check_every_checkpoint(
    paths: list[Path],
    options: CheckpointSettings,
    data: LoadedData,
    hessian_data: LoadedData,
    curvature_data: str | None,
) -> None:
    """Every checkpoint loads and fits --data (and --curvature-data) before any is measured,
    so a misfit late in the list stops the run in seconds, not after the others' passes. Each
    model is dropped after its check (the loop reloads it) to hold one model at a time."""
    from curvcal.load.checkpoint import load_model
    from curvcal.pipeline.fitness import check_fitness

    for path in paths:
        with naming_the_checkpoint(path):
            loaded = load_model(path, options)
            check_fitness(loaded, data, "--data")
            if curvature_data is not None:
                check_fitness(loaded, hessian_data, "--curvature-data")
            del loaded


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
    from curvcal.load.metadata import GAMMA_METADATA_KEY, LOSS_METADATA_KEY

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


def _hessian_loss(loaded: LoadedModel, loss: str, gamma: float | None) -> tuple[str, float | None]:
    """The Hessian's loss for this checkpoint: --loss, or with ``own`` its recorded one."""
    from curvcal.load.metadata import LOSS_METADATA_KEY, recorded_loss

    if loss != "own":
        return loss, gamma
    if (loaded.metadata.get(LOSS_METADATA_KEY) or "").strip().lower() == "flsd53":
        return "flsd53", None
    return recorded_loss(loaded)


def column_provenance(
    loss: str,
    gamma: float | None,
    hessian_data: LoadedData,
    data: LoadedData,
    n_fit: int,
    n_eval: int,
) -> dict[str, str]:
    """Which loss and which samples every column of the table comes from."""
    from curvcal.study import hessian_loss_label

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
    return {
        "λmax": f"largest eigenvalue of the {curvature}",
        "tr(H)": f"trace of the {curvature}: exact by Gauss–Newton where the logits are linear "
        "in each tensor, else its Gauss–Newton part exact and Hutch++ on the rest",
        "accuracy": evaluation,
        "ECE": f"15-bin top-label ECE (bins (a,b]) on the {evaluation}, uncalibrated",
        "AdaECE": f"equal-mass ECE on the {evaluation}, uncalibrated",
        "NLL": f"mean −log p_y on the {evaluation}, uncalibrated",
        "T": f"temperature scaling (NLL objective) {fit}",
        "FTS γ, T": f"focal temperature scaling (ECE objective) {fit}",
        "ECE after TS": f"ECE on the {evaluation} after TS",
        "ECE after FTS": f"ECE on the {evaluation} after focal TS",
    }
