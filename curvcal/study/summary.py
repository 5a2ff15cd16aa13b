"""Curvature against calibration across checkpoints: the library behind ``curvcal study``.

For each checkpoint, :func:`curvature_summary` picks λmax (the largest algebraic eigenvalue of
the Hessian H of the mean loss over a dataset) and tr(H) (exact by Gauss–Newton where the
logits are linear in each tensor, else its Gauss–Newton part exact and Hutch++ on the rest,
else a Hutch++ estimate: the ``auto`` trace) of the analysis
:func:`~curvcal.curvature.analysis.analyse_batches` made with the same settings for every
checkpoint; :func:`calibration_summary` picks the numbers of a
:class:`~curvcal.calibration.analysis.CalibrationAnalysis` (all measured on its evaluation
split). :func:`rank_correlations` then gives Spearman's rank correlation ρ between
every curvature measure and every calibration measure across the checkpoints, with its two-sided
p-value (exact by enumerating the pairings up to n = 10, see :mod:`curvcal.study.spearman`).
:func:`duplicate_checkpoints` names the checkpoints that are byte-identical (same SHA-256), which
count twice in every correlation.

Pure: no file I/O, no printing, no random draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from curvcal.calibration.analysis import CalibrationAnalysis
from curvcal.curvature.results import HessianAnalysis, convergence_text
from curvcal.errors import InputError

#: Row attributes correlated, in table order, with their display names.
CURVATURE_MEASURES = {"lambda_max": "λmax", "trace": "tr(H)"}
CALIBRATION_MEASURES = {
    "ece": "ECE",
    "adaece": "AdaECE",
    "nll": "NLL",
    "temperature": "T",
    "focal_gamma": "FTS γ",
    "focal_temperature": "FTS T",
    "ece_after_ts": "ECE after TS",
    "ece_after_fts": "ECE after FTS",
}
MIN_CORRELATION_SAMPLES = 3


@dataclass(frozen=True)
class CurvatureSummary:
    """λmax and tr(H) of one checkpoint, with what they were measured on.

    ``loss`` names the Hessian's loss (``ce``, ``focal`` with ``gamma``, or ``flsd53``);
    ``mean_loss`` is its mean over the ``n_samples`` samples; ``groups`` lists FLSD-53's
    ``(γ, samples)`` (empty otherwise). ``trace_method``: ``gauss-newton`` (exact, where the
    logits are linear in each tensor) or ``hutchpp`` (``probes`` products), as
    ``curvcal hessian --trace-method auto`` chooses. ``lambda_max_convergence`` is the
    hessian table's word for λmax (:func:`~curvcal.curvature.results.convergence_text`):
    ``yes`` only when its residual met the tol asked for, else why it stopped.
    """

    lambda_max: float
    lambda_max_converged: bool
    lambda_max_residual: float
    trace: float
    trace_standard_error: float
    loss: str
    gamma: float | None
    mean_loss: float
    n_samples: int
    n_params: int
    matvecs: int
    engine: str
    groups: tuple[tuple[float, int], ...] = ()
    trace_method: str = "hutchpp"
    lambda_max_convergence: str = "yes"


def hessian_loss_label(loss: str, gamma: float | None) -> str:
    """``ce``, ``focal γ=2`` or ``flsd53``: how tables name a loss."""
    if loss == "focal":
        return f"focal γ={gamma:g}"
    return loss


def curvature_summary(
    analysis: HessianAnalysis, groups: tuple[tuple[float, int], ...] = ()
) -> CurvatureSummary:
    """The study's curvature numbers of one checkpoint from its Hessian analysis
    (:func:`~curvcal.curvature.analysis.analyse_batches` with the study's settings: the top
    eigenvalue and the ``auto`` trace); ``groups``: FLSD-53's ``(γ, samples)``."""
    if analysis.trace is None:
        raise InputError("trace", "the study needs the trace of every checkpoint's Hessian")
    operator = analysis.operator
    top = analysis.spectrum.values[0]
    loss = str(operator["loss"])
    return CurvatureSummary(
        lambda_max=top.value,
        lambda_max_converged=top.converged,
        lambda_max_convergence=convergence_text(
            top, analysis.spectrum.precision_floor, str(operator.get("model_dtype", ""))
        ),
        lambda_max_residual=top.residual,
        trace=analysis.trace.estimate,
        trace_standard_error=analysis.trace.standard_error,
        trace_method=analysis.trace.method,
        loss=loss,
        gamma=operator["gamma"] if loss == "focal" else None,
        mean_loss=operator["mean_loss"],
        n_samples=operator["n_samples"],
        n_params=operator["n_params"],
        matvecs=analysis.spectrum.matvecs + analysis.trace.matvecs,
        engine=operator["engine"],
        groups=groups,
    )


@dataclass(frozen=True)
class MapScore:
    """One map's ECE and NLL on the evaluation split after calibration."""

    ece: float
    nll: float


