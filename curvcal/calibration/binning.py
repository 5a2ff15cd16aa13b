"""Histogram binning (Zadrozny & Elkan 2001): a calibrated value per bin of the scores.

On the fit split the scores x ∈ [0, 1] (top-label: the confidence c against 1[prediction = y];
one-vs-rest: each p_k against 1[y = k], see :mod:`.univariate`) are cut into M bins, and each
bin's value is the mean of its targets (the accuracy of the bin, or the frequency of y = k).
A new score gets the value of its bin. Bins are (e_m, e_{m+1}]: an edge value goes to the lower
bin, x = 0 to the first and x = 1 to the last (curvcal's ECE convention, and netcal's).

* ``equal-width``: e_m = m/M.
* ``equal-mass``: the fit split's scores sorted and cut as AdaECE cuts them
  (:func:`curvcal.calibration.bins.equal_mass_index`: at round(i·N/M), each cut moved to the
  end of its tie group, empty bins dropped), and each inner edge set halfway between the
  largest score of one bin and the smallest of the next; a bin is never empty on the fit
  split, but ties may leave fewer than M bins (and so may a bin of zeros followed by a score
  under twice the smallest subnormal: no float edge above 0 separates them).

An equal-width bin that holds no fit sample takes the middle of its edges, (e_m + e_{m+1})/2
(the value an uncalibrated score in it would have on average; netcal does the same). M needs
at least M fit samples. Values are not clipped away from 0 and 1: a bin whose fit samples were
all right gives confidence 1 (and its wrong predictions NLL ∞), as netcal and scikit-learn do.
Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from curvcal.calibration.bins import equal_mass_index
from curvcal.calibration.inputs import INPUTS, InputNames
from curvcal.calibration.isotonic import KnotTable, knot_segments, step_table
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import choice
from curvcal.calibration.ties import TIE_RELATIVE, group_starts
from curvcal.calibration.univariate import (
    ONE_VS_REST_CHUNK,
    RowMap,
    by_columns,
    check_row_count,
    fit_split,
    float_rows,
    log_of_values,
    map_chunk_rows,
    one_vs_rest_log_probabilities,
    row_fields,
    top_label_map,
    top_label_targets,
)
from curvcal.errors import InputError, SettingsError, setting_name
from curvcal.settings.calibration import HISTOGRAM_SCHEMES

HISTOGRAM_METHODS = ("histogram", "histogram-ovr")


def histogram_edges(x: np.ndarray, n_bins: int, scheme: str) -> np.ndarray:
    """The bin edges 0 = e_0 < e_1 < … < e_B = 1 of ``scheme`` for the fit scores ``x``."""
    if scheme == "equal-width":
        return np.arange(n_bins + 1, dtype=np.float64) / n_bins
    index = equal_mass_index(torch.from_numpy(x), n_bins).numpy()
    lowest = np.full(n_bins, np.inf)
    highest = np.full(n_bins, -np.inf)
    np.minimum.at(lowest, index, x)
    np.maximum.at(highest, index, x)
    used = np.unique(index)
    below, above = highest[used[:-1]], lowest[used[1:]]
    return _edges_between(below, above)


def _edges_between(below: np.ndarray, above: np.ndarray) -> np.ndarray:
    """0, the inner edges halfway between each bin's largest score ``below`` and the next
    bin's smallest ``above``, and 1. Halfway may round up onto ``above`` (then the edge is
    ``below``); a bin of scores 0 followed by one whose smallest score is under twice the
    smallest subnormal has no float edge above 0 to separate them, so the two are one bin."""
    inner = below + (above - below) / 2
    inner = np.where(inner < above, inner, below)
    return np.concatenate([[0.0], inner[inner > 0], [1.0]])


def bin_of(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of every score (any shape): (e_m, e_{m+1}], x ≤ e_1 in the first bin,
    x > e_{B−1} in the last; the number of inner edges below x (``torch.bucketize``, the same
    search as ``numpy.searchsorted(side="left")`` and faster on one thread)."""
    scores = torch.from_numpy(np.ascontiguousarray(x))
    return torch.bucketize(scores, torch.from_numpy(edges[1:-1])).numpy()


#: Cells of [0, 1) per bin (at least) of :func:`cell_bin_of`'s index (a power of two in all).
CELLS_PER_BIN = 16
#: Below this many scores ``torch.bucketize`` (:func:`bin_of`) is the faster lookup (measured:
#: level at about 1,000 scores, 2–4× slower from 4,096 up).
FEW_BIN_SCORES = 1024


