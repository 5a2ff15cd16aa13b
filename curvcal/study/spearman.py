"""Spearman's rank correlation with an exact permutation p-value for small samples.

ρ is Pearson's correlation of the average ranks (ties share the mean of the ranks they span),
as ``scipy.stats.spearmanr`` computes it:

    ρ = Σ_i (r_i − r̄)(s_i − s̄) / sqrt(Σ_i (r_i − r̄)² · Σ_i (s_i − s̄)²).

For n ≤ :data:`EXACT_MAX_N` the two-sided p-value is exact: under the null hypothesis of no
association every one of the n! pairings of the y-ranks with the x-ranks is equally likely, and

    p = min(1, 2 · min(P(ρ_π ≥ ρ), P(ρ_π ≤ ρ)))

over all pairings π (the convention of ``scipy.stats.permutation_test`` with
``permutation_type='pairings'``; ties kept in the ranks). With n checkpoints the smallest
possible p is 2/n! (1/3 at n = 3): a p-value below that is impossible. Above
:data:`EXACT_MAX_N` the p-value is ``spearmanr``'s t approximation with n − 2 degrees of
freedom, and said so.

Pure: no file I/O, no printing, no random draws.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Largest n whose p-value is exact (10! = 3 628 800 pairings, enumerated in blocks).
EXACT_MAX_N = 10
#: How the p-value was formed, by :attr:`SpearmanResult.p_method`.
EXACT = "exact permutation"
T_APPROXIMATION = "t approximation"
# Statistics within this relative distance of the observed ρ count as equal to it, so that
# rounding in the sums never moves a tied pairing across (scipy's permutation_test does the same).
_RELATIVE_TIE = 1e-12


@dataclass(frozen=True)
class SpearmanResult:
    """ρ, its two-sided p-value and how the p-value was formed (:data:`EXACT` or
    :data:`T_APPROXIMATION`)."""

    rho: float
    p_value: float
    p_method: str


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``values``, ties given the mean of the ranks they span."""
    from scipy.stats import rankdata

    return np.asarray(rankdata(np.asarray(values, dtype=np.float64), method="average"))


def spearman(xs: Sequence[float], ys: Sequence[float]) -> SpearmanResult:
    """Spearman's ρ of two equally long samples (n ≥ 3, neither constant) and its p-value."""
    n = len(xs)
    if n != len(ys) or n < 3:
        raise ValueError("spearman needs two samples of the same length n ≥ 3")
    rx, ry = average_ranks(xs), average_ranks(ys)
    cx, cy = rx - rx.mean(), ry - ry.mean()
    scale = math.sqrt(float(cx @ cx) * float(cy @ cy))
    if scale == 0.0:
        raise ValueError("spearman needs two samples that are not constant")
    rho = float(cx @ cy) / scale
    if n <= EXACT_MAX_N:
        return SpearmanResult(rho, _exact_p(cx, cy, float(cx @ cy)), EXACT)
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result: Any = spearmanr(xs, ys)
    return SpearmanResult(rho, float(result.pvalue), T_APPROXIMATION)


def _exact_p(cx: np.ndarray, cy: np.ndarray, observed: float) -> float:
    """Two-sided p of the statistic Σ cx_i·cy_π(i) over all n! pairings π."""
    n = len(cx)
    tie = _RELATIVE_TIE * max(abs(observed), float(np.abs(cx) @ np.abs(cy)))
    at_least = at_most = total = 0
    rest = _permutations(n - 1)
    for first in range(n):  # blocks of (n − 1)! pairings with π(0) = first
        others = np.delete(np.arange(n), first)
        statistics = cx[0] * cy[first] + cy[others[rest]] @ cx[1:]
        at_least += int(np.count_nonzero(statistics >= observed - tie))
        at_most += int(np.count_nonzero(statistics <= observed + tie))
        total += len(statistics)
    return min(1.0, 2.0 * min(at_least, at_most) / total)


@functools.lru_cache(maxsize=2)
def _permutations(k: int) -> np.ndarray:
    """All k! orderings of 0..k−1, one per row (read-only: shared between calls)."""
    table = np.array(list(itertools.permutations(range(k))), dtype=np.intp).reshape(-1, k)
    table.flags.writeable = False
    return table