@dataclass(frozen=True)
class CalibrationSummary:
    """The calibration numbers of one checkpoint, all on the evaluation split: accuracy, ECE,
    AdaECE and NLL uncalibrated; the fitted TS temperature and focal-TS (γ, T) and ECE after
    each (``None`` for a map not fitted); ``maps``: every fitted map's :class:`MapScore` by
    stage (``None`` with the default selection, TS and focal TS, whose layout is the one above);
    ``best``: the stage of lowest NLL (``--maps all`` only); ``skipped``: the maps of
    ``--maps all`` that do not apply, with the reason.

    JSON: the keys whose value is ``None`` are left out."""

    n_eval: int
    n_fit: int
    accuracy: float
    ece: float
    adaece: float
    nll: float
    temperature: float | None
    focal_gamma: float | None
    focal_temperature: float | None
    ece_after_ts: float | None
    ece_after_fts: float | None
    maps: dict[str, MapScore] | None = None
    best: str | None = None
    skipped: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if getattr(self, name) is not None
        }

    def after(self, stage: str) -> float | None:
        """ECE after the map of ``stage`` (``None`` when it was not fitted)."""
        if self.maps is not None:
            score = self.maps.get(stage)
            return None if score is None else score.ece
        return {"ts": self.ece_after_ts, "focal_ts": self.ece_after_fts}.get(stage)


#: The selection whose rows keep the layout of earlier versions (no ``maps`` key).
DEFAULT_MAPS = "both"


def ece_after_key(stage: str) -> str:
    """The measure key of the ECE after a map: ``ece_after_ts``, ``ece_after_fts`` (focal TS),
    else ``ece_after_<stage>``."""
    return {"ts": "ece_after_ts", "focal_ts": "ece_after_fts"}.get(stage, f"ece_after_{stage}")


def calibration_measures(stages: Sequence[str]) -> dict[str, str]:
    """The calibration measures correlated when the maps of ``stages`` (registry stages, in
    registry order) were fitted, with their display names: ECE, AdaECE and NLL uncalibrated,
    TS's T and focal TS's γ and T when fitted, then the ECE after each map. With TS and focal
    TS this is :data:`CALIBRATION_MEASURES`."""
    from curvcal.calibration.registry import MAPS

    out = {"ece": "ECE", "adaece": "AdaECE", "nll": "NLL"}
    if "ts" in stages:
        out["temperature"] = "T"
    if "focal_ts" in stages:
        out["focal_gamma"] = "FTS γ"
        out["focal_temperature"] = "FTS T"
    for stage in stages:
        title = {"focal_ts": "FTS"}.get(stage, MAPS[stage].title)
        out[ece_after_key(stage)] = f"ECE after {title}"
    return out


def calibration_summary(
    analysis: CalibrationAnalysis, maps: str = DEFAULT_MAPS
) -> CalibrationSummary:
    """The study's calibration numbers from an analysis that fitted the maps ``maps`` selects
    (a ``calibrate --method`` value; with the default, TS and focal TS, the row has no
    ``maps``)."""
    fits, evaluation = analysis.fits, analysis.evaluation
    ts, fts = fits.ts, fits.focal_ts
    if maps == DEFAULT_MAPS and (ts is None or fts is None):
        raise InputError("calibration", "the study needs both TS and focal TS fitted")
    before = evaluation.uncalibrated
    after = {stage: metrics for stage, metrics in evaluation.present() if stage != "uncalibrated"}
    ranking = analysis.ranking
    return CalibrationSummary(
        n_eval=before.n_samples,
        n_fit=analysis.split.n_fit,
        accuracy=before.accuracy,
        ece=before.ece,
        adaece=before.adaece,
        nll=before.nll,
        temperature=None if ts is None else ts.calibrator.temperature,
        focal_gamma=None if fts is None else fts.calibrator.gamma,
        focal_temperature=None if fts is None else fts.calibrator.temperature,
        ece_after_ts=after["ts"].ece if "ts" in after else None,
        ece_after_fts=after["focal_ts"].ece if "focal_ts" in after else None,
        maps=None
        if maps == DEFAULT_MAPS
        else {stage: MapScore(m.ece, m.nll) for stage, m in after.items()},
        best=None if ranking is None else ranking.best["nll"],
        skipped=None if ranking is None else {skip.stage: skip.reason for skip in ranking.skipped},
    )


