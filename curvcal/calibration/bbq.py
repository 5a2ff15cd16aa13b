"""Bayesian binning into quantiles (BBQ; Naeini, Cooper & Hauskrecht, AAAI 2015): histogram
binning averaged over many equal-mass binnings, each weighted by its marginal likelihood.

On the fit split the top-label confidences c_i and targets t_i = 1[prediction_i = y_i] (see
:mod:`.univariate`) are binned by every candidate model M: an equal-mass binning of c into B
bins (e_0 = 0 < e_1 < … < e_B = 1, bins (e_b, e_{b+1}]). Bin b holds n_b fit samples, k_b of
them right, and has the Beta prior Beta(α_b, β_b), α_b = (N'/B)·m_b, β_b = (N'/B)·(1 − m_b),
m_b = (e_b + e_{b+1})/2 its middle, N' = 2 (the paper's equivalent sample size; the BDeu
score). Then

    log P(D | M) = Σ_b [ lnΓ(N'/B) − lnΓ(n_b + N'/B) + lnΓ(k_b + α_b) − lnΓ(α_b)
                        + lnΓ(n_b − k_b + β_b) − lnΓ(β_b) ],
    θ_{M,b}      = (k_b + α_b) / (n_b + N'/B)           (the bin's posterior mean),
    w_M          = exp(log P(D | M) − s*) / Σ_M' exp(log P(D | M') − s*),   s* = max_M log P(D | M),
    f(c)         = Σ_M w_M · θ_{M, b_M(c)},

with a uniform prior over the models, and the top class gets f(c) by the top-label rule
(:func:`~curvcal.calibration.univariate.top_label_map`). Conventions:

* **models**: B from B_min = max(1, ⌊N^{1/3}/10⌋) to B_max = min(⌈N/5⌉, ⌈10·N^{1/3}⌉) (the
  paper's range with C = 10, as netcal and the authors' code; computed in whole numbers);
  binnings that ties make identical are one model (each distinct binning once in the uniform
  prior).
* **edges**: the equal-mass cuts of histogram binning and AdaECE
  (:func:`~curvcal.calibration.binning.sorted_equal_mass_edges`: at round(i·N/B), each moved to
  the end of its tie group, inner edges halfway between neighbouring scores), outer edges 0
  and 1. Equal confidences never straddle a bin and no bin is empty on the fit split.
* **bin value**: the posterior mean, never exactly 0 or 1 (torch-uncertainty's BBQScaler
  takes the frequency k_b/n_b, which is 0 or 1 in a pure bin, with NLL ∞).
* **weights**: every model counts (no elbow rule: netcal keeps only the models the paper's
  elbow rule picks, torch-uncertainty drops weights under 1e-9; on the peer tests' data the
  elbow rule keeps 4 to 7 models and moves f by at most 5e-6). A model whose weight is under
  float64's machine epsilon 2^-52 is left out of the saved map and the others' weights are
  renormalised: f moves by at most the dropped weight, under (number of models)·2^-52 ≈ 6e-14
  at N = 20,000, and the saved map holds a dozen models instead of hundreds.

The averaged map is piecewise constant on the union of all models' edges; :class:`BBQMap`
evaluates it there once, so a new score costs one bin lookup. Pure: no file I/O, no printing,
no global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from scipy.special import gammaln

from curvcal.calibration.binning import (
    bin_cells,
    bin_of,
    cell_bin_of,
    check_bin_rows,
    tie_group_ends,
)
from curvcal.calibration.inputs import INPUTS, InputNames
from curvcal.calibration.isotonic import _packed_pairs
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import array, choice
from curvcal.calibration.univariate import (
    RowMap,
    fit_split,
    row_fields,
    top_label_map,
    top_label_targets,
)
from curvcal.errors import InputError, SettingsError

BBQ_METHOD = "bbq"
#: N', the equivalent sample size of the BDeu prior (the paper's value).
PRIOR_STRENGTH = 2.0
#: Models whose weight is under this (float64's machine epsilon) are not saved.
SMALLEST_WEIGHT = 2.0**-52
#: How far the saved weights may sum from 1.
WEIGHT_SUM_TOLERANCE = 1e-9


def bin_counts(n_samples: int) -> tuple[int, ...]:
    """The numbers of bins B of the candidate models for ``n_samples`` fit samples N:
    max(1, ⌊N^{1/3}/10⌋) to min(⌈N/5⌉, ⌈10·N^{1/3}⌉), in whole numbers (⌊N^{1/3}/10⌋ is the
    largest m with 1000·m³ ≤ N, ⌈10·N^{1/3}⌉ the smallest m with m³ ≥ 1000·N), so a perfect
    cube is not moved across an integer by the rounding of a floating cube root."""
    low = max(1, _largest_cube_root(n_samples // 1000))
    top = _largest_cube_root(1000 * n_samples)
    top += top**3 < 1000 * n_samples
    high = max(low, min(-(-n_samples // 5), top))
    return tuple(range(low, high + 1))


def _largest_cube_root(value: int) -> int:
    """The largest whole m ≥ 0 with m³ ≤ ``value`` (≥ 0)."""
    m = round(value ** (1.0 / 3.0))
    while m**3 > value:
        m -= 1
    while (m + 1) ** 3 <= value:
        m += 1
    return m


def bin_evidence(
    count: np.ndarray,
    hits: np.ndarray,
    middle: np.ndarray,
    n_bins: np.ndarray,
    prior_strength: float = PRIOR_STRENGTH,
) -> tuple[np.ndarray, np.ndarray]:
    """(log evidence, posterior mean) of every bin: its ``count`` n_b and ``hits`` k_b, its
    ``middle`` m_b and the number of bins ``n_bins`` B of its model, under the BDeu Beta prior
    of the module docstring (a = N'/B, α = a·m, β = a·(1 − m)). A model's log P(D | M) is the
    sum over its bins."""
    a = prior_strength / n_bins
    alpha, beta = a * middle, a * (1.0 - middle)
    log_evidence = (
        gammaln(a)
        - gammaln(count + a)
        + gammaln(hits + alpha)
        - gammaln(alpha)
        + gammaln(count - hits + beta)
        - gammaln(beta)
    )
    return log_evidence, (hits + alpha) / (count + a)


def equal_mass_cuts(
    ranked: np.ndarray, counts: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model of each inner edge, the inner edges, the cuts) of the equal-mass binnings of the
    sorted scores ``ranked`` into each of ``counts`` bins, all at once, model by model and
    rising within a model: the edges of
    :func:`~curvcal.calibration.binning.sorted_equal_mass_edges` (cuts at round(i·N/B) moved
    to the end of their tie group, repeated cuts dropped, each edge halfway between the scores
    either side, or the lower one where halfway rounds onto the upper, edges at 0 dropped). An
    edge's cut is the number of sorted scores at or below it (they all lie below the next
    score up)."""
    n = len(ranked)
    group_end = tie_group_ends(ranked)
    sizes = np.asarray(counts, dtype=np.int64)
    model = np.repeat(np.arange(len(sizes)), sizes - 1)
    first = np.repeat(np.cumsum(sizes - 1) - (sizes - 1), sizes - 1)
    i = np.arange(len(model)) - first + 1  # i = 1 .. B − 1 within each model
    targets = np.floor(i.astype(np.float64) * n / sizes[model] + 0.5)
    last_before = np.clip(targets.astype(np.int64) - 1, 0, n - 1)
    cuts = np.where(targets > 0, group_end[last_before], 0)
    inside = (cuts > 0) & (cuts < n)
    # by model, then cut: already ascending (the cuts rise with i), so a repeat follows its twin
    keys = model[inside] * (n + 1) + cuts[inside]
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys
    model, boundary = keys // (n + 1), keys % (n + 1)
    below, above = ranked[boundary - 1], ranked[boundary]
    inner = below + (above - below) / 2
    inner = np.where(inner < above, inner, below)
    positive = inner > 0
    return model[positive], inner[positive], boundary[positive]


def fit_models(
    confidence: np.ndarray,
    target: np.ndarray,
    counts: Sequence[int] | None = None,
    prior_strength: float = PRIOR_STRENGTH,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """(edges per model, posterior means per model, normalised weights, log marginal
    likelihoods) of BBQ on 1-D scores ``confidence`` ∈ [0, 1] and 0/1 ``target``, over the
    equal-mass binnings with ``counts`` bins (default :func:`bin_counts`); binnings made
    identical by ties are fitted once. Every model is returned, weight 0 included. The bins of
    all models are scored in one vectorised pass. Scores in [0, 2) with 0/1 targets are sorted
    as one integer array (:func:`~curvcal.calibration.isotonic.isotonic_points`'s packing):
    the same sorted scores, and the same hit counts at every cut, each the end of a tie
    group."""
    packed = _packed_pairs(confidence, target)
    if packed is None:
        order = np.argsort(confidence, kind="stable")
        ranked, ranked_target = confidence[order], target[order]
    else:
        packed.sort()
        ranked, ranked_target = (packed >> 1).view(np.float64), packed & 1
    hits_before = np.concatenate([[0.0], np.cumsum(ranked_target)])
    n = len(ranked)
    tried = bin_counts(n) if counts is None else tuple(counts)
    model, inner, cut = equal_mass_cuts(ranked, tried)
    offsets = np.searchsorted(model, np.arange(len(tried) + 1))
    seen: set[bytes] = set()
    distinct = []  # the first model of each distinct binning
    for j in range(len(tried)):
        key = inner[offsets[j] : offsets[j + 1]].tobytes()
        if key not in seen:
            seen.add(key)
            distinct.append(j)
    picked = np.asarray(distinct)
    inner_of = [inner[offsets[j] : offsets[j + 1]] for j in picked]
    edges = [np.concatenate([[0.0], row, [1.0]]) for row in inner_of]
    n_bins = np.asarray([len(row) - 1 for row in edges])
    lower = np.concatenate([row[:-1] for row in edges])
    upper = np.concatenate([row[1:] for row in edges])
    # bins (e_b, e_{b+1}]: the scores <= each inner edge (its cut) end the bin below it; the
    # first bin holds the scores equal to 0 too, and the last every score above its lower edge
    cut_of = [np.concatenate([[0], cut[offsets[j] : offsets[j + 1]], [n]]) for j in picked]
    starts = np.concatenate([row[:-1] for row in cut_of])
    ends = np.concatenate([row[1:] for row in cut_of])
    count = (ends - starts).astype(np.float64)
    hits = hits_before[ends] - hits_before[starts]
    first_bin = np.concatenate([[0], np.cumsum(n_bins)[:-1]])
    per_bin, values = bin_evidence(
        count, hits, (lower + upper) / 2, np.repeat(n_bins, n_bins), prior_strength
    )
    log_evidence = np.add.reduceat(per_bin, first_bin)
    weights = np.exp(log_evidence - log_evidence.max())
    return edges, np.split(values, first_bin[1:]), weights / weights.sum(), log_evidence


def kept_models(
    edges: Sequence[np.ndarray], values: Sequence[np.ndarray], weights: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """(edges, posterior means, weights) of the models :func:`fit_models` returned whose
    weight is at least :data:`SMALLEST_WEIGHT`, the weights renormalised to sum to 1: the
    models a :class:`BBQMap` saves."""
    kept = np.flatnonzero(weights >= SMALLEST_WEIGHT)
    rows = kept.tolist()
    return [edges[i] for i in rows], [values[i] for i in rows], weights[kept] / weights[kept].sum()


def merged_map(
    edges: Sequence[np.ndarray], values: Sequence[np.ndarray], weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(edges, values) of the piecewise-constant f(c) = Σ_M w_M θ_{M, b_M(c)} on the union of
    the models' edges: each merged bin's value is the sum, in model order, at its upper edge
    (which every score of the merged bin shares its bins with)."""
    union = np.unique(np.concatenate(list(edges)))
    upper = union[1:]
    total = np.zeros(len(upper), dtype=np.float64)
    for row_edges, row_values, weight in zip(edges, values, weights, strict=True):
        total += weight * row_values[bin_of(upper, row_edges)]
    return union, total


#: The saved body: per model one row of bin edges, one of posterior means and one weight.
FIELDS = (
    choice("method", (BBQ_METHOD,)),
    *row_fields("edges", "values"),
    array("weights", ("models",), 0.0, 1.0),
)


@dataclass(frozen=True)
class BBQMap(RowMap):
    """Fitted BBQ on the top-label confidence of ``n_classes`` K classes: per model its
    ``edges`` and posterior means ``values``, and the normalised ``weights`` (models under
    :data:`SMALLEST_WEIGHT` left out)."""

    FIELDS = FIELDS

    n_classes: int
    edges: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]
    weights: tuple[float, ...]
    method: str = BBQ_METHOD

    @classmethod
    def check_rows(cls, fields: dict[str, Any], source: str) -> None:
        """One row of edges and values and one weight per model (rows by
        :func:`check_bin_rows`), the weights summing to 1."""
        edges, values, weights = fields["edges"], fields["values"], fields["weights"]
        if not len(edges) == len(values) == len(weights):
            raise InputError(
                source,
                f"needs one row of edges, one of values and one weight per model, got "
                f"{len(edges)}, {len(values)} and {len(weights)}",
            )
        check_bin_rows(edges, values, source)
        if abs(float(weights.sum()) - 1.0) > WEIGHT_SUM_TOLERANCE:
            raise InputError(source, "weights must be >= 0 and sum to 1")

    @cached_property
    def _merged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(edges, values, cell table) of the averaged map, made once."""
        edges, values = merged_map(
            [np.asarray(row, dtype=np.float64) for row in self.edges],
            [np.asarray(row, dtype=np.float64) for row in self.values],
            np.asarray(self.weights, dtype=np.float64),
        )
        return edges, values, bin_cells(edges)

    def confidence(self, c: np.ndarray) -> np.ndarray:
        """f(c) of float64 confidences ``c`` (any shape)."""
        edges, values, cells = self._merged
        return values[cell_bin_of(c, edges, cells)]

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        return top_label_map(logp, self.confidence)


@dataclass(frozen=True)
class BBQFit(MapFit[BBQMap]):
    """BBQ fitted on one split: the bin counts tried (``min_bins`` to ``max_bins``),
    ``n_models`` distinct binnings scored, ``models_kept`` with a weight of at least
    :data:`SMALLEST_WEIGHT` (the saved ones), the largest
    weight, ``n_parameters`` (the kept models' bin values and inner edges, and their weights),
    NLL before/after on the fit split (in-sample)."""

    method: str
    min_bins: int
    max_bins: int
    n_models: int
    models_kept: int
    largest_weight: float
    n_parameters: int


def fit_bbq(
    scores: Any,
    labels: Any,
    method: str = BBQ_METHOD,
    kind: str = "logits",
    names: InputNames = INPUTS,
    counts: Sequence[int] | None = None,
) -> BBQFit:
    """Fit BBQ to the top-label confidence of (``scores``, ``labels``) over the equal-mass
    binnings with ``counts`` bins (default: the paper's range, :func:`bin_counts`)."""
    if method != BBQ_METHOD:
        raise SettingsError("method", f"unknown BBQ map {method!r}", BBQ_METHOD)
    logp, y = fit_split(scores, labels, kind, names, "BBQ")
    n, k = logp.shape
    if n < 1:
        raise InputError(names.scores, "BBQ needs at least one fit sample")
    confidence, correct = top_label_targets(logp, y)
    tried = bin_counts(n) if counts is None else tuple(counts)
    if not tried or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in tried):
        raise InputError("counts", f"bins must be whole numbers >= 1, got {tried!r}")
    edges, values, weights, _ = fit_models(confidence, correct, tried)
    kept_edges, kept_values, kept_weights = kept_models(edges, values, weights)
    fitted = BBQMap(
        k,
        tuple(tuple(row.tolist()) for row in kept_edges),
        tuple(tuple(row.tolist()) for row in kept_values),
        tuple(kept_weights.tolist()),
    )
    return fitted.fit_record(
        BBQFit,
        logp,
        y,
        method=method,
        min_bins=min(tried),
        max_bins=max(tried),
        n_models=len(weights),
        models_kept=len(kept_weights),
        largest_weight=float(weights.max()),
        n_parameters=int(sum(2 * len(row) for row in kept_values)),
    )
