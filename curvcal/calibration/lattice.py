"""The minimum of a binned calibration error over a lattice of ln T, without visiting it all.

Lattice: u_j = ln T_min + j·h for j = 0, 1, ... while u_j <= ln T_max, plus ln T_max itself
when it is not on the lattice (h = the grid step). The minimum is the lowest objective value;
among exactly equal values the point closest to T = 1 (smallest |u|), then the smaller u.

Bound. For any binning, ECE = Σ_b |Σ_{i∈b} (y_i - c_i)|/N >= |Σ_i (y_i - c_i)|/N =
|accuracy - mean confidence| (triangle inequality), and the top-label confidence of
softmax(z/T) (and, checked numerically for φ_γ, of the focal map) decreases as T grows, so this
lower bound grows monotonically on each side of the point where the mean confidence crosses
the accuracy. The search finds that crossing by safeguarded secant steps on the lattice, then
walks outwards on both sides until the bound exceeds the best value found: every point left
out has a bound, hence a value, above the minimum. Each evaluation is one pass over the data.
The monotonicity is checked on every evaluated point; the caller falls back to the whole
lattice when it fails.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatticePoint:
    """The objective and the mean confidence at one lattice point."""

    value: float
    mean_confidence: float


def lattice(low: float, high: float, step: float) -> np.ndarray:
    """The points u_j = low + j·step <= high, and ``high`` (ascending, float64)."""
    count = math.floor((high - low) / step + 1e-9)
    points = low + step * np.arange(count + 1, dtype=np.float64)
    if high - points[-1] > 1e-9 * step:
        points = np.append(points, high)
    return points


def pick(points: np.ndarray, values: dict[int, float]) -> int:
    """The index with the lowest value; ties to the smallest |u|, then the smaller u."""
    best = min(values.values())
    tied = [j for j, v in values.items() if v <= best]
    return min(tied, key=lambda j: (abs(points[j]), points[j]))


@dataclass(frozen=True)
class LatticeSearch:
    """Every evaluated point, the crossing index and whether monotonicity held."""

    evaluated: dict[int, LatticePoint]
    crossing: int
    monotone: bool


def search(
    size: int,
    evaluate: Callable[[int], LatticePoint],
    accuracy: float,
    start: int,
    tolerance: float,
) -> LatticeSearch:
    """Evaluate the lattice points 0..size-1 that can hold the minimum (module docstring).

    ``tolerance`` bounds the error of ``evaluate`` in both the value and the mean confidence
    (twice it is the margin of every comparison), so a point is dropped only when its bound
    exceeds the best value by more than that. ``start`` is the first point tried (a guess of
    the crossing: the previous γ's, say). ``crossing`` is the first index whose mean
    confidence is at most the accuracy (``size`` when there is none).
    """
    cache: dict[int, LatticePoint] = {}

    def at(j: int) -> LatticePoint:
        if j not in cache:
            cache[j] = evaluate(j)
        return cache[j]

    def excess(j: int) -> float:  # mean confidence - accuracy, decreasing in j
        return at(j).mean_confidence - accuracy

    lo, hi = -1, size  # excess(lo) > 0 >= excess(hi); -1 and size are virtual
    j = min(max(start, 0), size - 1)
    jump = 8
    previous: int | None = None
    width = size + 1
    while True:
        if excess(j) > 0:
            lo = j
        else:
            hi = j
        if hi - lo <= 1:
            break
        if lo >= 0 and hi < size:  # bracketed: regula falsi, bisection when it stalls
            share = excess(lo) / (excess(lo) - excess(hi))
            target = lo + round(share * (hi - lo))
            if 2 * (hi - lo) > width:
                target = (lo + hi) // 2
            width = hi - lo
        else:  # one side known: secant towards the other, with a growing least step
            going_up = lo >= 0
            secant = _secant(j, previous, excess)
            least = jump if secant is None else max(1, jump // 4)
            reach = j + least if going_up else j - least
            target = reach if secant is None else secant
            target = max(target, reach) if going_up else min(target, reach)
            jump *= 2
        previous = j
        j = min(max(target, lo + 1), hi - 1)
    crossing = hi
    best = min(point.value for point in cache.values())
    margin = 2 * tolerance
    for side in (range(crossing - 1, -1, -1), range(crossing, size)):
        for j in side:
            best = min(best, at(j).value)
            if abs(excess(j)) > best + margin:
                break  # the bound grows from here on: nothing further can be lower
    ordered = sorted(cache)
    means = [cache[j].mean_confidence for j in ordered]
    monotone = all(b <= a + margin for a, b in itertools.pairwise(means))
    return LatticeSearch(cache, crossing, monotone)


def _secant(j: int, previous: int | None, excess: Callable[[int], float]) -> int | None:
    """The lattice index where the line through the last two points reaches excess 0."""
    if previous is None or previous == j:
        return None
    slope = (excess(j) - excess(previous)) / (j - previous)
    if not slope < 0:
        return None
    return j + round(-excess(j) / slope)