@dataclass(frozen=True)
class StudyRow:
    """One checkpoint: its name, its training loss (from its metadata; ``None`` if unknown, γ
    ``None`` for FLSD-53 and for ``ce`` + a trace penalty ``lambda_penalty``), and what was
    measured."""

    checkpoint: str
    training_loss: str | None
    training_gamma: float | None
    penalty: float | None
    curvature: CurvatureSummary
    calibration: CalibrationSummary

    def measure(self, name: str) -> float | None:
        """The value of a curvature or calibration measure (:func:`calibration_measures`;
        ``None`` when this checkpoint has none, e.g. a map skipped for it)."""
        if name in CURVATURE_MEASURES:
            return float(getattr(self.curvature, name))
        calibration = self.calibration
        if name.startswith("ece_after_") and calibration.maps is not None:
            stages = [s for s in calibration.maps if ece_after_key(s) == name]
            return calibration.after(stages[0]) if stages else None
        value = getattr(calibration, name, None)
        return None if value is None else float(value)


@dataclass(frozen=True)
class Correlation:
    """Spearman's ρ between a curvature and a calibration measure over ``n`` checkpoints, with
    its two-sided p-value and how it was formed (``p_method``: ``exact permutation`` up to
    n = 10, ``t approximation`` above); all ``None`` with a ``note`` when undefined (n < 3, a
    constant measure, a non-finite value), the note naming the cause."""

    curvature: str
    calibration: str
    rho: float | None
    p_value: float | None
    n: int
    note: str | None = None
    p_method: str | None = None


def row_stages(rows: Sequence[StudyRow]) -> tuple[str, ...]:
    """The maps fitted on any of ``rows``, in registry order."""
    from curvcal.calibration.registry import MAPS

    fitted: set[str] = set()
    for row in rows:
        calibration = row.calibration
        if calibration.maps is not None:
            fitted.update(calibration.maps)
        else:
            fitted.update(s for s in ("ts", "focal_ts") if calibration.after(s) is not None)
    return tuple(stage for stage in MAPS if stage in fitted)


def rank_correlations(
    rows: Sequence[StudyRow], measures: dict[str, str] | None = None
) -> tuple[Correlation, ...]:
    """Spearman's ρ and its p-value (:func:`curvcal.study.spearman.spearman`) for every
    (curvature, calibration) measure pair; ``measures``: the calibration measures
    (default: :func:`calibration_measures` of the maps the rows fitted)."""
    from curvcal.study.spearman import spearman

    if measures is None:
        measures = calibration_measures(row_stages(rows))
    out = []
    for curvature in CURVATURE_MEASURES:
        for calibration in measures:
            xs = [row.measure(curvature) for row in rows]
            ys = [row.measure(calibration) for row in rows]
            n = len(rows)
            note = _undefined(curvature, xs, calibration, ys, measures)
            if note is not None:
                out.append(Correlation(curvature, calibration, None, None, n, note))
                continue
            result = spearman(
                [float(x) for x in xs if x is not None], [float(y) for y in ys if y is not None]
            )
            out.append(
                Correlation(
                    curvature, calibration, result.rho, result.p_value, n, None, result.p_method
                )
            )
    return tuple(out)


def _undefined(
    curvature: str,
    xs: Sequence[float | None],
    calibration: str,
    ys: Sequence[float | None],
    measures: dict[str, str],
) -> str | None:
    """Why ρ of this pair cannot be computed (``None`` when it can), naming the measure."""
    if len(xs) < MIN_CORRELATION_SAMPLES:
        return f"needs at least {MIN_CORRELATION_SAMPLES} checkpoints, got {len(xs)}"
    pairs = ((curvature, CURVATURE_MEASURES, xs), (calibration, measures, ys))
    for key, names, values in pairs:
        if any(v is None for v in values):
            return f"{names[key]} was not measured for every checkpoint"
    for key, names, values in pairs:
        if not all(v is not None and math.isfinite(v) for v in values):
            return f"{names[key]} is not finite for every checkpoint"
    for key, names, values in pairs:
        if len(set(values)) == 1:
            return f"{names[key]} is constant across the checkpoints"
    return None


def duplicate_checkpoints(names: Sequence[str], digests: Sequence[str]) -> list[tuple[str, ...]]:
    """Groups (two or more, in the order given) of checkpoints whose files have the same
    SHA-256 digest: the same weights measured twice, which count twice in every correlation."""
    groups: dict[str, list[str]] = {}
    for name, digest in zip(names, digests, strict=True):
        groups.setdefault(digest, []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def duplicate_warning(group: Sequence[str]) -> str:
    """The warning for one group of byte-identical checkpoints."""
    return (
        f"checkpoints {', '.join(group)} are byte-identical (same SHA-256): the same weights "
        f"count {len(group)} times in every rank correlation; give each model once"
    )


@dataclass(frozen=True)
class StudyResult:
    """The rows (one per checkpoint, in the order given), the correlations, and the columns'
    provenance: which loss and which samples every measure comes from."""

    rows: tuple[StudyRow, ...]
    correlations: tuple[Correlation, ...]
    columns: dict[str, str]

    def measures(self) -> dict[str, str]:
        """The calibration measures of the correlations, with their display names."""
        return calibration_measures(row_stages(self.rows))
