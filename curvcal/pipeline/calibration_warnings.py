"""Warnings for calibration results a user should not take at face value.

Each function returns messages (never prints); the pipeline shows them on stderr and records
them in the report's ``warnings`` list, the same way as every other warning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from curvcal.errors import setting_name

if TYPE_CHECKING:
    from torch import Tensor

    from curvcal.calibration.analysis import CalibrationAnalysis


PROBS_REMEDY = "pass --input-kind probs if they are probabilities"


def probabilities_as_logits(source: str, remedy: str = PROBS_REMEDY) -> str:
    """The warning for scores read as logits that look like probabilities."""
    return (
        f"{source}: every score is non-negative and every row sums to 1, so these look like "
        f"probabilities, but they are read as logits (softmax is applied again); {remedy}"
    )


#: missing classes named one by one up to this many
_MISSING_SHOWN = 8


def missing_classes(labels: Tensor, n_classes: int, source: str) -> str | None:
    """The warning for labels that hold only some of the model's ``n_classes`` classes
    (``None`` when every class occurs, or for K = 1, which has its own warning): how many are
    missing and which. Class-wise metrics and per-class maps have nothing of those classes, and
    the calibration measured says nothing about rows of them."""
    if n_classes < 2 or not labels.numel():
        return None
    present = set(labels.unique().tolist())
    missing = [k for k in range(n_classes) if k not in present]
    if not missing:
        return None
    shown = ", ".join(str(k) for k in missing[:_MISSING_SHOWN])
    if len(missing) > _MISSING_SHOWN:
        shown += f", ... and {len(missing) - _MISSING_SHOWN} more"
    return (
        f"{source}: the labels hold {n_classes - len(missing)} of the model's {n_classes} "
        f"classes ({len(missing)} missing: {shown}); the calibration measured here says nothing "
        "about samples of the missing classes"
    )


#: Stages whose map is piecewise constant, fitted to label frequencies: 0 where a bin or step
#: of the fit split held no row of a class.
_STEP_MAPS = ("histogram", "histogram_ovr", "isotonic", "isotonic_ovr")


def analysis_warnings(
    analysis: CalibrationAnalysis,
    data_subset: Mapping[str, Any] | None = None,
    subset_named: str | None = None,
) -> list[str]:
    """A fitted temperature stopped at an end of its bracket (the optimum may lie beyond it,
    so the map is not the fit it claims to be), any infinite NLL (a true class given
    probability 0: by rounded probabilities, or by a binning or isotonic map where its fit
    split had no row of that class), and a ``max_samples`` subset of the data
    (``data_subset``, :attr:`LoadedData.subset <curvcal.load.datasets.loaded_data.LoadedData.subset>`)
    that the validation split then divides again (named ``subset_named``, default the
    ``max_samples`` setting as messages name settings now)."""
    messages: list[str] = []
    shrunk = _subset_shrinks_split(analysis, data_subset, subset_named)
    if shrunk is not None:
        messages.append(shrunk)
    ts, focal = analysis.fits.ts, analysis.fits.focal_ts
    if ts is not None and ts.at_bracket_end:
        messages.append(_bracket_warning("temperature scaling", ts.temperature, ts.bracket))
    if focal is not None:
        chosen = next(p for p in focal.profile if p.gamma == focal.gamma)
        if chosen.at_bracket_end:
            messages.append(
                _bracket_warning(
                    f"focal temperature scaling (γ = {focal.gamma:g})",
                    focal.temperature,
                    focal.bracket,
                )
            )
    for stage, metrics in analysis.evaluation.present():
        if math.isinf(metrics.nll) and stage in _STEP_MAPS:
            # these maps give 0 by design where the fit split had no row of a class: the
            # scores need not hold a single rounded probability
            messages.append(
                f"NLL of the {stage} stage on the evaluation split is infinite: the map gives "
                "some sample's true class probability 0 (a bin or step where the fit split had "
                "no row of that class); NLL cannot rank it"
            )
        elif math.isinf(metrics.nll):
            messages.append(
                f"NLL of the {stage} stage on the evaluation split is infinite: some sample's "
                "true class has probability 0 (rounded or clipped probabilities?); NLL and "
                "any fit by NLL cannot be trusted"
            )
    fits = analysis.fits
    for linear in (fits.vector, fits.matrix, fits.dirichlet, fits.dirichlet_l2):
        if linear is not None and not linear.converged:
            messages.append(
                f"{linear.method} scaling did not converge in {linear.iterations} L-BFGS "
                f"iterations (max |gradient| {linear.gradient_max:.2g}, wanted < "
                f"{linear.gradient_tol:g}): the fitted map is not the minimum of its NLL"
            )
    for linear in (fits.vector, fits.matrix, fits.dirichlet, fits.dirichlet_l2):
        if linear is not None and linear.no_minimum is not None:
            messages.append(
                f"{linear.method} scaling's NLL has no minimum on the fit split: "
                f"{linear.no_minimum}; the fitted map is where the gradient fell under the "
                "tolerance, and its confidence is arbitrary (fit on more, or more varied, rows)"
            )
    for binary in (analysis.fits.platt, analysis.fits.beta):
        if binary is not None and not binary.converged:
            messages.append(
                f"{'Platt scaling' if binary.method == 'platt' else 'beta calibration'} did "
                f"not converge in {binary.iterations} Newton "
                f"steps (max |gradient| {binary.gradient_max:.2g}, wanted < "
                f"{binary.gradient_tol:g}; separable fit data?): the fitted map is not the "
                "minimum of its objective"
            )
    for name, fit in (("temperature scaling", ts), ("focal temperature scaling", focal)):
        if fit is not None and math.isinf(fit.nll_before):
            messages.append(
                f"NLL on the fit split is infinite before {name}: some sample's true class "
                "has probability 0 (rounded or clipped probabilities?)"
            )
    return messages


def _bracket_warning(name: str, temperature: float, bracket: tuple[float, float]) -> str:
    return (
        f"{name} stopped at T = {temperature:g}, an end of its bracket "
        f"[{bracket[0]:g}, {bracket[1]:g}]: the best T may lie outside it, so the fitted map "
        "is not trustworthy (check the scores and their kind)"
    )


def _subset_shrinks_split(
    analysis: CalibrationAnalysis, data_subset: Mapping[str, Any] | None, named: str | None
) -> str | None:
    """The warning for a ``max_samples`` subset that also sizes the calibration split: the
    maps are fitted on, and every stage measured on, parts of the subset, not of the data."""
    split = analysis.split
    if data_subset is None or split.method != "val-split":
        return None
    return (
        f"{named or setting_name('max_samples')} {data_subset['max_samples']} (of the data's "
        f"{data_subset['of']} samples) also shrinks the calibration split: the maps are fitted "
        f"on {split.n_fit} samples and every stage is measured on {split.n_eval}"
    )
