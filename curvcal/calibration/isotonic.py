"""Isotonic regression (Zadrozny & Elkan 2002): the non-decreasing step fit of the targets.

On the fit split the scores x ∈ [0, 1] (top-label: the confidence c against 1[prediction = y];
one-vs-rest: each p_k against 1[y = k], see :mod:`.univariate`) are sorted and the
non-decreasing sequence ŷ minimising Σ_i w_i (t_i − ŷ_i)² is found by pool-adjacent-violators
(PAV), on the probability scale. Conventions are scikit-learn's ``IsotonicRegression``
(``increasing=True, out_of_bounds="clip"``), so the fitted maps agree with it to rounding:

* ties: scores within 1e-15 (float64's ``resolution``) of the first score of their group are
  one point, whose target is the mean of the group's targets and whose weight is its size;
  the point keeps that first score;
* the fitted points (x_i, ŷ_i) are kept except those whose ŷ equals both neighbours' (they
  change nothing);
* a new score is mapped by linear interpolation between the kept points, clipped to the first
  and last value outside them (``numpy.interp``).

No regulariser; values are not clipped away from 0 and 1 (a block of right predictions gives
confidence 1, and a wrong prediction there NLL ∞, as scikit-learn and netcal do). Pure: no
file I/O, no printing, no global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from curvcal.calibration.inputs import class_labels, log_probabilities
from curvcal.calibration.univariate import (
    ONE_VS_REST_ELEMENTS,
    apply_by_rows,
    by_columns,
    by_rows,
    check_classes,
    check_keys,
    check_unit,
    fit_nll,
    from_columns,
    one_vs_rest_log_probabilities,
    one_vs_rest_nll,
    rows_of,
    top_label_map,
)
from curvcal.errors import InputError

ISOTONIC_METHODS = ("isotonic", "isotonic-ovr")
#: Vectorised pooling passes before the linear-time stack pass of
#: :func:`pool_adjacent_violators`.
VECTOR_PASSES = 8
#: Scores closer than this to the first score of their tie group join it (scikit-learn's rule).
TIE_RESOLUTION = float(np.finfo(np.float64).resolution)


def tie_starts(x: np.ndarray) -> np.ndarray:
    """Boolean mask of the sorted scores ``x`` that open a tie group: x_j − x_first ≥
    :data:`TIE_RESOLUTION`, x_first the first score of the group before j.

    A gap of at least the resolution always opens a group. Between two such gaps (a run of
    smaller gaps) the groups are decided against their first score, in order; a run whose
    whole span is under the resolution is one group, so only runs that span more are walked,
    a group at a time: every score's first successor far enough from it is found by one
    vectorised binary search, and a run's groups follow those jumps from its first score."""
    start = np.zeros(len(x), dtype=bool)
    if len(x) == 0:
        return start
    gap = np.diff(x)
    start[0] = True
    start[1:] = gap >= TIE_RESOLUTION  # always a new group
    definite = np.flatnonzero(start)
    ends = np.append(definite[1:], len(x))  # each run of small gaps: [definite, end)
    wide = np.flatnonzero(x[ends - 1] - x[definite] >= TIE_RESOLUTION)
    if len(wide) == 0:
        return start
    # for every score i inside a wide run, the first j > i with x_j − x_i ≥ the resolution: a
    # binary search for x_i + r, then stepped to the difference's own test (the two may differ
    # in the last bit; x_j − x_i rises with j)
    first, end = definite[wide], ends[wide]
    length = end - first
    index = np.arange(int(length.sum())) + np.repeat(first - (np.cumsum(length) - length), length)
    base = x[index]
    following = np.maximum(np.searchsorted(x, base + TIE_RESOLUTION), index + 1)
    while True:
        back = (following > index + 1) & (x[following - 1] - base >= TIE_RESOLUTION)
        if not back.any():
            break
        following[back] -= 1
    while True:
        inside = np.minimum(following, len(x) - 1)
        ahead = (following < len(x)) & (x[inside] - base < TIE_RESOLUTION)
        if not ahead.any():
            break
        following[ahead] += 1
    jumps = following.tolist()  # jumps[offset + j − run_first]: the jump from score j
    opened: list[int] = []
    offset = 0
    for run_first, run_end in zip(first.tolist(), end.tolist(), strict=True):
        j = jumps[offset]
        while j < run_end:  # the groups of a run, each opened by the first score far enough
            opened.append(j)
            j = jumps[offset + j - run_first]
        offset += run_end - run_first
    start[opened] = True
    return start


