"""Fit calibration maps on one split and measure every stage on another.

:func:`analyse_calibration` is the engine behind ``curvcal calibrate`` and ``curvcal metrics``:

1. fit temperature scaling (p = softmax(z / T)) and/or focal temperature scaling
   (p = φ_γ(softmax(z / T))) on the *fit* split only;
2. apply each fitted map to the *evaluation* split and compute :func:`calibration_metrics` there,
   for the uncalibrated scores and for every fitted stage, with the same bins, edge convention
   and bootstrap seed (so bootstrap resamples are paired across stages).

With ``method`` ``all`` every map of the registry that applies to the scores is fitted (the
others are skipped with their reason) and the stages are ranked on the evaluation split by NLL
and ECE with paired bootstrap intervals (:mod:`curvcal.calibration.ranking`).

The evaluation split never takes part in a fit, and nothing is measured in-sample on the fit
split except what the fit itself reports (its objective and NLL before/after, labelled as such).
:func:`evaluate_calibrators` measures saved calibrators on a whole set of scores, fitting nothing.

Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Generic, TypeVar

import torch

from curvcal.calibration.bbq import BBQFit
from curvcal.calibration.binary import BinaryFit
from curvcal.calibration.binning import HistogramFit
from curvcal.calibration.device import DEVICE_STAGES, METRICS, stage_device
from curvcal.calibration.ensemble import EnsembleFit, EnsembleMap
from curvcal.calibration.inputs import InputNames, as_tensor, check_kind
from curvcal.calibration.isotonic import IsotonicFit
from curvcal.calibration.linear import LinearFit
from curvcal.calibration.metrics import TopLabel, calibration_metrics, top_label_of
from curvcal.calibration.ranking import Ranking, rank_stages
from curvcal.calibration.registry import (
    ALL,
    MAPS,
    CalibrationMap,
    applicable_stages,
    fitted_stages,
)
from curvcal.calibration.registry import STAGE_METHODS as STAGE_METHODS
from curvcal.calibration.results import (
    CalibrationMetrics,
    Calibrator,
    FocalTemperatureFit,
    TemperatureFit,
)
from curvcal.calibration.venn_abers import VennAbersFit
from curvcal.errors import InputError, NumericalError, SettingsError, setting_name
from curvcal.settings.calibration import CalibrationSettings as CalibrationSettings

#: Where the fit split came from: carved out of the data (``val-split``), a second dataset
#: (``fit-data``), a second logits file (``fit-file``), or no fit at all (``none``).
SPLIT_METHODS = ("val-split", "fit-data", "fit-file", "none")
#: Evaluation stages in report order (the calibrator method each one applies:
#: :data:`STAGE_METHODS`, from the registry of maps).
STAGES = ("uncalibrated", *MAPS)
#: Stages whose key the JSON always carries (``null`` when not run); later maps' keys appear
#: only when they ran.
_ALWAYS = ("uncalibrated", "ts", "focal_ts")
_Record = TypeVar("_Record")


class _ByStage(Generic[_Record]):
    """One record per stage, held as dataclass fields named for the stages of :data:`STAGES`
    (``None`` for a stage that did not run)."""

    def to_dict(self) -> dict[str, Any]:
        """The records by stage: those that ran, and the stages of ``_ALWAYS`` in any case."""
        return {
            name: getattr(self, name)
            for name in (item.name for item in dataclass_fields(self))  # type: ignore[arg-type]
            if name in _ALWAYS or getattr(self, name) is not None
        }

    def present(self) -> list[tuple[str, _Record]]:
        """``(stage, record)`` for every stage that ran, in :data:`STAGES` order."""
        records = [(name, getattr(self, name, None)) for name in STAGES]
        return [(name, record) for name, record in records if record is not None]


@dataclass(frozen=True)
class SplitInfo:
    """Which samples fitted and which evaluated: ``method`` (one of :data:`SPLIT_METHODS`),
    their sizes, and the ``fraction`` and ``seed`` of a ``val-split`` (``None`` otherwise)."""

    method: str
    n_fit: int
    n_eval: int
    fraction: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPLIT_METHODS:
            raise InputError("split", f"unknown split method {self.method!r}")


@dataclass(frozen=True)
class StageMetrics(_ByStage[CalibrationMetrics]):
    """Metrics of the evaluation split at each stage (``None`` for a stage not run)."""

    uncalibrated: CalibrationMetrics
    ts: CalibrationMetrics | None = None
    focal_ts: CalibrationMetrics | None = None
    vector: CalibrationMetrics | None = None
    matrix: CalibrationMetrics | None = None
    laplace: CalibrationMetrics | None = None
    histogram: CalibrationMetrics | None = None
    histogram_ovr: CalibrationMetrics | None = None
    isotonic: CalibrationMetrics | None = None
    isotonic_ovr: CalibrationMetrics | None = None
    platt: CalibrationMetrics | None = None
    beta: CalibrationMetrics | None = None
    dirichlet: CalibrationMetrics | None = None
    dirichlet_l2: CalibrationMetrics | None = None
    ets: CalibrationMetrics | None = None
    bbq: CalibrationMetrics | None = None
    venn_abers: CalibrationMetrics | None = None


@dataclass(frozen=True)
class CalibrationFits(_ByStage[Any]):
    """The fits made on the fit split (``None`` for a map not fitted)."""

    ts: TemperatureFit | None = None
    focal_ts: FocalTemperatureFit | None = None
    vector: LinearFit | None = None
    matrix: LinearFit | None = None
    laplace: Any = None
    histogram: HistogramFit | None = None
    histogram_ovr: HistogramFit | None = None
    isotonic: IsotonicFit | None = None
    isotonic_ovr: IsotonicFit | None = None
    platt: BinaryFit | None = None
    beta: BinaryFit | None = None
    dirichlet: LinearFit | None = None
    dirichlet_l2: LinearFit | None = None
    ets: EnsembleFit | None = None
    bbq: BBQFit | None = None
    venn_abers: VennAbersFit | None = None


@dataclass(frozen=True)
class CalibrationAnalysis:
    """Everything one calibration run found.

    JSON layout (read by the CI gate): ``evaluation.<stage>.<metric>`` for the stages
    ``uncalibrated``, ``ts`` and ``focal_ts`` (all measured on the evaluation split),
    ``fits.ts`` (a :class:`TemperatureFit`), ``fits.focal_ts`` (a :class:`FocalTemperatureFit`),
    ``split`` (:class:`SplitInfo`), ``settings`` (:class:`CalibrationSettings`), ``applied``
    (the saved calibrators measured by :func:`evaluate_calibrators`, a Laplace one as its
    summary; empty otherwise) and, with
    method ``all`` or with bootstrap resamples for any method that fits a map, ``ranking``
    (:class:`Ranking`: each stage's paired bootstrap differences from the best and from
    uncalibrated; the key is absent otherwise).
    """

    evaluation: StageMetrics
    fits: CalibrationFits
    split: SplitInfo
    settings: CalibrationSettings
    kind: str
    n_classes: int
    applied: dict[str, CalibrationMap] = field(default_factory=dict)
    ranking: Ranking | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as the report writes them; an applied calibrator with a ``summary()``
        (Laplace: a posterior covariance of P² numbers) is written as that summary, its numbers
        staying in the calibrator file."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["applied"] = {
            stage: calibrator.summary() if hasattr(calibrator, "summary") else calibrator
            for stage, calibrator in self.applied.items()
        }
        if self.ranking is None:
            del out["ranking"]
        return out

    def calibrators(self) -> dict[str, CalibrationMap]:
        """The calibrator of every stage that has one (fitted or applied), keyed by stage."""
        out = dict(self.applied)
        for stage, fit in self.fits.present():
            out[stage] = fit.calibrator
        return out


def analyse_calibration(
    fit_scores: Any,
    fit_labels: Any,
    eval_scores: Any,
    eval_labels: Any,
    kind: str,
    settings: CalibrationSettings,
    split_method: str = "fit-data",
    fraction: float | None = None,
    fit_source: str = "fit scores",
    eval_source: str = "scores",
    features: tuple[Any, Any] | None = None,
) -> CalibrationAnalysis:
    """Fit the maps ``settings.method`` names on (``fit_scores``, ``fit_labels``) and measure
    the uncalibrated and calibrated scores on (``eval_scores``, ``eval_labels``) only.

    Scores are N×K of the given ``kind`` (``logits``, ``probs`` or ``logprobs``); the two splits
    must have the same K. ``split_method`` and ``fraction`` describe how the splits were made
    (recorded in :class:`SplitInfo`; ``seed`` is ``settings.seed`` for a ``val-split``). With
    method ``none`` no fit split is needed: pass ``None`` for ``fit_scores``/``fit_labels`` and
    ``split_method="none"``. ``fit_source``/``eval_source`` name the inputs in errors (and
    their labels ``<source> labels``: :meth:`InputNames.of`). A ``settings.method`` of
    ``None`` fits both maps when a fit split is given and none otherwise (the analysis
    records the method it ran). ``features``: the model's last-layer inputs of
    the (fit, evaluation) samples (:class:`~curvcal.calibration.laplace.HeadFeatures`), which
    a map whose registry ``input`` is ``features`` (Laplace) fits and acts on instead of the
    scores. A map named by ``settings.method`` that does not apply to these scores (or, for a
    map that needs the model, to scores without ``features``) is an :class:`InputError`;
    ``all`` skips it and records why, as it does a map whose fit refuses the fit split (an
    :class:`InputError` of any map but TS, whose refusal stops the run).
    """
    check_kind(kind)
    if settings.method is None:
        settings = settings.replace(method="both" if fit_scores is not None else "none")
    evaluate = _measure(eval_labels, kind, settings, eval_source)
    uncalibrated = evaluate(eval_scores)
    n_classes = uncalibrated.n_classes
    if settings.method == "none":
        if fit_scores is not None:
            raise SettingsError("method", "fits nothing, but a fit split was given", value="none")
        split = SplitInfo("none", 0, uncalibrated.n_samples)
        return CalibrationAnalysis(
            StageMetrics(uncalibrated), CalibrationFits(), split, settings, kind, n_classes
        )
    if fit_scores is None or fit_labels is None:
        raise SettingsError("method", f"{settings.method} needs a fit split", "give one")
    if split_method not in SPLIT_METHODS or split_method == "none":
        raise InputError("split", f"{split_method!r} does not describe a fit split")
    n_fit, fit_k = _shape(fit_scores, fit_source)
    if fit_k != n_classes:
        raise InputError(
            fit_source, f"has {fit_k} classes but the evaluation scores have {n_classes}"
        )
    requested = fitted_stages(settings.method)
    if settings.method != ALL:
        _need_features(requested, features)
    stages, skipped = applicable_stages(requested, n_classes, features is not None)
    if skipped and settings.method != ALL:
        raise SettingsError("method", next(iter(skipped.values())), value=str(settings.method))
    fits = {}
    for stage in stages:
        try:
            fits[stage] = MAPS[stage].fit(
                _inputs(stage, fit_scores, features, 0),
                fit_labels,
                kind,
                settings,
                names=InputNames.of(fit_source),
            )
        except InputError as error:
            # ``all``: a map this fit split cannot fit (too few rows for its bins, one class
            # for beta calibration) is skipped with its reason like one that does not apply,
            # rather than losing every other map. TS fits any scores it can read, so its
            # refusal is the inputs' fault and stops the run.
            if settings.method != ALL or stage == "ts":
                raise
            skipped[stage] = error.message
    tops: dict[str, TopLabel] | None = None
    if settings.method == ALL or settings.bootstrap > 0:
        tops = {
            "uncalibrated": top_label_of(eval_scores, eval_labels, kind, InputNames.of(eval_source))
        }
    evaluation = StageMetrics(
        uncalibrated,
        **{
            stage: evaluate(
                eval_scores, fit.calibrator, _inputs(stage, None, features, 1), stage, tops
            )
            for stage, fit in fits.items()
        },
    )
    ranking = None
    if tops is not None:
        ranking = rank_stages(
            tops, settings.bins, settings.edges, settings.bootstrap, settings.seed, skipped
        )
    split = SplitInfo(
        split_method,
        n_fit,
        uncalibrated.n_samples,
        fraction=fraction if split_method == "val-split" else None,
        seed=settings.seed if split_method == "val-split" else None,
    )
    return CalibrationAnalysis(
        evaluation,
        CalibrationFits(**fits),
        split,
        settings,
        kind,
        n_classes,
        ranking=ranking,
    )


def analyse_val_split(
    scores: Any,
    labels: Any,
    fit_idx: Any,
    eval_idx: Any,
    kind: str,
    settings: CalibrationSettings,
    fraction: float,
    source: str,
    features: Any = None,
) -> CalibrationAnalysis:
    """:func:`analyse_calibration` on two disjoint parts of one set of scores: the maps are
    fitted on the rows ``fit_idx`` and every stage is measured on the rows ``eval_idx``
    (``fraction`` is recorded as the share fitted; ``source`` names the scores in errors;
    ``features``: the model's last-layer inputs of the same rows, split alike)."""
    return analyse_calibration(
        scores[fit_idx],
        labels[fit_idx],
        scores[eval_idx],
        labels[eval_idx],
        kind,
        settings,
        "val-split",
        fraction,
        fit_source=f"{source} (fit split)",
        eval_source=f"{source} (evaluation split)",
        features=None if features is None else (features.rows(fit_idx), features.rows(eval_idx)),
    )


def evaluate_calibrators(
    scores: Any,
    labels: Any,
    kind: str,
    calibrators: Mapping[str, CalibrationMap],
    settings: CalibrationSettings,
    source: str = "scores",
    features: Any = None,
    calibrators_source: str = "calibrators",
) -> CalibrationAnalysis:
    """Measure saved ``calibrators`` (keyed by stage: ``ts``, ``focal_ts``, ``vector``,
    ``matrix``, ``laplace``) on all of ``scores`` (a ``laplace`` calibrator on ``features``,
    the model's last-layer inputs of the same rows). ``calibrators_source`` (the file they
    were read from) is named when a map's output is NaN or +inf on these scores (parameters
    that overflow on them: an :class:`InputError`).

    Nothing is fitted, so every sample is evaluation data (split method ``none``). A stage's
    calibrator must carry that stage's method (``ts``: temperature, ``focal_ts``:
    focal-temperature, ``vector``/``matrix``: the same name).
    """
    check_kind(kind)
    for stage, calibrator in calibrators.items():
        if stage not in STAGE_METHODS:
            raise InputError("calibrators", f"unknown stage {stage!r}", "ts or focal_ts")
        if calibrator.method != STAGE_METHODS[stage]:
            raise InputError(
                "calibrators",
                f"stage {stage} needs method {STAGE_METHODS[stage]!r}, got {calibrator.method!r}",
            )
    _need_features(tuple(calibrators), None if features is None else (None, features))
    evaluate = _measure(labels, kind, settings, source, calibrators_source)
    uncalibrated = evaluate(scores)
    evaluation = StageMetrics(
        uncalibrated,
        **{
            stage: evaluate(
                scores, calibrators[stage], _inputs(stage, None, (None, features), 1), stage
            )
            for stage in MAPS
            if stage in calibrators
        },
    )
    split = SplitInfo("none", 0, uncalibrated.n_samples)
    return CalibrationAnalysis(
        evaluation,
        CalibrationFits(),
        split,
        settings,
        kind,
        uncalibrated.n_classes,
        applied={stage: calibrators[stage] for stage in STAGES if stage in calibrators},
    )


def _measure(
    labels: Any,
    kind: str,
    settings: CalibrationSettings,
    source: str,
    calibrators_source: str | None = None,
) -> Any:
    """``evaluate(scores, calibrator=None, features=None, stage="", tops=None)``: the metrics of one stage on
    these labels; with ``tops``, its per-sample top-label quantities are added to it under
    ``stage`` (from the same calibrated scores). A map whose log-probabilities hold a NaN or
    +inf is refused naming the map, not the scores: an :class:`InputError` naming
    ``calibrators_source`` for saved maps, a :class:`NumericalError` for maps just fitted
    (``calibrators_source`` ``None``)."""

    names = InputNames.of(source)

    def evaluate(
        scores: Any,
        calibrator: CalibrationMap | None = None,
        features: Any = None,
        stage: str = "",
        tops: dict[str, TopLabel] | None = None,
    ) -> CalibrationMetrics:
        options: dict[str, Any] = {
            "bins": settings.bins,
            "edges": settings.edges,
            "bootstrap": settings.bootstrap,
            "seed": settings.seed,
            "names": names,
            "reliability_classes": settings.reliability_classes,
            "smooth_curve": settings.smooth_curve,
            "device": stage_device(METRICS, settings.device),
        }
        if calibrator is None:
            return calibration_metrics(scores, labels, kind=kind, **options)
        if features is not None:
            logp = calibrator.apply(features, "features", source)
        elif stage in DEVICE_STAGES and isinstance(calibrator, Calibrator | EnsembleMap):
            # a map with a device kernel applies itself there, where the metrics read it
            device = stage_device(stage, settings.device)
            logp = calibrator.apply(scores, kind, source, device=device)
        else:
            logp = calibrator.apply(scores, kind, source)
        _check_map_output(logp, stage or calibrator.method, source, calibrators_source)
        if tops is not None:
            tops[stage] = top_label_of(logp, labels, "logprobs", names, device=options["device"])
        return calibration_metrics(logp, labels, kind="logprobs", **options)

    return evaluate


def _check_map_output(logp: Any, stage: str, source: str, calibrators_source: str | None) -> None:
    """Refuse a map's log-probabilities holding a NaN or +inf (−inf, probability 0, is a value
    a map may give): the map's parameters overflow on these scores, and the metrics would
    otherwise name the scores as the fault."""
    bad = torch.isnan(logp) | (logp == math.inf)
    if not bool(bad.any()):
        return
    rows = bad.any(dim=1).nonzero().reshape(-1)
    why = (
        f"the {stage} map gives NaN or +inf log-probabilities on {rows.numel()} row(s) of "
        f"{source} (first: row {int(rows[0])}): its parameters overflow on these scores"
    )
    if calibrators_source is not None:
        raise InputError(f"{calibrators_source} ({stage})", why, "refit the map on such scores")
    raise NumericalError(
        f"{setting_name('method')} {MAPS[stage].option}" if stage in MAPS else stage, why
    )


def _need_features(stages: tuple[str, ...], features: tuple[Any, Any] | None) -> None:
    """A map that reads the model's features (Laplace) with no features given: refused."""
    needing = [stage for stage in stages if MAPS[stage].input == "features"]
    if needing and features is None:
        raise SettingsError(
            "method",
            "needs the model, not only its logits: the Laplace approximation is over the "
            "weights of the model's last layer and acts on that layer's inputs",
            "give the model and its data, not saved logits",
            value="laplace",
        )


def _inputs(stage: str, scores: Any, features: tuple[Any, Any] | None, side: int) -> Any:
    """What ``stage``'s map reads on one side (0: fit, 1: evaluation): the scores, or the
    model's features for a map whose registry ``input`` is ``features`` (``None`` on the
    evaluation side of a score map: the scores are passed as they are)."""
    if MAPS[stage].input != "features":
        return scores
    assert features is not None
    return features[side]


def _shape(scores: Any, source: str) -> tuple[int, int]:
    tensor = as_tensor(scores, source)
    if tensor.ndim != 2:
        raise InputError(
            source, f"scores must be 2-D (samples × classes), got shape {tuple(tensor.shape)}"
        )
    return int(tensor.shape[0]), int(tensor.shape[1])
