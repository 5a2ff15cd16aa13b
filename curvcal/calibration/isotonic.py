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

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from curvcal.calibration.inputs import INPUTS, InputNames
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import choice
from curvcal.calibration.univariate import (
    RowMap,
    by_columns,
    check_row_count,
    fit_split,
    float_rows,
    one_vs_rest_log_probabilities,
    row_fields,
    top_label_map,
    top_label_targets,
)
from curvcal.errors import InputError, SettingsError

ISOTONIC_METHODS = ("isotonic", "isotonic-ovr")
#: Vectorised pooling passes before the linear-time stack pass of
#: :func:`pool_adjacent_violators`.
VECTOR_PASSES = 8
#: Scores per block of classes fitted together by :func:`one_vs_rest_points`: bounds the int64
#: positions of their tie groups (8 MB) and the work arrays of their positives' points (at
#: 1,000,000 × 10, blocks of 2^22 scores took 1.9× the input's memory, 2^20 0.74×, one class
#: at a time 0.77×).
CLASS_BLOCK_SCORES = 1 << 20
#: Scores closer than this to the first score of their tie group join it (scikit-learn's rule).
TIE_RESOLUTION = float(np.finfo(np.float64).resolution)
#: Bit patterns of non-negative float64 values rise with the value, and every score below 2 has
#: one below this (a :class:`KnotTable`'s top cell holds every larger score).
_BITS_OF_TWO = int(np.float64(2.0).view(np.int64))
#: The bit pattern of +∞: every finite non-negative float64 value has a smaller one.
_BITS_OF_INFINITY = int(np.float64(np.inf).view(np.int64))


#: Sorted scores per block of the gap pass of :func:`sorted_tie_starts`: a block's gaps and
#: marks stay in the second-level cache while its runs' ends are found (at 50,000 × 1,000 the
#: pass took 0.09 s in blocks of 2^15, where gaps in blocks of 2^20 and then the runs' ends over
#: the whole array took 0.2–0.3 s).
GAP_BLOCK = 1 << 15
#: Runs followed together by :func:`sorted_tie_starts`; fewer are walked one at a time.
FRONTIER_RUNS = 32


def tie_starts(x: np.ndarray) -> np.ndarray:
    """Boolean mask of the sorted scores ``x`` that open a tie group: x_j − x_first ≥
    :data:`TIE_RESOLUTION`, x_first the first score of the group before j
    (:func:`sorted_tie_starts` of one row)."""
    return sorted_tie_starts(x.reshape(1, -1)).reshape(-1)


def sorted_tie_starts(rows: np.ndarray) -> np.ndarray:
    """Boolean mask over the C-contiguous 2-D ``rows`` (each sorted ascending, groups never
    spanning two rows) of the scores that open a tie group, as :func:`tie_starts` per row.

    A gap of at least the resolution always opens a group. Between two such gaps (a run of
    smaller gaps) the groups are decided against their first score, in order; a run whose
    whole span is under the resolution is one group, so only runs that span more are walked,
    a group at a time and every run of every row together: each step finds, for every run
    not yet done, the first score far enough from its current group's first score
    (exponential then binary search, on the difference's own test: x_j − x_f rises with j).
    The last few runs (fewer than :data:`FRONTIER_RUNS`, so a long run of many groups costs no
    step per group for all the others) are walked one by one."""
    n_rows, n = rows.shape
    x = rows.reshape(-1)
    start, first, end = _gap_starts(x, n)
    wide = x[end - 1] - x[first] >= TIE_RESOLUTION
    first, end = first[wide], end[wide]
    opened = []
    while len(first) >= FRONTIER_RUNS:
        first = _next_group(x, first, end)
        more = first < end
        first, end = first[more], end[more]
        opened.append(first)
    for run_first, run_end in zip(first.tolist(), end.tolist(), strict=True):
        opened.append(run_first + _walk_run(x[run_first:run_end]))
    if opened:
        start[np.concatenate(opened)] = True
    return start.reshape(n_rows, n)