def pool_adjacent_violators(targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing ŷ minimising Σ w_i (t_i − ŷ_i)² for ordered ``targets``.

    Pooling adjacent violators in any order reaches the same unique solution, and adjacent
    blocks of equal means always end with equal values (at the optimum the last point of a
    block is at most its value and the first point of the next at least its own), so they may
    be pooled too. First up to :data:`VECTOR_PASSES` vectorised passes each pool every maximal
    run of non-increasing adjacent blocks (cheap: most pooling is local, and the runs of equal
    targets of a one-vs-rest problem go in one pass); then one stack pass over the blocks left pools
    the rest in linear time (a cascade of pools reaching far back would otherwise take a pass
    per block).
    """
    weight: np.ndarray = weights.astype(np.float64)
    total: np.ndarray = targets.astype(np.float64) * weight
    size = np.ones(len(targets), dtype=np.int64)
    for _ in range(VECTOR_PASSES):
        if len(weight) < 2:
            break
        mean = total / weight
        violates = mean[:-1] >= mean[1:]
        if not violates.any():
            return np.repeat(mean, size)
        opens = np.ones(len(weight), dtype=bool)
        opens[1:] = ~violates
        block = np.cumsum(opens) - 1
        weight = np.bincount(block, weights=weight)
        total = np.bincount(block, weights=total)
        size = np.bincount(block, weights=size).astype(np.int64)
    stack_weight: list[float] = []
    stack_total: list[float] = []
    stack_size: list[int] = []
    for w, t, n in zip(weight.tolist(), total.tolist(), size.tolist(), strict=True):
        stack_weight.append(w)
        stack_total.append(t)
        stack_size.append(n)
        while (
            len(stack_weight) > 1
            and stack_total[-2] / stack_weight[-2] > stack_total[-1] / stack_weight[-1]
        ):
            w, t, n = stack_weight.pop(), stack_total.pop(), stack_size.pop()
            stack_weight[-1] += w
            stack_total[-1] += t
            stack_size[-1] += n
    return np.repeat(np.array(stack_total) / np.array(stack_weight), stack_size)


def isotonic_points(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kept fitted points (x_i, ŷ_i) of isotonic regression of ``target`` on ``x``."""
    order = np.lexsort((target, x))
    xs, ts = x[order], target[order].astype(np.float64)
    opens = tie_starts(xs)
    group = np.cumsum(opens) - 1
    count = np.bincount(group).astype(np.float64)
    mean = np.bincount(group, weights=ts) / count
    return _kept_points(xs[opens], pool_adjacent_violators(mean, count))


def one_vs_rest_points(
    columns: np.ndarray, labels: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The kept fitted points of every class's isotonic regression of 1[y = k] on p_k, for the
    K×N scores ``columns`` (overwritten: sorted in place) and the N ``labels``.

    The same fit as :func:`isotonic_points` on each column, with the work shared: all columns
    are sorted in one call, and a class's targets are never sorted: they are 1 only at the N_k
    samples of class k, so each tie group's count of them is found by locating those N_k
    scores among the sorted column (N searches over all classes, not K·N). The group means are
    sums of ones over counts, so they are bit for bit the per-column fit's."""
    n_classes, n = columns.shape
    by_class = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[by_class], np.arange(n_classes + 1))
    positives = [columns[k, by_class[starts[k] : starts[k + 1]]] for k in range(n_classes)]
    columns.sort(axis=1)
    points = []
    for xs, scores in zip(columns, positives, strict=True):
        opens = tie_starts(xs)
        first = np.flatnonzero(opens)
        count = np.diff(first, append=n).astype(np.float64)
        group = np.cumsum(opens)[np.searchsorted(xs, scores, side="right") - 1] - 1
        hits = np.bincount(group, minlength=len(first)).astype(np.float64)
        points.append(_kept_points(xs[first], pool_adjacent_violators(hits / count, count)))
    return points


def _kept_points(points_x: np.ndarray, points_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fitted points without those whose ŷ equals both neighbours' (they change nothing)."""
    keep = np.ones(len(points_y), dtype=bool)
    keep[1:-1] = (points_y[1:-1] != points_y[:-2]) | (points_y[1:-1] != points_y[2:])
    return points_x[keep], points_y[keep]


@dataclass(frozen=True)
class IsotonicMap:
    """Fitted isotonic regression: ``method`` ``isotonic`` (top-label: one row of ``x`` and
    ``y``) or ``isotonic-ovr`` (one row per class), ``n_classes`` K; each row's points are
    interpolated linearly, clipped outside."""

    method: str
    n_classes: int
    x: tuple[tuple[float, ...], ...]
    y: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        _check_map(self.to_dict(), "calibrator")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: ``{"method", "n_classes", "x", "y"}`` (lists of lists of numbers,
        one list per map)."""
        return {
            "method": self.method,
            "n_classes": self.n_classes,
            "x": [list(row) for row in self.x],
            "y": [list(row) for row in self.y],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibrator") -> IsotonicMap:
        """Rebuild from :meth:`to_dict` output; every fault is an :class:`InputError` naming
        ``source``."""
        xs, ys = _check_map(data, source)
        return cls(
            data["method"],
            data["n_classes"],
            tuple(tuple(row.tolist()) for row in xs),
            tuple(tuple(row.tolist()) for row in ys),
        )

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities of N×K ``scores`` after the map."""
        return apply_by_rows(
            scores, kind, source, self.method, self.n_classes, self._map_rows, self._chunk
        )

    @property
    def _chunk(self) -> int | None:
        """Entries per row chunk: larger for one-vs-rest (one NumPy call per class and chunk)."""
        return ONE_VS_REST_ELEMENTS if self.method == "isotonic-ovr" else None

    @cached_property
    def _points(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Each map's (x, y) as float64 arrays, made once (not at every chunk)."""
        return tuple(
            (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
            for x, y in zip(self.x, self.y, strict=True)
        )

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        points = self._points
        if self.method == "isotonic":
            return top_label_map(logp, lambda c: np.interp(c, *points[0]))
        return one_vs_rest_log_probabilities(self._values(logp))

    def _values(self, logp: torch.Tensor) -> torch.Tensor:
        """N×K f_k(p_k) of a one-vs-rest map (before the renormalisation)."""
        columns = by_columns(logp)
        for column, (px, py) in zip(columns, self._points, strict=True):
            column[:] = np.interp(column, px, py)
        return from_columns(columns)

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        """float64 calibrated probabilities of N×K ``scores``."""
        return torch.exp(self.apply(scores, kind, source))


@dataclass(frozen=True)
class IsotonicFit:
    """Isotonic regression fitted on one split: ``points`` kept per map, NLL before/after on
    the fit split (in-sample)."""

    method: str
    points: tuple[int, ...]
    n_parameters: int
    nll_before: float
    nll_after: float
    n_samples: int
    calibrator: IsotonicMap

    def to_dict(self) -> dict[str, Any]:
        """The fit's record without its parameters (they are in the saved calibrator)."""
        return {key: getattr(self, key) for key in self.__dataclass_fields__ if key != "calibrator"}


def fit_isotonic(
    scores: Any,
    labels: Any,
    method: str = "isotonic",
    kind: str = "logits",
    source: str = "scores",
    labels_source: str = "labels",
) -> IsotonicFit:
    """Fit top-label (``method="isotonic"``) or one-vs-rest (``"isotonic-ovr"``) isotonic
    regression on (``scores``, ``labels``)."""
    if method not in ISOTONIC_METHODS:
        raise InputError("--method", f"unknown isotonic map {method!r}", "isotonic or -ovr")
    logp = log_probabilities(scores, kind, source)
    n, k = logp.shape
    check_classes(k, f"{method} regression", source)
    y = class_labels(labels, n, k, labels_source)
    if method == "isotonic":
        top = logp.argmax(dim=1)
        log_c = logp.gather(1, top[:, None])[:, 0]
        confidence = torch.exp(log_c).numpy()
        fitted_points = [isotonic_points(confidence, (top == y).numpy().astype(np.float64))]
    else:
        fitted_points = one_vs_rest_points(by_columns(logp), y.numpy())
    fitted_x = [tuple(px.tolist()) for px, _ in fitted_points]
    fitted_y = [tuple(py.tolist()) for _, py in fitted_points]
    fitted = IsotonicMap(method, k, tuple(fitted_x), tuple(fitted_y))
    points = tuple(len(row) for row in fitted_x)
    return IsotonicFit(
        method=method,
        points=points,
        n_parameters=2 * sum(points),
        nll_before=fit_nll(logp, y),
        nll_after=fit_nll(by_rows(logp, fitted._map_rows), y)
        if method == "isotonic"
        else one_vs_rest_nll(logp, y, fitted._values, ONE_VS_REST_ELEMENTS),
        n_samples=n,
        calibrator=fitted,
    )


def _check_map(data: Any, source: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    check_keys(data, ("method", "n_classes", "x", "y"), source)
    method, k = data["method"], data["n_classes"]
    if method not in ISOTONIC_METHODS:
        raise InputError(source, f"unknown method {method!r}", " or ".join(ISOTONIC_METHODS))
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise InputError(source, f"n_classes must be a whole number >= 2, got {k!r}")
    xs = rows_of(data["x"], source, "x")
    ys = rows_of(data["y"], source, "y")
    rows = 1 if method == "isotonic" else k
    if len(xs) != rows or len(ys) != rows:
        raise InputError(
            source,
            f"{method} with {k} classes needs {rows} row(s) of x and y, got {len(xs)} and "
            f"{len(ys)}",
        )
    for row_x, row_y in zip(xs, ys, strict=True):
        if len(row_x) != len(row_y):
            raise InputError(source, "every row needs as many x as y")
        if not (np.diff(row_x) > 0).all() or not (np.diff(row_y) >= 0).all():
            raise InputError(source, "x must rise strictly and y must not fall")
        check_unit(row_x, source, "x")
        check_unit(row_y, source, "y")
    return xs, ys