def bin_cells(edges: np.ndarray) -> np.ndarray:
    """The cell table of :func:`cell_bin_of` for bin ``edges``: [0, 1) cut into C cells
    [c/C, (c + 1)/C) (C a power of two, at least :data:`CELLS_PER_BIN` per bin) and [1, 2] one
    more; each cell's number of inner edges below it, or −1 where the cell holds an inner
    edge."""
    inner = edges[1:-1]
    n_cells = 1 << (CELLS_PER_BIN * max(len(inner), 1) - 1).bit_length()
    cell_low = np.arange(n_cells + 1, dtype=np.float64) / n_cells  # exact: C is a power of two
    below = np.searchsorted(inner, cell_low, side="left")  # inner edges < each cell's start
    holds_edge = np.append(below[1:] > below[:-1], False)  # the cell x ≥ 1 holds none
    return np.where(holds_edge, -1, below)


def cell_bin_of(x: np.ndarray, edges: np.ndarray, cells: np.ndarray | None = None) -> np.ndarray:
    """:func:`bin_of` of float64 scores in [0, 2] (the top-label confidences), the same indices,
    mostly without a search: a score's cell of :func:`bin_cells` (``cells``, made here when not
    given; x·C is exact, so the cell is floor(x·C)) gives its bin outright where the cell holds
    no inner edge, and only the scores in cells holding one are searched. Fewer than
    :data:`FEW_BIN_SCORES` scores and other scores (negative, above 2, NaN) go to
    :func:`bin_of`."""
    scores = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    if (
        not len(scores)
        or len(scores) < FEW_BIN_SCORES
        or not (scores.min() >= 0.0 and scores.max() <= 2.0)
    ):
        return bin_of(x, edges)
    table = bin_cells(edges) if cells is None else cells
    cell = (scores * (len(table) - 1)).astype(np.int64)  # floor: x ≥ 0
    np.minimum(cell, len(table) - 1, out=cell)
    index = np.take(table, cell)
    searched = np.flatnonzero(index < 0)
    index[searched] = np.searchsorted(edges[1:-1], scores[searched], side="left")
    return index.reshape(np.shape(x))


def histogram_values(
    x: np.ndarray, target: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, int]:
    """(value of every bin, number of empty bins): the mean target of the bin's fit samples,
    the middle of its edges when it has none."""
    n_bins = len(edges) - 1
    index = cell_bin_of(x, edges)
    count = np.bincount(index, minlength=n_bins).astype(np.float64)
    hits = np.bincount(index, weights=target, minlength=n_bins)
    middle = (edges[:-1] + edges[1:]) / 2
    values = np.where(count > 0, hits / np.maximum(count, 1.0), middle)
    return values, int((count == 0).sum())


