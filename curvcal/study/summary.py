"""Curvature against calibration across checkpoints: the library behind ``curvcal study``.

For each checkpoint, :func:`curvature_summary` picks λmax (the largest algebraic eigenvalue of
the Hessian H of the mean loss over a dataset) and tr(H) (exact by Gauss–Newton where the
logits are linear in each tensor, else its Gauss–Newton part exact and Hutch++ on the rest,
else a Hutch++ estimate: the ``auto`` trace) of the analysis
:func:`~curvcal.curvature.analysis.analyse_hessian` made with the same settings for every
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

from curvcal.calibration.analysis import CalibrationAnalysis
from curvcal.curvature.results import HessianAnalysis
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
    logits are linear in each tensor) or ``hutch++`` (``probes`` products), as
    ``curvcal hessian --trace-method auto`` chooses.
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
    trace_method: str = "hutch++"


def hessian_loss_label(loss: str, gamma: float | None) -> str:
    """``ce``, ``focal γ=2`` or ``flsd53``: how tables name a loss."""
    if loss == "focal":
        return f"focal γ={gamma:g}"
    return loss


def curvature_summary(
    analysis: HessianAnalysis, groups: tuple[tuple[float, int], ...] = ()
) -> CurvatureSummary:
    """The study's curvature numbers of one checkpoint from its Hessian analysis
    (:func:`~curvcal.curvature.analysis.analyse_hessian` with the study's settings: the top
    eigenvalue and the ``auto`` trace); ``groups``: FLSD-53's ``(γ, samples)``."""
    if analysis.trace is None:
        raise InputError("trace", "the study needs the trace of every checkpoint's Hessian")
    operator = analysis.operator
    top = analysis.spectrum.values[0]
    loss = str(operator["loss"])
    return CurvatureSummary(
        lambda_max=top.value,
        lambda_max_converged=top.converged,
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
class CalibrationSummary:
    """The calibration numbers of one checkpoint, all on the evaluation split: accuracy, ECE,
    AdaECE and NLL uncalibrated; the fitted TS temperature and focal-TS (γ, T); ECE after each."""

    n_eval: int
    n_fit: int
    accuracy: float
    ece: float
    adaece: float
    nll: float
    temperature: float
    focal_gamma: float
    focal_temperature: float
    ece_after_ts: float
    ece_after_fts: float


def calibration_summary(analysis: CalibrationAnalysis) -> CalibrationSummary:
    """The study's calibration numbers from an analysis that fitted both maps."""
    ts, fts = analysis.fits.ts, analysis.fits.focal_ts
    after_ts, after_fts = analysis.evaluation.ts, analysis.evaluation.focal_ts
    if ts is None or fts is None or after_ts is None or after_fts is None:
        raise InputError("calibration", "the study needs both TS and focal TS fitted")
    before = analysis.evaluation.uncalibrated
    return CalibrationSummary(
        n_eval=before.n_samples,
        n_fit=analysis.split.n_fit,
        accuracy=before.accuracy,
        ece=before.ece,
        adaece=before.adaece,
        nll=before.nll,
        temperature=ts.calibrator.temperature,
        focal_gamma=fts.calibrator.gamma,
        focal_temperature=fts.calibrator.temperature,
        ece_after_ts=after_ts.ece,
        ece_after_fts=after_fts.ece,
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

    def measure(self, name: str) -> float:
        """The value of a measure of :data:`CURVATURE_MEASURES` or :data:`CALIBRATION_MEASURES`."""
        if name in CURVATURE_MEASURES:
            return float(getattr(self.curvature, name))
        return float(getattr(self.calibration, name))


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


def rank_correlations(rows: Sequence[StudyRow]) -> tuple[Correlation, ...]:
    """Spearman's ρ and its p-value (:func:`curvcal.study.spearman.spearman`) for every
    (curvature, calibration) measure pair."""
    from curvcal.study.spearman import spearman

    out = []
    for curvature in CURVATURE_MEASURES:
        for calibration in CALIBRATION_MEASURES:
            xs = [row.measure(curvature) for row in rows]
            ys = [row.measure(calibration) for row in rows]
            n = len(rows)
            note = _undefined(curvature, xs, calibration, ys)
            if note is not None:
                out.append(Correlation(curvature, calibration, None, None, n, note))
                continue
            result = spearman(xs, ys)
            out.append(
                Correlation(
                    curvature, calibration, result.rho, result.p_value, n, None, result.p_method
                )
            )
    return tuple(out)


def _undefined(
    curvature: str, xs: Sequence[float], calibration: str, ys: Sequence[float]
) -> str | None:
    """Why ρ of this pair cannot be computed (``None`` when it can), naming the measure."""
    if len(xs) < MIN_CORRELATION_SAMPLES:
        return f"needs at least {MIN_CORRELATION_SAMPLES} checkpoints, got {len(xs)}"
    for key, names, values in (
        (curvature, CURVATURE_MEASURES, xs),
        (calibration, CALIBRATION_MEASURES, ys),
    ):
        if not all(math.isfinite(v) for v in values):
            return f"{names[key]} is not finite for every checkpoint"
    for key, names, values in (
        (curvature, CURVATURE_MEASURES, xs),
        (calibration, CALIBRATION_MEASURES, ys),
    ):
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
