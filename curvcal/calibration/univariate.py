"""Full K-vectors from one-dimensional calibration maps (histogram binning, isotonic
regression), and the checks of their saved numbers.

A one-dimensional map f: [0, 1] → [0, 1] is used in two ways:

* **top-label**: f is fitted on (c, 1[prediction = y]), c = max_k p_k the confidence; the top
  class t (argmax, lowest index on ties) gets q_t = max(f(c), c_tie) and every other class
  keeps its share of the rest, q_j = p_j · (1 − q_t) / (1 − c). c_tie = p_s / (p_s + 1 − c),
  p_s the runner-up, is where the rescaled runner-up would reach the top class: the floor
  keeps the prediction (and the correctness of every row) what it was, so the map only
  re-states how sure the model is. At the floor the runner-up would equal the top class and
  the lowest index would win, so every other class is held under q_t by a relative
  :data:`TIE_MARGIN` (2^−20 ≈ 9.5e-7: wide enough that rounding q to float32, 2^−24
  relative, cannot close it) and such a row renormalised. Every other row is not
  renormalised: its q_t is f(c) itself (log q_t = log f(c), the same bits for every row with
  the same f(c)), so rows that a piecewise-constant map sends to one value keep exactly equal
  confidences, whatever their other entries. 1 − c is computed as Σ_{j≠t} p_j (a
  logsumexp of the others' log-probabilities), exact even where c rounds to 1; a row whose
  other classes all have probability 0 shares 1 − q_t evenly among them (floor: 1/K).
* **one-vs-rest**: a map f_k per class, fitted on (p_k, 1[y = k]) over every sample, then
  q_k = f_k(p_k) / Σ_j f_j(p_j) (renormalised; a row where every f_j is 0 gets 1/K, as
  scikit-learn's ``CalibratedClassifierCV`` does). The prediction may change.

The metrics of a stage are computed from q itself, so its confidence is max_k q_k (for
top-label maps: q_t, by the floor) and its prediction argmax_k q_k. Pure: no file I/O, no
printing, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from curvcal.calibration.inputs import InputNames, chunk_rows, class_labels, log_probabilities
from curvcal.calibration.saved import Field, SavedMap, array, integer, read_fields
from curvcal.errors import InputError

#: At the floor of the top-label rule the other classes are held this relative amount under
#: the top class, so the prediction cannot change: 2^−20, 16 times float32's unit roundoff
#: 2^−24 (rounding both entries to float32 closes at most 2^−23 of it), so q rounded to float32
#: (a saved or exported copy) keeps the top class the strict maximum too; a margin under
#: float32's rounding vanishes there, and at K = 2 a bin worth 0.5 becomes an exact tie, which
#: argmax hands to class 0. Half-precision copies (2^−11, 2^−8) can still tie.
TIE_MARGIN = 2.0**-20


def top_label_parts(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top index t, log c, log(1 − c)) of float64 N×K log-probabilities, 1 − c as the
    logsumexp of the other classes (−inf when they are all 0)."""
    top, log_c, _, _, log_rest = _top_and_rest(logp)
    return top, log_c, log_rest