def one_vs_rest_bins(
    logp: torch.Tensor, labels: np.ndarray, n_bins: int, scheme: str
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(edges, values, empty bins) of every class's histogram of 1[y = k] on p_k, for the N×K
    float64 log-probabilities ``logp`` and the N ``labels``.

    The same bins as :func:`histogram_edges` and :func:`histogram_values` on each column, with
    the work shared: a bin's hits come only from the N_k samples of class k (N searches over
    all classes, not K·N); its count, for equal-width bins (the same edges for every class),
    from searches of row chunks of all N×K scores, and for equal-mass bins from the K×N sorted
    columns (one sort call) as differences of cut positions. Counts and hits are whole numbers,
    so every value is bit for bit the per-column fit's. No N×K copy of the probabilities is
    made beside the K×N sorted columns of equal-mass bins."""
    n, n_classes = logp.shape
    own = torch.exp(logp.gather(1, torch.from_numpy(labels)[:, None])[:, 0]).numpy()
    if scheme == "equal-width":
        edges = histogram_edges(own, n_bins, scheme)
        offsets = np.arange(n_classes) * n_bins
        count = np.zeros(n_classes * n_bins, dtype=np.int64)
        step = map_chunk_rows(n_classes, ONE_VS_REST_CHUNK)
        for start in range(0, n, step):
            index = bin_of(torch.exp(logp[start : start + step]).numpy(), edges)
            index += offsets
            count += np.bincount(index.ravel(), minlength=n_classes * n_bins)
        hits = np.bincount(labels * n_bins + bin_of(own, edges), minlength=n_classes * n_bins)
        middle = (edges[:-1] + edges[1:]) / 2
        counts = count.reshape(n_classes, n_bins).astype(np.float64)
        all_values = np.where(
            counts > 0, hits.reshape(counts.shape) / np.maximum(counts, 1.0), middle
        )
        return [
            (edges, values, int((row == 0).sum()))
            for values, row in zip(all_values, counts, strict=True)
        ]
    columns = by_columns(logp)
    columns.sort(axis=1)
    cuts, inner, kept = sorted_equal_mass_cuts(columns, n_bins)
    hits = np.bincount(
        labels * n_bins + _bins_among(own, inner[labels], kept[labels]),
        minlength=n_classes * n_bins,
    ).reshape(n_classes, n_bins)
    bins = []
    for k in range(n_classes):
        edges = np.concatenate([[0.0], inner[k, kept[k]], [1.0]])
        count = np.diff(cuts[k, kept[k]], prepend=0, append=n).astype(np.float64)
        middle = (edges[:-1] + edges[1:]) / 2
        values = np.where(count > 0, hits[k, : len(count)] / np.maximum(count, 1.0), middle)
        bins.append((edges, values, int((count == 0).sum())))
    return bins


#: Entries per block of the comparisons of :func:`sorted_equal_mass_cuts` and
#: :func:`_bins_among` (bounds their work arrays).
COMPARE_ELEMENTS = 1 << 20
#: Sorted positions after a cut searched at once for the end of its tie group (a longer tie
#: group is followed in its own row by :func:`tie_group_ends`).
TIE_WINDOW = 32


def sorted_equal_mass_cuts(
    columns: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cuts, inner edges, kept) of :func:`sorted_equal_mass_edges` for every row of the K×N
    ``columns`` (each sorted ascending) at once, as K×(M − 1) arrays: the cut positions (moved
    to the ends of their tie groups, never falling), the inner edge halfway at each cut, and
    whether the edge is one of the row's (the first of equal cuts, inside (0, N), above 0).
    Row k's edges are 0, ``inner[k, kept[k]]``, 1, and its bins hold the differences of 0,
    ``cuts[k, kept[k]]``, N scores.

    Only the :data:`TIE_WINDOW` positions after each cut are read for the tie rule of
    :func:`~curvcal.calibration.ties.group_starts` (neighbours more than 16 float64 roundings
    apart open a group), not the K×N neighbours."""
    n_rows, n = columns.shape
    targets = np.floor(np.arange(1, n_bins, dtype=np.float64) * n / n_bins + 0.5)
    last_before = np.clip(targets.astype(np.int64) - 1, 0, n - 1)
    # the end of the tie group holding position t: the first j > t that opens a group, or N
    window = np.minimum(last_before[:, None] + np.arange(1, TIE_WINDOW + 1), n)
    group_end = np.empty((n_rows, len(targets)), dtype=np.int64)
    step = max(1, COMPARE_ELEMENTS // max(1, window.size))
    for low in range(0, n_rows, step):
        current = columns[low : low + step, np.minimum(window, n - 1)]
        previous = columns[low : low + step, window - 1]
        scale = np.maximum(np.abs(previous), np.abs(current))
        opens = ((current - previous) > TIE_RELATIVE * scale) | (window >= n)
        group_end[low : low + step] = window[np.arange(len(targets)), opens.argmax(axis=2)]
        for row, cut in zip(*np.nonzero(~opens.any(axis=2)), strict=True):  # a long tie group
            group_end[low + row, cut] = tie_group_ends(columns[low + row])[last_before[cut]]
    cuts = np.where(targets > 0, group_end, 0)
    if cuts.shape[1]:
        np.maximum.accumulate(cuts, axis=1, out=cuts)
    first = np.ones(cuts.shape, dtype=bool)
    first[:, 1:] = cuts[:, 1:] != cuts[:, :-1]
    rows = np.arange(n_rows)[:, None]
    below = columns[rows, np.clip(cuts - 1, 0, n - 1)]
    above = columns[rows, np.minimum(cuts, n - 1)]
    inner = below + (above - below) / 2
    inner = np.where(inner < above, inner, below)
    kept = first & (cuts > 0) & (cuts < n) & (inner > 0)
    return cuts, inner, kept


def _bins_among(x: np.ndarray, inner: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The bin of each score ``x[i]`` among its own row of inner edges ``inner[i, kept[i]]``
    (rows rising): how many of them are below x, as :func:`bin_of`."""
    out = np.empty(len(x), dtype=np.int64)
    step = max(1, COMPARE_ELEMENTS // max(1, inner.shape[1]))
    for start in range(0, len(x), step):
        block = slice(start, start + step)
        below = (inner[block] < x[block, None]) & kept[block]
        out[block] = below.sum(axis=1)
    return out


def tie_group_ends(ranked: np.ndarray) -> np.ndarray:
    """One past the end of each position's tie group in scores sorted ascending (equal up to
    float64 rounding, as :func:`~curvcal.calibration.bins.equal_mass_index` groups them)."""
    starts = group_starts(torch.from_numpy(ranked)).numpy()
    return np.append(np.flatnonzero(starts)[1:], len(ranked))[np.cumsum(starts) - 1]


def sorted_equal_mass_edges(ranked: np.ndarray, n_bins: int) -> np.ndarray:
    """:func:`histogram_edges` ``equal-mass`` of scores already sorted ascending: the cuts of
    :func:`~curvcal.calibration.bins.equal_mass_index` (at round(i·N/M), each moved to the end
    of its tie group; empty bins dropped) read off the sorted scores."""
    n = len(ranked)
    targets = np.floor(np.arange(1, n_bins, dtype=np.float64) * n / n_bins + 0.5)
    last_before = np.clip(targets.astype(np.int64) - 1, 0, n - 1)
    group_end = tie_group_ends(ranked)
    cuts = np.where(targets > 0, group_end[last_before], 0)
    cuts = np.maximum.accumulate(cuts) if len(cuts) else cuts
    boundary = np.unique(cuts[(cuts > 0) & (cuts < n)])
    below, above = ranked[boundary - 1], ranked[boundary]
    return _edges_between(below, above)


#: The saved body: one row of bin edges and one of values per map (rows may differ in length).
FIELDS = (
    choice("method", HISTOGRAM_METHODS),
    choice("scheme", HISTOGRAM_SCHEMES),
    *row_fields("edges", "values"),
)


@dataclass(frozen=True)
class HistogramMap(RowMap):
    """Fitted histogram binning: ``method`` ``histogram`` (top-label: one row of ``edges``
    and ``values``) or ``histogram-ovr`` (one row per class), the bin ``scheme`` it was fitted
    with, and ``n_classes`` K."""

    FIELDS = FIELDS

    method: str
    scheme: str
    n_classes: int
    edges: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]

    @classmethod
    def check_rows(cls, fields: dict[str, Any], source: str) -> None:
        """One row of edges and values (top-label) or one per class (OvR), each checked by
        :func:`check_bin_rows`."""
        check_row_count(fields, "edges", "values", source)
        check_bin_rows(fields["edges"], fields["values"], source)

    @cached_property
    def _bins(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Each map's (edges, values) as float64 arrays, made once (not at every chunk)."""
        return float_rows(self.edges, self.values)

    @cached_property
    def _table(self) -> np.ndarray:
        """Every class's values end to end (classes of equal-width bins: B each)."""
        return np.concatenate([row[1] for row in self._bins])

    @cached_property
    def _log_table(self) -> np.ndarray:
        """log of :attr:`_table` (−∞ for a value 0), taken once for every score in its bin."""
        return log_of_values(torch.from_numpy(self._table)).numpy()

    @cached_property
    def _offsets(self) -> np.ndarray:
        """Where each class's values start in :attr:`_table`."""
        return np.arange(self.n_classes) * len(self._bins[0][1])

    @cached_property
    def _cells(self) -> np.ndarray:
        """The top-label map's :func:`bin_cells`, made once (not at every chunk)."""
        return bin_cells(self._bins[0][0])

    @cached_property
    def _steps(self) -> KnotTable:
        """Every class's bins as one :func:`step_table` (equal-mass one-vs-rest), made once: a
        score above inner edge e is at or above its float successor, so the knots are the
        successors of the inner edges and bin m is segment m, (e_m, e_{m+1}] as
        :func:`bin_of` has it."""
        return step_table(
            [np.nextafter(edges[1:-1], np.inf) for edges, _ in self._bins],
            [values for _, values in self._bins],
        )

    @cached_property
    def _log_steps(self) -> np.ndarray:
        """log of :attr:`_steps`' values (−∞ for a value 0), taken once."""
        return log_of_values(torch.from_numpy(self._steps.value)).numpy()

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        if self.method == "histogram":
            edges, values = self._bins[0]
            cells = self._cells
            return top_label_map(logp, lambda c: values[cell_bin_of(c, edges, cells)])
        index = self._index(logp)
        table, log_table = (
            (self._table, self._log_table)
            if self.scheme == "equal-width"
            else (self._steps.value, self._log_steps)
        )
        return one_vs_rest_log_probabilities(
            torch.from_numpy(np.take(table, index)), torch.from_numpy(np.take(log_table, index))
        )

    def _index(self, logp: torch.Tensor) -> np.ndarray:
        """N×K position of each class's f_k(p_k) in its table of values (:attr:`_table` for
        equal-width bins, :attr:`_steps` for equal-mass ones), all classes at once in the rows'
        own layout."""
        p = torch.exp(logp).numpy()
        if self.scheme == "equal-width":  # every class has the same edges
            index = bin_of(p, self._bins[0][0])
            index += self._offsets
            return index
        return knot_segments(self._steps, p)

    def _values(self, logp: torch.Tensor) -> torch.Tensor:
        """N×K f_k(p_k) of a one-vs-rest map (before the renormalisation)."""
        table = self._table if self.scheme == "equal-width" else self._steps.value
        return torch.from_numpy(np.take(table, self._index(logp)))


@dataclass(frozen=True)
class HistogramFit(MapFit[HistogramMap]):
    """Histogram binning fitted on one split: ``n_bins`` asked, ``bins_used`` (per map: fewer
    than asked when equal-mass ties merged bins), ``empty_bins`` (equal-width bins without fit
    samples, over every map), ``n_parameters`` (the values, and the inner edges of
    equal-mass bins), NLL before/after on the fit split (in-sample)."""

    method: str
    scheme: str
    n_bins: int
    bins_used: tuple[int, ...]
    empty_bins: int
    n_parameters: int


def fit_histogram(
    scores: Any,
    labels: Any,
    method: str = "histogram",
    kind: str = "logits",
    n_bins: int = 15,
    scheme: str = "equal-mass",
    names: InputNames = INPUTS,
) -> HistogramFit:
    """Fit top-label (``method="histogram"``) or one-vs-rest (``"histogram-ovr"``) histogram
    binning with ``n_bins`` bins of ``scheme`` on (``scores``, ``labels``)."""
    if method not in HISTOGRAM_METHODS:
        raise SettingsError("method", f"unknown histogram map {method!r}", "histogram or -ovr")
    if scheme not in HISTOGRAM_SCHEMES:
        raise SettingsError(
            "histogram_scheme", f"unknown scheme {scheme!r}", " or ".join(HISTOGRAM_SCHEMES)
        )
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise SettingsError("histogram_bins", f"must be a whole number >= 1, got {n_bins!r}")
    logp, y = fit_split(scores, labels, kind, names, f"{method} binning")
    n, k = logp.shape
    if n < n_bins:
        raise SettingsError(
            "histogram_bins",
            f"{n_bins} bins need at least {n_bins} fit samples; the fit split has {n}",
            f"lower {setting_name('histogram_bins')} or fit on more samples",
        )
    if method == "histogram":
        confidence, correct = top_label_targets(logp, y)
        row_edges = histogram_edges(confidence, n_bins, scheme)
        bins = [(row_edges, *histogram_values(confidence, correct, row_edges))]
    else:
        bins = one_vs_rest_bins(logp, y.numpy(), n_bins, scheme)
    edges = [tuple(row_edges.tolist()) for row_edges, _, _ in bins]
    values = [tuple(row_values.tolist()) for _, row_values, _ in bins]
    empty = sum(row_empty for _, _, row_empty in bins)
    fitted = HistogramMap(method, scheme, k, tuple(edges), tuple(values))
    return fitted.fit_record(
        HistogramFit,
        logp,
        y,
        method=method,
        scheme=scheme,
        n_bins=n_bins,
        bins_used=tuple(len(row) for row in values),
        empty_bins=empty,
        n_parameters=sum(
            len(row) + (len(row) - 1 if scheme == "equal-mass" else 0) for row in values
        ),
    )


def check_bin_rows(edges: list[np.ndarray], values: list[np.ndarray], source: str) -> None:
    """Each saved row of bins: edges rising strictly from 0 to 1, one more than its values
    (a fault is an :class:`InputError` naming ``source``)."""
    for row_edges, row_values in zip(edges, values, strict=True):
        if len(row_edges) != len(row_values) + 1:
            raise InputError(source, "every row needs one edge more than it has values")
        if row_edges[0] != 0 or row_edges[-1] != 1 or not (np.diff(row_edges) > 0).all():
            raise InputError(source, "edges must rise strictly from 0 to 1")