def _gap_starts(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scores of ``x`` (rows of ``n`` sorted scores, end to end) after a gap of at least
    :data:`TIE_RESOLUTION` or first in their row (each opens a group), and the runs of smaller
    gaps, [first, end) of two or more scores each, ``first`` a score so marked, in one pass of
    :data:`GAP_BLOCK` scores at a time: the marks change between i and i + 1 at a run's first
    score (marked, then not) and before its end (not, then marked), alternately from the
    first score, which is marked."""
    start = np.empty(len(x), dtype=bool)
    if len(x) == 0:
        return start, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    start[0] = True
    gap = np.empty(min(GAP_BLOCK, len(x)))
    changes = [np.empty(0, dtype=np.int64)]
    for low in range(0, len(x) - 1, GAP_BLOCK):  # marks low + 1 .. high, changes low .. high − 1
        high = min(low + GAP_BLOCK, len(x) - 1)
        within = gap[: high - low]
        np.subtract(x[low + 1 : high + 1], x[low:high], out=within)
        np.greater_equal(within, TIE_RESOLUTION, out=start[low + 1 : high + 1])
        start[(low // n + 1) * n : high + 1 : n] = True  # each row's first score
        block = start[low : high + 1]
        change = np.flatnonzero(block[1:] != block[:-1])
        change += low
        changes.append(change)
    change = np.concatenate(changes)
    first, end = change[0::2], change[1::2] + 1
    if len(end) < len(first):  # the last run reaches the end
        end = np.append(end, len(x))
    return start, first, end


def _next_group(x: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For every run [first, end) of the sorted scores ``x``, the first j > first with x_j −
    x_first ≥ :data:`TIE_RESOLUTION` (``end`` where none): exponential steps from first, then
    bisection (the difference rises with j)."""
    base = x[first]
    low, high = first.copy(), end.copy()  # x_low − base < r; high past the run or far enough
    active = np.arange(len(first))
    step = 1
    while len(active):
        probe = first[active] + step
        within = probe < high[active]
        active, probe = active[within], probe[within]
        far = x[probe] - base[active] >= TIE_RESOLUTION
        high[active[far]] = probe[far]
        low[active[~far]] = probe[~far]
        active = active[~far]
        step *= 2
    active = np.flatnonzero(high - low > 1)
    while len(active):
        middle = (low[active] + high[active]) >> 1
        far = x[middle] - base[active] >= TIE_RESOLUTION
        high[active[far]] = middle[far]
        low[active[~far]] = middle[~far]
        active = active[high[active] - low[active] > 1]
    return high


def _walk_run(x: np.ndarray) -> np.ndarray:
    """The positions after 0 that open a tie group in one run of sorted scores ``x`` (its first
    score opens one): every score's first successor far enough from it by one vectorised
    binary search, then the groups follow those jumps from the first score."""
    # a binary search for x_i + r, then stepped to the difference's own test (the two may differ
    # in the last bit; x_j − x_i rises with j)
    index = np.arange(len(x))
    following = np.maximum(np.searchsorted(x, x + TIE_RESOLUTION), index + 1)
    while True:
        back = (following > index + 1) & (x[following - 1] - x >= TIE_RESOLUTION)
        if not back.any():
            break
        following[back] -= 1
    while True:
        inside = np.minimum(following, len(x) - 1)
        ahead = (following < len(x)) & (x[inside] - x < TIE_RESOLUTION)
        if not ahead.any():
            break
        following[ahead] += 1
    jumps = following.tolist()
    opened: list[int] = []
    j = jumps[0]
    while j < len(x):
        opened.append(j)
        j = jumps[j]
    return np.array(opened, dtype=np.int64)


def pool_adjacent_violators(
    targets: np.ndarray, weights: np.ndarray, segment_starts: np.ndarray | None = None
) -> np.ndarray:
    """The non-decreasing ŷ minimising Σ w_i (t_i − ŷ_i)² for ordered ``targets``, solved
    apart on each segment (``segment_starts``: the entries that open one; the first always
    does; none given: one segment), never pooling across a segment's start.

    Pooling adjacent violators in any order reaches the same unique solution, and adjacent
    blocks of equal means always end with equal values (at the optimum the last point of a
    block is at most its value and the first point of the next at least its own), so they may
    be pooled too. First up to :data:`VECTOR_PASSES` vectorised passes each pool every maximal
    run of non-increasing adjacent blocks of a segment, every segment at once (cheap: most
    pooling is local, and the runs of equal targets of a one-vs-rest problem go in one pass);
    then one stack pass over the blocks left of each segment that still has a violator pools
    the rest in linear time (a cascade of pools reaching far back would otherwise take a pass
    per block). Each segment gets the same sums in the same order as alone (a pass that pools
    nothing in it adds 0 to each block), so the same values bit for bit.
    """
    weight: np.ndarray = weights.astype(np.float64)
    total: np.ndarray = targets.astype(np.float64) * weight
    size = np.ones(len(targets), dtype=np.int64)
    # apart[i]: blocks i and i + 1 are in different segments
    apart = np.zeros(max(len(targets) - 1, 0), dtype=bool)
    if segment_starts is not None:
        apart |= np.asarray(segment_starts, dtype=bool)[1:]
    for _ in range(VECTOR_PASSES):
        if len(weight) < 2:
            break
        mean = total / weight
        violates = mean[:-1] >= mean[1:]
        violates &= ~apart
        if not violates.any():
            return np.repeat(mean, size)
        opens = np.ones(len(weight), dtype=bool)
        opens[1:] = ~violates
        block = np.cumsum(opens) - 1
        weight = np.bincount(block, weights=weight)
        total = np.bincount(block, weights=total)
        size = np.bincount(block, weights=size).astype(np.int64)
        apart = apart[opens[1:]]
    mean = total / weight
    strict = np.flatnonzero((mean[:-1] > mean[1:]) & ~apart)  # the stack pass pools only these
    if not len(strict):
        return np.repeat(mean, size)
    segment_first = np.flatnonzero(np.concatenate([[True], apart]))
    segment_end = np.append(segment_first[1:], len(weight))
    means, sizes = [], []
    done = 0
    for segment in np.unique(np.searchsorted(segment_first, strict, side="right") - 1).tolist():
        low, high = int(segment_first[segment]), int(segment_end[segment])
        means.append(mean[done:low])
        sizes.append(size[done:low])
        pooled_mean, pooled_size = _stack_pool(weight[low:high], total[low:high], size[low:high])
        means.append(pooled_mean)
        sizes.append(pooled_size)
        done = high
    means.append(mean[done:])
    sizes.append(size[done:])
    return np.repeat(np.concatenate(means), np.concatenate(sizes))


def _stack_pool(
    weight: np.ndarray, total: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The pooled blocks' means and sizes of one segment's ordered blocks (weights, weighted
    sums of targets, sizes), by the stack pass of pool-adjacent-violators: each block is pushed,
    then the top two are pooled while the lower one's mean is the larger."""
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
    return np.array(stack_total) / np.array(stack_weight), np.array(stack_size, dtype=np.int64)


def isotonic_points(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kept fitted points (x_i, ŷ_i) of isotonic regression of ``target`` on ``x``.

    The scores are sorted with their targets (ties by target, ascending); each tie group
    (:func:`tie_starts`) is one point, its mean target weighted by its size, pooled by
    :func:`pool_adjacent_violators`. Targets of 0 and 1 (correctness) with float64 scores in
    [0, 2) take one integer sort of the scores' bit patterns with the target in the lowest bit
    (the same order, so the same points bit for bit: a group's sum of 0s and 1s is exact in
    any order)."""
    packed = _packed_pairs(x, target)
    if packed is None:
        order = np.lexsort((target, x))
        xs, ts = x[order], target[order].astype(np.float64)
        opens = tie_starts(xs)
        group = np.cumsum(opens) - 1
        count = np.bincount(group).astype(np.float64)
        mean = np.bincount(group, weights=ts) / count
        return _kept_points(xs[opens], pool_adjacent_violators(mean, count))
    packed.sort()
    xs = (packed >> 1).view(np.float64)
    hit = packed & 1
    first = np.flatnonzero(tie_starts(xs))
    if len(first) == len(xs):  # every score its own group: its target is its mean
        return _kept_points(xs, pool_adjacent_violators(hit.astype(np.float64), np.ones(len(xs))))
    count = np.diff(np.append(first, len(xs))).astype(np.float64)
    mean = np.add.reduceat(hit, first) / count
    return _kept_points(xs[first], pool_adjacent_violators(mean, count))


def _packed_pairs(x: np.ndarray, target: np.ndarray) -> np.ndarray | None:
    """int64 ``bits(x) << 1 | target`` of float64 scores in [0, 2) (+0.0 included, −0.0 and NaN
    not) and targets of 0 and 1, whose ascending order is ``lexsort((target, x))``'s (bit
    patterns of non-negative float64 values rise with the value); None for other inputs."""
    if x.dtype != np.float64 or x.ndim != 1 or len(x) == 0:
        return None
    bits = np.ascontiguousarray(x).view(np.int64)
    if bits.min() < 0 or bits.max() >= _BITS_OF_TWO:
        return None
    hit = np.asarray(target)
    if hit.dtype != np.bool_ and not ((hit == 0) | (hit == 1)).all():
        return None
    packed = bits << 1
    packed |= hit.astype(np.int64)
    return packed


def one_vs_rest_points(
    columns: np.ndarray, labels: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The kept fitted points of every class's isotonic regression of 1[y = k] on p_k, for the
    K×N scores ``columns`` (overwritten: sorted in place) and the N ``labels``.

    The same fit as :func:`isotonic_points` on each column, bit for bit, with the work shared:
    all columns are sorted in one call and their tie groups found together
    (:func:`sorted_tie_starts`), and a class's targets are never sorted: they are 1 only at
    the N_k samples of class k, so only the tie groups holding those are located. The classes
    are then fitted together, :data:`CLASS_BLOCK_SCORES` scores at a time
    (:func:`_class_block_points`)."""
    n_classes, n = columns.shape
    own = columns[labels, np.arange(n)]  # each sample's score for its own class
    by_class = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[by_class], np.arange(n_classes + 1))
    columns.sort(axis=1)
    opens = sorted_tie_starts(columns)
    step = max(1, CLASS_BLOCK_SCORES // max(n, 1))
    points: list[tuple[np.ndarray, np.ndarray]] = []
    for low in range(0, n_classes, step):
        high = min(low + step, n_classes)
        points += _class_block_points(
            columns[low:high],
            opens[low:high],
            own[by_class[starts[low] : starts[high]]],
            np.diff(starts[low : high + 1]),
        )
    return points


def _class_block_points(
    ranked: np.ndarray, opens: np.ndarray, positives: np.ndarray, n_positives: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The kept points of a block of B classes, together, from their B×N sorted scores
    ``ranked``, their tie starts ``opens`` and the scores of the samples of each class
    (``positives``, class after class, ``n_positives`` of each).

    A tie group without positives has target 0, and a run of them is non-increasing, so the
    first vectorised pass of :func:`pool_adjacent_violators` would pool it whole, into the
    block of the group before it: it is given to the pooling as one point (target 0, weight
    its size), which makes the same blocks with the same sums from that pass on (adding 0
    changes no sum), and the groups holding positives (target hits/count, weight count) as
    they are; each class is a segment of one pooling of all B. A run of equal fitted values
    keeps its first and last group, as :func:`_kept_points` keeps them."""
    n_rows, n = ranked.shape
    scores = ranked.reshape(-1)
    first = np.flatnonzero(opens.reshape(-1))  # every group's first score, class after class
    row_group = np.searchsorted(first, np.arange(n_rows + 1) * n)  # each class's first group
    # each positive's last score at most its own (in its class's row), rising: one search of
    # the class's sorted positives per class (a sorted search reads the row in order)
    position = np.empty(len(positives), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(n_positives)]).tolist()
    for row in range(n_rows):
        keys = np.sort(positives[offsets[row] : offsets[row + 1]])
        found = np.searchsorted(ranked[row], keys, side="right")
        position[offsets[row] : offsets[row + 1]] = found + (row * n - 1)
    group = np.searchsorted(first, position, side="right") - 1
    opens_run = np.ones(len(group), dtype=bool)  # the groups holding positives, with counts
    opens_run[1:] = group[1:] != group[:-1]
    positive = group[opens_run]
    hits = np.diff(np.append(np.flatnonzero(opens_run), len(group)))
    positive_class = np.searchsorted(row_group, positive, side="right") - 1
    per_class = np.bincount(positive_class, minlength=n_rows)
    before = np.concatenate([[0], np.cumsum(per_class)])  # positive groups of earlier classes
    # the points in order, class after class: the zero run before each group with positives,
    # that group, ..., and the zero run after the class's last (first and last group of each,
    # end exclusive); positive group j of class c is point 2j + c + 1
    n_points = 2 * len(positive) + n_rows
    low = np.empty(n_points, dtype=np.int64)
    high = np.empty_like(low)
    point_class = np.empty_like(low)
    at = 2 * np.arange(len(positive)) + positive_class
    opens_class = np.arange(len(positive)) == before[positive_class]
    low[at] = np.where(opens_class, row_group[positive_class], np.append(0, positive[:-1] + 1))
    high[at] = positive
    low[at + 1], high[at + 1] = positive, positive + 1
    point_class[at] = point_class[at + 1] = positive_class
    last = 2 * before[1:] + np.arange(n_rows)  # each class's zero run after its last
    low[last] = row_group[:-1]
    has = per_class > 0
    low[last[has]] = positive[before[1:][has] - 1] + 1
    high[last] = row_group[1:]
    point_class[last] = np.arange(n_rows)
    # a group's first score, or the block's end after the last group
    weight = np.take(first, high, mode="clip") - np.take(first, low, mode="clip")
    weight[high == len(first)] += len(scores) - first[-1]
    target = np.zeros(n_points)
    target[at + 1] = hits / weight[at + 1]
    used = high > low  # not the empty zero runs
    low, high, point_class = low[used], high[used], point_class[used]
    segment_starts = np.ones(len(low), dtype=bool)
    segment_starts[1:] = point_class[1:] != point_class[:-1]
    fitted = pool_adjacent_violators(target[used], weight[used].astype(np.float64), segment_starts)
    change = np.flatnonzero((fitted[1:] != fitted[:-1]) | segment_starts[1:]) + 1
    run_first = np.concatenate([[0], change])
    run_last = np.append(change, len(fitted)) - 1
    ends = np.stack([low[run_first], high[run_last] - 1], axis=1)
    both = ends[:, 0] < ends[:, 1]
    kept = np.where(both[:, None], ends, ends[:, :1]).reshape(-1)
    kept = kept[np.stack([np.ones(len(both), dtype=bool), both], axis=1).reshape(-1)]
    n_kept = np.where(both, 2, 1)
    values = np.repeat(fitted[run_first], n_kept)
    cuts = np.cumsum(np.bincount(point_class[run_first], weights=n_kept, minlength=n_rows))
    cuts = cuts[:-1].astype(np.int64)
    return list(zip(np.split(scores[first[kept]], cuts), np.split(values, cuts), strict=True))


#: Cells per knot of a :class:`PointTable` (fewer where there are fewer scores to map, or
#: more than :data:`TABLE_ENTRIES` cells).
CELLS_PER_KNOT = 128
#: Below this many scores ``numpy.interp``'s own search is the faster lookup (measured: level
#: at about 500–1,000 scores, 2–4× slower from 4,096 up).
FEW_SCORES = 512
#: Entries of a cell index, at most: a :class:`PointTable`'s cells, and a :class:`KnotTable`'s
#: (K × cells, int64), whose cells per class are as fine as this allows (16 MB; at K ≥ 2,048 a
#: cell spans more than a binade).
TABLE_ENTRIES = 1 << 21


@dataclass(frozen=True)
class PointTable:
    """One map's kept points (x rising strictly in [0, 2), y not falling) for evaluating its
    interpolation at many scores (:func:`interpolate_table`), ``numpy.interp`` bit for bit.

    Segment j ∈ {0, …, M} holds the scores with x_{j−1} ≤ c < x_j (x_{−1} = −∞, x_M = +∞) and
    gives ``slope[j]·(c − origin[j]) + value[j]``, as in :class:`KnotTable`: numpy.interp's
    formula term for term between knots, slope 0 at the clip below x_0 and from x_{M−1} up. The
    knots' bit-pattern range is cut into cells of 2^``shift`` patterns starting at
    ``low_bits`` (non-negative finite float64 values have bit patterns that rise with the
    value), with cell 0 below x_0 and the last cell above x_{M−1}; ``cells`` gives each cell's
    segment, or −1 where the cell holds knots (its scores are searched). The one difference
    from numpy.interp: at a knot hit exactly whose y is −0.0 (a saved map can hold one, a fit
    gives none) the value is +0.0."""

    x: np.ndarray
    y: np.ndarray
    origin: np.ndarray
    slope: np.ndarray
    value: np.ndarray
    cells: np.ndarray
    low_bits: int
    shift: int
    steep: bool


def point_table(
    points_x: np.ndarray, points_y: np.ndarray, n_scores: int | None = None
) -> PointTable:
    """The :class:`PointTable` of kept points, about :data:`CELLS_PER_KNOT` cells per knot (at
    most about ``n_scores``, the number of scores it will map, when given)."""
    # a −0.0 knot as 0 (its bit pattern is negative)
    x = np.asarray(points_x, dtype=np.float64) + 0.0
    y = np.asarray(points_y, dtype=np.float64)
    knot_bits = x.view(np.int64)
    low_bits = int(knot_bits[0]) if len(x) else 0
    span = int(knot_bits[-1]) - low_bits if len(x) else 0
    wanted = min(CELLS_PER_KNOT * len(x), TABLE_ENTRIES)
    if n_scores is not None:
        wanted = min(wanted, max(n_scores, 64))
    shift = max(0, span.bit_length() - max(wanted, 1).bit_length())
    n_cells = (span >> shift) + 3  # below x_0, the range, above x_{M−1}
    counts = np.bincount(((knot_bits - low_bits) >> shift) + 1, minlength=n_cells)
    lowest = np.cumsum(counts) - counts  # the segment of each cell's lowest value
    origin, slope, value = _segment_terms(x, y)
    return PointTable(
        x=x,
        y=y,
        origin=origin,
        slope=slope,
        value=value,
        cells=np.where(counts > 0, -1, lowest),
        low_bits=low_bits,
        shift=shift,
        steep=bool(np.isinf(slope).any()),
    )


def interpolate_table(table: PointTable, c: np.ndarray) -> np.ndarray:
    """``numpy.interp(c, x, y)`` of the table's points at float64 scores ``c`` (any shape), bit
    for bit: each score's cell gives its segment, and only scores in cells holding knots are
    searched (``numpy.searchsorted``). Fewer than :data:`FEW_SCORES` scores, scores that are not
    non-negative and finite (−0.0, NaN, ±∞, negative) and maps of fewer than two points go to
    numpy.interp."""
    bits = np.ascontiguousarray(c, dtype=np.float64).reshape(-1).view(np.int64)
    if (
        len(table.x) < 2
        or not len(bits)
        or len(bits) < FEW_SCORES
        or bits.min() < 0
        or bits.max() >= _BITS_OF_INFINITY
    ):
        return np.interp(c, table.x, table.y)
    cell = bits - table.low_bits
    cell >>= table.shift
    cell += 1
    np.clip(cell, 0, len(table.cells) - 1, out=cell)
    segment = np.take(table.cells, cell)
    inside = np.flatnonzero(segment < 0)  # cells holding knots: searched
    segment[inside] = np.searchsorted(table.x, bits[inside].view(np.float64), side="right")
    return _on_segments(table, segment, bits.view(np.float64)).reshape(np.shape(c))


def interpolate_points(points_x: np.ndarray, points_y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``numpy.interp(c, points_x, points_y)`` bit for bit for fitted points (x rising strictly
    in [0, 2), y not falling): :func:`interpolate_table` of their :func:`point_table`, made for
    this many scores."""
    return interpolate_table(point_table(points_x, points_y, np.size(c)), c)


def _kept_points(points_x: np.ndarray, points_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fitted points without those whose ŷ equals both neighbours' (they change nothing)."""
    keep = np.ones(len(points_y), dtype=bool)
    keep[1:-1] = (points_y[1:-1] != points_y[:-2]) | (points_y[1:-1] != points_y[2:])
    return points_x[keep], points_y[keep]


@dataclass(frozen=True)
class KnotTable:
    """Every class's kept points end to end, for evaluating all K interpolations of a
    one-vs-rest map at once in the N×K layout (:func:`interpolate`).

    Class k owns the positions ``start[k]`` … ``start[k] + M_k + 1``: a left sentinel
    (``knots`` −∞), its M_k knots, a right sentinel (+∞). A score x of class k falls in the
    segment j whose ``knots[j] ≤ x < knots[j + 1]`` and gets ``slope[j]·(x − origin[j]) +
    value[j]``: at a knot i < M_k − 1 the origin is x_i, the slope (y_{i+1} − y_i)/(x_{i+1} −
    x_i) and the value y_i (``numpy.interp``'s formula, term for term); at the left sentinel
    (x < x_0) and the last knot (x ≥ x_{M−1}) the slope is 0, the origin a knot and the value
    y_0 or y_{M−1} (the clip). The segment is found without a search over the knots: ``cells``
    gives, for each class and cell of the score's float64 bit pattern (``bits >> shift``, a
    fraction of a binade; ``top`` the last cell, every score ≥ 2), the segment of the cell's
    lowest value, bitwise negated (``~j``) where knots fall inside the cell; only scores in
    such cells are searched, among that cell's knots."""

    knots: np.ndarray
    origin: np.ndarray
    slope: np.ndarray
    value: np.ndarray
    cells: np.ndarray
    cell_offsets: np.ndarray
    shift: int
    top: int
    steep: bool


def knot_table(points: Sequence[tuple[np.ndarray, np.ndarray]]) -> KnotTable:
    """The :class:`KnotTable` of per-class kept points (x rising strictly in [0, 1], y not
    falling). A stored −0.0 acts as 0 (its bit pattern is negative; as a value only the sign of
    a zero result differs)."""
    points = [(x + 0.0, y + 0.0) for x, y in points]
    origins, slopes, values = [], [], []
    for x, y in points:  # a class's segments as a PointTable's, then its right sentinel's (clip)
        origin, slope, value = _segment_terms(x, y)
        origins.append(np.append(origin, x[-1:]))
        slopes.append(np.append(slope, 0.0))
        values.append(np.append(value, y[-1:]))
    return _knot_index(
        [x for x, _ in points],
        np.concatenate(origins),
        np.concatenate(slopes),
        np.concatenate(values),
    )


def step_table(knots: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> KnotTable:
    """A :class:`KnotTable` of per-class step functions: class k's value is ``values[k][j]``
    on the segment j of its ``knots[k]`` (x rising strictly in (0, 1]; M_k knots and M_k + 1
    values: ``values[k][0]`` below the first knot, ``values[k][j]`` from knot j − 1 up to
    knot j), read with :func:`knot_segments` (its slopes are 0 and its origins unused)."""
    value = np.concatenate([np.append(row, row[-1:]) for row in values])  # + right sentinel
    zeros = np.zeros(len(value))
    return _knot_index(list(knots), zeros, zeros, value)


def _knot_index(
    knots: Sequence[np.ndarray], origin: np.ndarray, slope: np.ndarray, value: np.ndarray
) -> KnotTable:
    """The :class:`KnotTable` of per-class ``knots`` (each rising strictly in [0, 1]) with the
    segments' terms ``origin``, ``slope`` and ``value`` (M_k + 2 per class, class after
    class): the sentinels and the cell index of every class."""
    n_classes = len(knots)
    sizes = np.array([len(x) for x in knots], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes + 2)[:-1]])
    shift = 44
    while n_classes * ((_BITS_OF_TWO >> shift) + 1) > TABLE_ENTRIES and shift < 62:
        shift += 1
    top = _BITS_OF_TWO >> shift
    n_cells = top + 1
    knot_cells = np.concatenate(
        [np.minimum(x.view(np.int64) >> shift, top) + k * n_cells for k, x in enumerate(knots)]
        + [np.zeros(0, dtype=np.int64)]
    )
    counts = np.bincount(knot_cells, minlength=n_classes * n_cells).reshape(n_classes, n_cells)
    # the segment of each cell's lowest value: the class's left sentinel and its knots below
    lowest = np.cumsum(counts, axis=1) - counts + start[:, None]
    return KnotTable(
        knots=np.concatenate([np.concatenate([[-np.inf], x, [np.inf]]) for x in knots]),
        origin=origin,
        slope=slope,
        value=value,
        cells=np.where(counts > 0, ~lowest, lowest).ravel(),
        cell_offsets=np.arange(n_classes, dtype=np.int64) * n_cells,
        shift=shift,
        top=top,
        steep=bool(np.isinf(slope).any()),
    )


def interpolate(table: KnotTable, p: np.ndarray) -> np.ndarray:
    """f_k(p_ik) of every entry of the C-contiguous N×K float64 scores ``p`` (non-negative),
    bit for bit ``numpy.interp(p[:, k], x_k, y_k)``."""
    return _on_segments(table, knot_segments(table, p), p)


def knot_segments(table: KnotTable, p: np.ndarray) -> np.ndarray:
    """The segment j of ``table`` (``knots[j] ≤ p_ik < knots[j + 1]`` among class k's) of every
    entry of the C-contiguous N×K float64 scores ``p`` (non-negative): from the cell index,
    searching only the entries in cells holding knots, among that cell's knots."""
    cell = p.view(np.int64) >> table.shift
    np.minimum(cell, table.top, out=cell)
    cell += table.cell_offsets
    segment = np.take(table.cells, cell)
    inside = np.flatnonzero(segment < 0)  # cells holding knots: search among them
    if len(inside):
        flat = segment.reshape(-1)
        x = p.reshape(-1)[inside]
        low = ~flat[inside]  # knots[low] <= x
        # the next cell's lowest value is past the cell's last knot, so x < knots[high]: a
        # cell holding knots is never a class's top cell (knots are at most 1)
        after = table.cells[cell.reshape(-1)[inside] + 1]
        high = np.where(after < 0, ~after, after) + 1
        while True:
            open_ = np.flatnonzero(high - low > 1)
            if not len(open_):
                break
            middle = (low[open_] + high[open_]) >> 1
            below = table.knots[middle] <= x[open_]
            low[open_] = np.where(below, middle, low[open_])
            high[open_] = np.where(below, high[open_], middle)
        flat[inside] = low
    return segment


#: The saved body: one row of knots x and values y per map (rows may differ in length).
FIELDS = (
    choice("method", ISOTONIC_METHODS),
    *row_fields("x", "y"),
)


@dataclass(frozen=True)
class IsotonicMap(RowMap):
    """Fitted isotonic regression: ``method`` ``isotonic`` (top-label: one row of ``x`` and
    ``y``) or ``isotonic-ovr`` (one row per class), ``n_classes`` K; each row's points are
    interpolated linearly, clipped outside."""

    FIELDS = FIELDS

    method: str
    n_classes: int
    x: tuple[tuple[float, ...], ...]
    y: tuple[tuple[float, ...], ...]

    @classmethod
    def check_rows(cls, fields: dict[str, Any], source: str) -> None:
        """One row of x and y (top-label) or one per class (OvR), each x rising strictly and its
        y never falling."""
        check_row_count(fields, "x", "y", source)
        for row_x, row_y in zip(fields["x"], fields["y"], strict=True):
            if len(row_x) != len(row_y):
                raise InputError(source, "every row needs as many x as y")
            if not (np.diff(row_x) > 0).all() or not (np.diff(row_y) >= 0).all():
                raise InputError(source, "x must rise strictly and y must not fall")

    @cached_property
    def _points(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Each map's (x, y) as float64 arrays, made once (not at every chunk)."""
        return float_rows(self.x, self.y)

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        if self.method == "isotonic":
            table = self._point_table
            return top_label_map(logp, lambda c: interpolate_table(table, c))
        return one_vs_rest_log_probabilities(self._values(logp))

    @cached_property
    def _point_table(self) -> PointTable:
        """The top-label map's points as a :class:`PointTable`, made once (not at every
        chunk)."""
        return point_table(*self._points[0])

    @cached_property
    def _table(self) -> KnotTable:
        """Every class's points end to end (a one-vs-rest map), made once."""
        return knot_table(self._points)

    def _values(self, logp: torch.Tensor) -> torch.Tensor:
        """N×K f_k(p_k) of a one-vs-rest map (before the renormalisation), in the rows' own
        layout."""
        return torch.from_numpy(interpolate(self._table, torch.exp(logp).numpy()))


@dataclass(frozen=True)
class IsotonicFit(MapFit[IsotonicMap]):
    """Isotonic regression fitted on one split: ``points`` kept per map, NLL before/after on
    the fit split (in-sample)."""

    method: str
    points: tuple[int, ...]
    n_parameters: int


def fit_isotonic(
    scores: Any,
    labels: Any,
    method: str = "isotonic",
    kind: str = "logits",
    names: InputNames = INPUTS,
) -> IsotonicFit:
    """Fit top-label (``method="isotonic"``) or one-vs-rest (``"isotonic-ovr"``) isotonic
    regression on (``scores``, ``labels``)."""
    if method not in ISOTONIC_METHODS:
        raise SettingsError("method", f"unknown isotonic map {method!r}", "isotonic or -ovr")
    logp, y = fit_split(scores, labels, kind, names, f"{method} regression")
    k = logp.shape[1]
    if method == "isotonic":
        fitted_points = [isotonic_points(*top_label_targets(logp, y))]
    else:
        fitted_points = one_vs_rest_points(by_columns(logp), y.numpy())
    fitted_x = [tuple(px.tolist()) for px, _ in fitted_points]
    fitted_y = [tuple(py.tolist()) for _, py in fitted_points]
    fitted = IsotonicMap(method, k, tuple(fitted_x), tuple(fitted_y))
    points = tuple(len(row) for row in fitted_x)
    return fitted.fit_record(
        IsotonicFit, logp, y, method=method, points=points, n_parameters=2 * sum(points)
    )


def _segment_terms(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(origin, slope, value) of segments 0 … M of kept points ``x``, ``y`` (M of them), as
    numpy.interp computes them: the clip below x_0 (origin x_0, slope 0, value y_0), then at
    each knot i the origin x_i, the slope (y_{i+1} − y_i)/(x_{i+1} − x_i) (0 from the last
    knot: the clip) and the value y_i."""
    with np.errstate(over="ignore"):  # knots a subnormal apart: an infinite slope, as numpy's
        slope = np.concatenate([[0.0], np.diff(y) / np.diff(x), [0.0]])
    return np.concatenate([x[:1], x]), slope, np.concatenate([y[:1], y])


def _on_segments(table: PointTable | KnotTable, segment: np.ndarray, x: np.ndarray) -> np.ndarray:
    """slope[j]·(x − origin[j]) + value[j] for each x and its segment j of ``table``
    (:class:`PointTable` or :class:`KnotTable`: numpy.interp's formula, term for term), with
    numpy.interp's y at the knot of an infinite slope (∞ · 0 there)."""
    out = np.take(table.origin, segment)
    np.subtract(x, out, out=out)
    with np.errstate(invalid="ignore"):  # ∞ · 0 at the knot of an infinite slope: below
        out *= np.take(table.slope, segment)
    out += np.take(table.value, segment)
    if table.steep:
        at_knot = np.isnan(out)
        out[at_knot] = table.value[segment[at_knot]]
    return out