def top_label_log_probabilities(logp: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """log q of the top-label rule (module docstring) for float64 N×K ``logp`` and the
    calibrated confidences f(c) (length N, in [0, 1])."""
    top, _, others, log_second, log_rest = _top_and_rest(logp)
    return _top_label_rule(others, top, log_second, log_rest, confidence)


def top_label_map(
    logp: torch.Tensor, calibrate: Callable[[np.ndarray], np.ndarray]
) -> torch.Tensor:
    """log q of the top-label rule for float64 N×K ``logp`` whose confidences c are mapped by
    ``calibrate`` (float64 NumPy in, f(c) out): :func:`top_label_log_probabilities` with the
    top class and the other classes' log-probabilities found once."""
    top, log_c, others, log_second, log_rest = _top_and_rest(logp)
    confidence = torch.from_numpy(np.asarray(calibrate(torch.exp(log_c).numpy())))
    return _top_label_rule(others, top, log_second, log_rest, confidence)


def _top_and_rest(
    logp: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top index t (the first maximum, as argmax), log c, ``logp`` with the top class at
    −inf, the runner-up's log p_s, log(1 − c)) of float64 N×K ``logp``; 1 − c is the
    logsumexp of the other classes (exact where c rounds to 1; −inf when they are all 0)."""
    log_c, top = logp.max(dim=1)
    others = logp.scatter(1, top[:, None], -math.inf)
    return top, log_c, others, others.max(dim=1).values, torch.logsumexp(others, dim=1)


def _top_label_rule(
    others: torch.Tensor,
    top: torch.Tensor,
    log_second: torch.Tensor,
    log_rest: torch.Tensor,
    confidence: torch.Tensor,
) -> torch.Tensor:
    """The top-label rule from the N×K log-probabilities ``others`` with the top class
    ``top`` at −inf, the runner-up's ``log_second``, log(1 − c) = ``log_rest`` and f(c) =
    ``confidence``.

    Every other class is (log p_j − log(1 − c)) + log(1 − q_t), written into ``others``. Only
    the rows where that puts the runner-up within :data:`TIE_MARGIN` of q_t (the floor binds)
    are then held under it and renormalised."""
    k = others.shape[1]
    spread = torch.isneginf(log_rest)  # every other class has probability 0
    # c_tie = p_s / (p_s + 1 − c) in log space; 1/K where the rest is shared evenly
    log_tie = log_second - torch.logaddexp(log_second, log_rest)
    log_tie = torch.where(spread, torch.full_like(log_tie, -math.log(k)), log_tie)
    q_top = torch.maximum(confidence.to(torch.float64), torch.exp(log_tie)).clamp(0.0, 1.0)
    log_top = torch.log(q_top)
    log_share = torch.log1p(-q_top)
    log_q = others.sub_(torch.where(spread, torch.zeros_like(log_rest), log_rest)[:, None])
    log_q.add_(log_share[:, None])
    log_even = log_share - math.log(max(k - 1, 1))  # a spread row's other classes
    if bool(spread.any()):
        rows = spread.nonzero()[:, 0]
        log_q[rows] = log_even[rows, None]
    log_q.scatter_(1, top[:, None], log_top[:, None])
    # the top class stays the strict maximum (at the floor the runner-up would equal it, and
    # the lowest index would win): in the rows where the largest other class reaches the cap,
    # the others are held a relative TIE_MARGIN under it, then the row is renormalised (a
    # change of at most TIE_MARGIN in q_t, only where the floor binds). Every other row keeps
    # log q_t = log f(c) as it is: renormalising it would mix the rounding of its other entries
    # into q_t, and rows with the same f(c) would no longer have the same confidence bit for bit.
    cap = log_top + math.log1p(-TIE_MARGIN)
    largest = torch.where(spread, log_even, (log_second - log_rest) + log_share)
    held = (largest > cap).nonzero()[:, 0]
    if len(held):
        rows = torch.minimum(log_q[held], cap[held, None])
        rows.scatter_(1, top[held, None], log_top[held, None])
        log_q[held] = torch.log_softmax(rows, dim=1)
    return log_q


#: Entries per row chunk of a one-vs-rest map (histogram, isotonic), whose work runs on all
#: the chunk's N×K entries at once: its float64 work arrays (1 MB each) stay in cache.
ONE_VS_REST_CHUNK = 1 << 17


def by_rows(
    logp: torch.Tensor,
    block_map: Callable[[torch.Tensor], torch.Tensor],
    elements: int | None = None,
) -> torch.Tensor:
    """``block_map`` applied to row chunks of N×K ``logp`` (bounding the work arrays) of about
    ``elements`` entries each (default: :func:`~curvcal.calibration.inputs.chunk_rows`)."""
    out = torch.empty_like(logp)
    step = map_chunk_rows(logp.shape[1], elements)
    for start in range(0, logp.shape[0], step):
        out[start : start + step] = block_map(logp[start : start + step])
    return out


def map_chunk_rows(n_classes: int, elements: int | None = None) -> int:
    """Rows per chunk of a map's pass over N×K rows: a whole number of the score checks'
    chunks (:func:`~curvcal.calibration.inputs.chunk_rows`, so a fault is named by the same
    rows however a map chunks), about ``elements`` entries (default: one check chunk)."""
    rows = chunk_rows(n_classes)
    if elements is None:
        return rows
    return rows * max(1, round(elements / (rows * max(1, n_classes))))


def apply_by_rows(
    scores: Any,
    kind: str,
    source: str,
    method: str,
    n_classes: int,
    block_map: Callable[[torch.Tensor], torch.Tensor],
    elements: int | None = None,
) -> torch.Tensor:
    """float64 log-probabilities of N×K ``scores`` after a per-row map fitted on ``n_classes``
    classes (``block_map`` on row chunks of their log-probabilities, :func:`by_rows`); another
    K is an :class:`InputError` naming ``source``.

    The scores are checked and turned into log-probabilities chunk by chunk as the map reads
    them (:func:`~curvcal.calibration.inputs.chunk_log_probabilities`, the checks of
    :func:`~curvcal.calibration.inputs.log_probabilities` on the same chunks), so no N×K
    float64 copy of them is made beside the result."""
    from curvcal.calibration.inputs import chunk_log_probabilities, validated_scores

    z = validated_scores(scores, kind, source)
    n, k = z.shape
    if k != n_classes:
        raise InputError(source, f"has {k} classes but the {method} map has {n_classes}")
    out = torch.empty((n, k), dtype=torch.float64)
    check = chunk_rows(k)
    step = map_chunk_rows(k, elements)
    for start in range(0, n, step):
        stop = min(start + step, n)
        parts = [
            chunk_log_probabilities(z[low : min(low + check, stop)], kind, low, source)
            for low in range(start, stop, check)
        ]
        out[start:stop] = block_map(parts[0] if len(parts) == 1 else torch.cat(parts))
    return out


#: Entries per block of rows of :func:`by_columns`: a block's
#: probabilities stay in the first-level cache while they are written out by class (a
#: whole-array transpose reads and writes across it: measured 3–7× slower at 50,000 × 1,000,
#: blocks of 2^18 entries 3–5× slower than these).
TRANSPOSE_ELEMENTS = 1 << 15


def by_columns(logp: torch.Tensor) -> np.ndarray:
    """The probabilities of N×K log-probabilities as a K×N float64 array, one contiguous row
    per class (a one-vs-rest map's per-class work then reads memory in order)."""
    n, k = logp.shape
    columns = np.empty((k, n), dtype=np.float64)
    step = max(1, TRANSPOSE_ELEMENTS // max(1, k))
    for start in range(0, n, step):
        columns[:, start : start + step] = torch.exp(logp[start : start + step]).numpy().T
    return columns


def one_vs_rest_log_probabilities(
    values: torch.Tensor, log_values: torch.Tensor | None = None
) -> torch.Tensor:
    """log q_k = log f_k − log Σ_j f_j of N×K non-negative ``values`` f_k(p_k); a row of
    zeros gives 1/K. ``log_values``: log f_k where the caller has them (a histogram reads them
    from its table of :func:`log_of_values`); otherwise taken here, with an f_k of 0 giving −∞
    without its logarithm being taken (the logarithm of 0 takes many times as long as any
    other, and most f_k are 0 at large K)."""
    values = values.to(torch.float64)
    total = values.sum(dim=1, keepdim=True)
    log_f = log_of_values(values) if log_values is None else log_values.to(torch.float64)
    log_q = log_f.sub_(torch.log(total)) if log_values is None else log_f - torch.log(total)
    empty = (total[:, 0] == 0).nonzero()[:, 0]
    if len(empty):
        log_q[empty] = -math.log(values.shape[1])
    return log_q


def log_of_values(values: torch.Tensor) -> torch.Tensor:
    """log of non-negative float64 ``values`` (a new tensor), −∞ written where a value is 0
    (not computed: the logarithm of 0 is many times slower than any other)."""
    zero = values == 0
    return torch.log(values.masked_fill(zero, 1.0)).masked_fill_(zero, -math.inf)


def exp_of_log_probabilities(log_q: torch.Tensor) -> torch.Tensor:
    """exp(``log_q``), with exp(−∞) = 0 written directly (it takes many times as long as
    any other exponential, and most log q_k of a one-vs-rest map are −∞ at large K)."""
    zero = torch.isneginf(log_q)
    return torch.exp(log_q.masked_fill(zero, 0.0)).masked_fill_(zero, 0.0)


def one_vs_rest_nll(
    logp: torch.Tensor,
    labels: torch.Tensor,
    values: Callable[[torch.Tensor], torch.Tensor],
    elements: int,
) -> float:
    """Mean −log q_y of a one-vs-rest map on float64 N×K ``logp``, from its per-class values
    (``values``: a row chunk's N×K f_k(p_k)) by chunks of about ``elements`` entries, without
    the N×K logarithms of the calibrated rows: −log q_y = log Σ_j f_j − log f_y (log K where
    Σ_j f_j = 0, the uniform row of :func:`one_vs_rest_log_probabilities`)."""
    n, k = logp.shape
    step = max(1, elements // k)
    log_q = torch.empty(n, dtype=torch.float64)
    for start in range(0, n, step):
        f = values(logp[start : start + step])
        total = f.sum(dim=1)
        own = f.gather(1, labels[start : start + step, None])[:, 0]
        log_q[start : start + step] = torch.where(
            total > 0, torch.log(own) - torch.log(total), -math.log(k)
        )
    return float(-log_q.mean())


def mapped_nll(
    logp: torch.Tensor, labels: torch.Tensor, block_map: Callable[[torch.Tensor], torch.Tensor]
) -> float:
    """Mean −log q_y of the rows ``block_map`` gives for float64 N×K ``logp`` (chunks of
    :func:`by_rows`), each chunk's q_y kept and the rest of its rows dropped: :func:`fit_nll`
    of :func:`by_rows` bit for bit, without the N×K calibrated rows."""
    n, k = logp.shape
    own = torch.empty(n, dtype=torch.float64)
    step = map_chunk_rows(k)
    for start in range(0, n, step):
        rows = block_map(logp[start : start + step])
        own[start : start + step] = rows.gather(1, labels[start : start + step, None])[:, 0]
    return float(-own.mean())


def check_classes(n_classes: int, method: str, source: str) -> None:
    """A one-dimensional map needs K ≥ 2 score columns."""
    if n_classes < 2:
        raise InputError(source, f"has {n_classes} class; {method} needs at least 2")


def fit_split(
    scores: Any,
    labels: Any,
    kind: str,
    names: InputNames,
    method: str | None,
    *,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fit split of a map fitted to scores: the N×K float64 log-probabilities of
    ``scores`` of ``kind`` (:func:`log_probabilities`) and the N labels checked against them
    (:func:`class_labels`); with ``method`` (the map's name) K ≥ 2 is required first
    (:func:`check_classes`). Errors call the inputs by ``names``. ``device``: where both live
    (the CPU when None)."""
    logp = log_probabilities(scores, kind, names.scores, device=device)
    n, k = logp.shape
    if method is not None:
        check_classes(k, method, names.scores)
    return logp, class_labels(labels, n, k, names.labels).to(logp.device)


def top_label_targets(logp: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """What a top-label map is fitted to: each row's confidence max_k p_k (float64, from the
    log-probabilities ``logp``; the first index on ties) and whether its argmax is the label
    (1.0 or 0.0)."""
    top = logp.argmax(dim=1)
    confidence = torch.exp(logp.gather(1, top[:, None])[:, 0]).numpy()
    return confidence, (top == labels).numpy().astype(np.float64)


def fit_nll(logq: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean −log q_y (in-sample NLL of a fitted map; ∞ when some q_y is 0)."""
    return float(-logq.gather(1, labels[:, None]).mean())


def float_rows(
    first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Each map's pair of rows (bin edges and values, knots x and y) as float64 arrays."""
    return tuple(
        (np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
        for a, b in zip(first, second, strict=True)
    )


def row_fields(first: str, second: str) -> tuple[Field, ...]:
    """The saved fields of a row map's rows: ``n_classes`` K ≥ 2 and the tables ``first`` and
    ``second`` (edges and values, x and y), one row each per map (rows may differ in length),
    every number in [0, 1]."""
    return (
        integer("n_classes", 2),
        array(first, (None, None), 0.0, 1.0),
        array(second, (None, None), 0.0, 1.0),
    )


def check_row_count(values: dict[str, Any], first: str, second: str, source: str) -> None:
    """A saved top-label map holds one row of each of its row fields ``first`` and ``second``
    (edges and values, x and y), a one-vs-rest map (``-ovr``) one per class; a fault is an
    :class:`InputError` naming ``source``."""
    method, k = values["method"], values["n_classes"]
    rows = k if method.endswith("-ovr") else 1
    if len(values[first]) != rows or len(values[second]) != rows:
        raise InputError(
            source,
            f"{method} with {k} classes needs {rows} row(s) of {first} and {second}, got "
            f"{len(values[first])} and {len(values[second])}",
        )


_Fit = TypeVar("_Fit")


class RowMap(SavedMap):
    """A saved map that acts on each row of log-probabilities alone (histogram binning,
    isotonic regression, BBQ): a subclass gives ``method``, ``n_classes``, ``_map_rows`` (log q
    of a chunk of float64 log-probabilities) and the rules its saved rows obey
    (:meth:`check_rows`), and the scores are read, checked and mapped chunk by chunk
    (:func:`apply_by_rows`, :attr:`_chunk` entries at a time) for :meth:`apply` and
    :meth:`probabilities` alike. Its saved body is its fields (:class:`SavedMap`)."""

    method: str
    n_classes: int

    def __post_init__(self) -> None:
        """A map built in Python is checked as a saved body would be (naming ``calibrator``)."""
        self.check_rows(read_fields(self.to_dict(), self.FIELDS, "calibrator"), "calibrator")

    @classmethod
    def check_rows(cls, values: dict[str, Any], source: str) -> None:
        """What the rows of checked ``values`` (:func:`read_fields`) must satisfy beyond each
        field's own rules (a subclass's); a fault is an :class:`InputError` naming ``source``."""

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> Any:
        """The map of checked ``values``, its rows checked first (:meth:`check_rows`)."""
        cls.check_rows(values, source)
        return super().from_fields(values, source)

    @property
    def _chunk(self) -> int | None:
        """Entries per row chunk: :data:`ONE_VS_REST_CHUNK` for a one-vs-rest map (``-ovr``:
        its work arrays stay in cache), the checks' own chunk (``None``) for the others."""
        return ONE_VS_REST_CHUNK if self.method.endswith("-ovr") else None

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _values(self, logp: torch.Tensor) -> torch.Tensor:
        """N×K f_k(p_k) of a one-vs-rest map (before the renormalisation)."""
        raise NotImplementedError

    def in_sample_nll(self, logp: torch.Tensor, labels: torch.Tensor) -> float:
        """Mean −log q_y of the map on float64 ``logp`` and ``labels`` (on its fit split: the
        fit record's ``nll_after``), without the N×K calibrated rows: a one-vs-rest map's from
        its per-class values (:func:`one_vs_rest_nll`), any other's row chunk by row chunk
        (:func:`mapped_nll`)."""
        if self.method.endswith("-ovr"):
            return one_vs_rest_nll(logp, labels, self._values, ONE_VS_REST_CHUNK)
        return mapped_nll(logp, labels, self._map_rows)

    def fit_record(
        self, record: Callable[..., _Fit], logp: torch.Tensor, labels: torch.Tensor, **own: Any
    ) -> _Fit:
        """The fit record ``record`` (a :class:`~curvcal.calibration.results.MapFit`) of this
        map fitted on the float64 ``logp`` and ``labels``: the map's own fields ``own``, then
        what every fit records, the mean NLL before (:func:`fit_nll`) and after
        (:meth:`in_sample_nll`), the N samples and the map itself."""
        return record(
            **own,
            nll_before=fit_nll(logp, labels),
            nll_after=self.in_sample_nll(logp, labels),
            n_samples=logp.shape[0],
            calibrator=self,
        )

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities of N×K ``scores`` after the map."""
        return apply_by_rows(
            scores, kind, source, self.method, self.n_classes, self._map_rows, self._chunk
        )

    def probabilities(
        self, scores: Any, kind: str = "logits", source: str = "scores"
    ) -> torch.Tensor:
        """float64 calibrated probabilities of N×K ``scores``: exp of :meth:`apply`, taken chunk
        by chunk as the map writes it (no N×K log-probabilities beside the result; exp(−∞) = 0
        written, not computed: :func:`exp_of_log_probabilities`)."""
        return apply_by_rows(
            scores,
            kind,
            source,
            self.method,
            self.n_classes,
            lambda logp: exp_of_log_probabilities(self._map_rows(logp)),
            self._chunk,
        )
