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
  split, but ties may leave fewer than M bins.

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
from curvcal.calibration.inputs import class_labels, log_probabilities
from curvcal.calibration.univariate import (
    ONE_VS_REST_ELEMENTS,
    apply_by_rows,
    by_rows,
    check_classes,
    check_keys,
    check_unit,
    fit_nll,
    one_vs_rest_log_probabilities,
    rows_of,
    top_label_map,
)
from curvcal.errors import InputError
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
    inner = below + (above - below) / 2
    inner = np.where(inner < above, inner, below)  # halfway may round up onto the next score
    return np.concatenate([[0.0], inner, [1.0]])


def bin_of(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of every score: (e_m, e_{m+1}], x ≤ e_1 in the first bin, x > e_{B−1} in the
    last."""
    return np.searchsorted(edges[1:-1], x, side="left")


def histogram_values(
    x: np.ndarray, target: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, int]:
    """(value of every bin, number of empty bins): the mean target of the bin's fit samples,
    the middle of its edges when it has none."""
    n_bins = len(edges) - 1
    index = bin_of(x, edges)
    count = np.bincount(index, minlength=n_bins).astype(np.float64)
    hits = np.bincount(index, weights=target, minlength=n_bins)
    middle = (edges[:-1] + edges[1:]) / 2
    values = np.where(count > 0, hits / np.maximum(count, 1.0), middle)
    return values, int((count == 0).sum())


@dataclass(frozen=True)
class HistogramMap:
    """Fitted histogram binning: ``method`` ``histogram`` (top-label: one row of ``edges``
    and ``values``) or ``histogram-ovr`` (one row per class), the bin ``scheme`` it was fitted
    with, and ``n_classes`` K."""

    method: str
    scheme: str
    n_classes: int
    edges: tuple[tuple[float, ...], ...]
    values: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        _check_map(self.to_dict(), "calibrator")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: ``{"method", "scheme", "n_classes", "edges", "values"}`` (lists of
        lists of numbers, one list per map)."""
        return {
            "method": self.method,
            "scheme": self.scheme,
            "n_classes": self.n_classes,
            "edges": [list(row) for row in self.edges],
            "values": [list(row) for row in self.values],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibrator") -> HistogramMap:
        """Rebuild from :meth:`to_dict` output; every fault is an :class:`InputError` naming
        ``source``."""
        edges, values = _check_map(data, source)
        return cls(
            data["method"],
            data["scheme"],
            data["n_classes"],
            tuple(tuple(row.tolist()) for row in edges),
            tuple(tuple(row.tolist()) for row in values),
        )

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities of N×K ``scores`` after the map."""
        return apply_by_rows(
            scores, kind, source, self.method, self.n_classes, self._map_rows, self._chunk
        )

    @property
    def _chunk(self) -> int | None:
        """Entries per row chunk: larger for one-vs-rest (one NumPy call per class and chunk)."""
        return ONE_VS_REST_ELEMENTS if self.method == "histogram-ovr" else None

    @cached_property
    def _bins(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Each map's (edges, values) as float64 arrays, made once (not at every chunk)."""
        return tuple(
            (np.asarray(e, dtype=np.float64), np.asarray(v, dtype=np.float64))
            for e, v in zip(self.edges, self.values, strict=True)
        )

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        edges = [row[0] for row in self._bins]
        values = [row[1] for row in self._bins]
        if self.method == "histogram":
            return top_label_map(logp, lambda c: values[0][bin_of(c, edges[0])])
        p = torch.exp(logp).numpy()
        f = np.empty_like(p)
        for k in range(self.n_classes):
            f[:, k] = values[k][bin_of(p[:, k], edges[k])]
        return one_vs_rest_log_probabilities(torch.from_numpy(f))

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        """float64 calibrated probabilities of N×K ``scores``."""
        return torch.exp(self.apply(scores, kind, source))


@dataclass(frozen=True)
class HistogramFit:
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
    nll_before: float
    nll_after: float
    n_samples: int
    calibrator: HistogramMap

    def to_dict(self) -> dict[str, Any]:
        """The fit's record without its parameters (they are in the saved calibrator)."""
        return {key: getattr(self, key) for key in self.__dataclass_fields__ if key != "calibrator"}


def fit_histogram(
    scores: Any,
    labels: Any,
    method: str = "histogram",
    kind: str = "logits",
    n_bins: int = 15,
    scheme: str = "equal-mass",
    source: str = "scores",
    labels_source: str = "labels",
) -> HistogramFit:
    """Fit top-label (``method="histogram"``) or one-vs-rest (``"histogram-ovr"``) histogram
    binning with ``n_bins`` bins of ``scheme`` on (``scores``, ``labels``)."""
    if method not in HISTOGRAM_METHODS:
        raise InputError("--method", f"unknown histogram map {method!r}", "histogram or -ovr")
    if scheme not in HISTOGRAM_SCHEMES:
        raise InputError(
            "--histogram-scheme", f"unknown scheme {scheme!r}", " or ".join(HISTOGRAM_SCHEMES)
        )
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise InputError("--histogram-bins", f"must be a whole number >= 1, got {n_bins!r}")
    logp = log_probabilities(scores, kind, source)
    n, k = logp.shape
    check_classes(k, f"{method} binning", source)
    y = class_labels(labels, n, k, labels_source)
    if n < n_bins:
        raise InputError(
            "--histogram-bins",
            f"{n_bins} bins need at least {n_bins} fit samples; the fit split has {n}",
            "lower --histogram-bins or fit on more samples",
        )
    if method == "histogram":
        top = logp.argmax(dim=1)
        log_c = logp.gather(1, top[:, None])[:, 0]
        xs = [torch.exp(log_c).numpy()]
        targets = [(top == y).numpy().astype(np.float64)]
    else:
        columns = torch.exp(logp).T.contiguous().numpy()  # one transposed copy, K×N
        xs = list(columns)
        targets = [(y == j).numpy().astype(np.float64) for j in range(k)]
    edges, values, empty = [], [], 0
    for x, target in zip(xs, targets, strict=True):
        row_edges = histogram_edges(x, n_bins, scheme)
        row_values, row_empty = histogram_values(x, target, row_edges)
        edges.append(tuple(row_edges.tolist()))
        values.append(tuple(row_values.tolist()))
        empty += row_empty
    fitted = HistogramMap(method, scheme, k, tuple(edges), tuple(values))
    return HistogramFit(
        method=method,
        scheme=scheme,
        n_bins=n_bins,
        bins_used=tuple(len(row) for row in values),
        empty_bins=empty,
        n_parameters=sum(
            len(row) + (len(row) - 1 if scheme == "equal-mass" else 0) for row in values
        ),
        nll_before=fit_nll(logp, y),
        nll_after=fit_nll(by_rows(logp, fitted._map_rows, fitted._chunk), y),
        n_samples=n,
        calibrator=fitted,
    )


def _check_map(data: Any, source: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    check_keys(data, ("method", "scheme", "n_classes", "edges", "values"), source)
    method, scheme, k = data["method"], data["scheme"], data["n_classes"]
    if method not in HISTOGRAM_METHODS:
        raise InputError(source, f"unknown method {method!r}", " or ".join(HISTOGRAM_METHODS))
    if scheme not in HISTOGRAM_SCHEMES:
        raise InputError(source, f"unknown scheme {scheme!r}", " or ".join(HISTOGRAM_SCHEMES))
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise InputError(source, f"n_classes must be a whole number >= 2, got {k!r}")
    edges = rows_of(data["edges"], source, "edges")
    values = rows_of(data["values"], source, "values")
    rows = 1 if method == "histogram" else k
    if len(edges) != rows or len(values) != rows:
        raise InputError(
            source,
            f"{method} with {k} classes needs {rows} row(s) of edges and values, got "
            f"{len(edges)} and {len(values)}",
        )
    for row_edges, row_values in zip(edges, values, strict=True):
        if len(row_edges) != len(row_values) + 1:
            raise InputError(source, "every row needs one edge more than it has values")
        if row_edges[0] != 0 or row_edges[-1] != 1 or not (np.diff(row_edges) > 0).all():
            raise InputError(source, "edges must rise strictly from 0 to 1")
        check_unit(row_values, source, "values")
    return edges, values
