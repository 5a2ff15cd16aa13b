"""Inductive Venn–Abers predictors (IVAP; Vovk & Petej 2014, Vovk, Petej & Fedorova 2015).

For a test score s and a calibration set of (score, label) pairs, let p0(s) and p1(s) be the
values at s of the isotonic regressions of the calibration set with (s, 0), resp. (s, 1),
added. The IVAP gives the interval [p0, p1] and the merged probability (the log-loss-optimal
merge of the 2015 paper)

    p = p1 / (1 − p0 + p1).

p0 < 1 and p1 > 0 always (the added point pulls its own block), so p lies strictly inside
(0, 1) and no row of a fitted map has an infinite NLL.

Conventions:

* **score**: the log-odds of the class, s_k = log p_k − log(1 − p_k), from the float64
  log-probabilities (log_softmax of the logits; log(1 − p_k) as log1p(−p_k) where p_k ≤ 1/2
  and as the logsumexp of the other classes above, exact where p_k rounds to 1; logarithms of
  rounded probabilities raised to :data:`~curvcal.calibration.linear.LOG_FLOOR`). Isotonic
  regression depends only on the order of the scores, so this is the IVAP of p_k itself, as
  the ``venn-abers`` package takes it (``p_cal[:, 1]``), except that rows whose p_k rounds to
  the same float64 number (saturated rows, p_k = 1.0) stay apart here and are one tie group
  there. Scores equal in exact arithmetic but rounded apart (rows of whole-number logits in
  another order) are not merged; probabilities computed another way may round them together.
* **ties**: calibration scores that are equal (exactly, as ``numpy.unique`` has them) are one
  point whose target is their mean, weight their count (scikit-learn's and the package's
  rule). A test score equal to a calibration score joins its group: p0 is then the value of
  the gap just above it and p1 the value of the gap just below (adding a 0 at a tie group
  pools it with the group as adding it just above does; a 1, as just below), the lookups
  ``searchsorted(c, s, "right")`` and ``"left"`` that the package uses.
* **binary** (K = 2): one IVAP of class 1 (score log p_1 − log p_0), q_1 = p, q_0 = 1 − p, as
  the package's ``VennAbers``; **multiclass** (K > 2): one IVAP per class k of 1[y = k] on
  s_k (one-vs-all, the package's ``va_type="one_vs_all"``), then q_k = p_k / Σ_j p_j
  (renormalised as curvcal's other one-vs-rest maps). A class absent from the fit split still
  gets its map (p0 = 0, p1 = 1/(n_above + 1)); the package drops such classes.
* **fit**: on the cumulative sum diagram P_0 = (0, 0), P_{g+1} = P_g + (w_g, h_g) of the
  groups g = 0 … m−1 in score order (w_g samples, h_g positives), adding (s, y) in the gap
  below group i inserts the step (1, y) after P_i, and the isotonic value at s is the slope of
  the greatest convex minorant over that step: the lower common tangent of the lower hull of
  P_0 … P_i and of the lower hull of P_i … P_m shifted by (1, y). Every prefix hull and every
  suffix hull is a chain of parent links (one stack pass each, over the points the diagram
  rises after: no other point is a hull vertex; every other point's link by binary lifting),
  and the tangent of every gap is found at once by alternating binary-lifting searches along the two chains (Preparata &
  Hong's merge: the left end only moves left, the right end only right); all coordinates are
  whole numbers, compared exactly. O(m log m) per map, m the distinct scores.
* **saved form**: per map the distinct calibration scores c (rising) at which p0 or p1
  changes (a score between two gaps of equal values is left out, which changes no value: most
  are, where the fit split has many samples per step) and p0, p1 per gap (len(c) + 1 each: gap i
  holds the scores with exactly i of c below them). Applying it is a binary search: nothing
  runs from the file.

The fit record carries the interval's width p1 − p0 at the fit split's own scores (in-sample;
its mean and maximum over samples and maps): how far the two isotonic fits disagree, the
IVAP's own measure of how little the calibration set says there. Pure: no file I/O, no
printing, no global RNG.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from curvcal.calibration.inputs import INPUTS, InputNames
from curvcal.calibration.linear import LOG_FLOOR
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import SavedMap, choice, integer, read_fields
from curvcal.calibration.saved import array as saved_array
from curvcal.calibration.univariate import (
    apply_by_rows,
    fit_nll,
    fit_split,
    one_vs_rest_log_probabilities,
)
from curvcal.errors import InputError

METHOD = "venn-abers"


# ---------------------------------------------------------------------------------------------
# scores


def log_odds(logp: torch.Tensor) -> np.ndarray:
    """N×K float64 log-odds log p_k − log(1 − p_k) of float64 N×K log-probabilities, both
    logarithms raised to :data:`LOG_FLOOR`; 1 − p_k is log1p(−p_k) where p_k ≤ 1/2 and the
    logsumexp of the other classes where p_k > 1/2 (only a row's top class can be)."""
    logs = logp.clamp_min(LOG_FLOOR)
    rest = torch.log1p(-torch.exp(logs).clamp_max(0.5))
    log_c, top = logp.max(dim=1)
    big = (log_c > -math.log(2.0)).nonzero()[:, 0]
    if len(big):
        others = logp[big].scatter(1, top[big, None], -math.inf)
        rest[big, top[big]] = torch.logsumexp(others, dim=1)
    return (logs - rest.clamp_min(LOG_FLOOR)).numpy()


#: Entries per row chunk of a pass over N×K scores: its work arrays are a few of these (a few
#: MB), not a few N×K.
CHUNK_ELEMENTS = 1 << 20


def _row_chunks(n: int, k: int) -> list[slice]:
    """Row slices of about :data:`CHUNK_ELEMENTS` entries of an N×K array."""
    step = max(1, CHUNK_ELEMENTS // max(1, k))
    return [slice(start, start + step) for start in range(0, n, step)]


def log_odds_by_class(logp: torch.Tensor, columns: list[int]) -> np.ndarray:
    """:func:`log_odds` of the ``columns`` of N×K ``logp`` as a len(columns)×N array, one
    contiguous row per class, computed by row chunks (no N×K temporaries)."""
    n, k = logp.shape
    out = np.empty((len(columns), n))
    for rows in _row_chunks(n, k):
        out[:, rows] = log_odds(logp[rows])[:, columns].T
    return out


# ---------------------------------------------------------------------------------------------
# the fit: p0 and p1 of every gap


def _lower_hull_links(x: np.ndarray, y: np.ndarray, reverse: bool) -> np.ndarray:
    """For each point j of the diagram (x rising strictly, y not falling), its neighbour on
    the lower hull of the points 0 … j (``reverse`` False: the previous vertex) or of j … m
    (``reverse`` True: the next vertex); the end of every chain (point 0, resp. m) links to
    itself; collinear points are dropped from the hull.

    Only a corner (a point the diagram rises after: y_{v+1} > y_v) or an end of the range can
    be a vertex of the lower hull of a range of points: after any other point the hull's edge
    is flat, and the edge before it cannot be flatter than that without the point lying on
    it. So one stack pass runs over the corners and the two ends only (a one-vs-all map has as
    many as its class has samples), and every other point's neighbour is its tangent to the
    chain of the nearest corner on the chain's side, found by binary lifting (the stack pass
    would pop a prefix of that chain: the chain is convex)."""
    n = len(x)
    corner = np.empty(n, dtype=bool)
    corner[:-1] = y[1:] > y[:-1]
    corner[0] = corner[-1] = True
    ends = np.flatnonzero(corner)
    xc, yc = x[ends], y[ends]
    local = _stack_links(xc, yc, reverse)
    link = np.arange(n, dtype=np.int64)
    link[ends] = ends[local]
    rest = np.flatnonzero(~corner)
    if not len(rest):
        return link
    above = np.searchsorted(ends, rest)
    start = above if reverse else above - 1
    tables = lifting_tables(local)
    xj, yj = x[rest], y[rest]
    turn = -1.0 if reverse else 1.0

    def popped(v: np.ndarray) -> np.ndarray:
        # the stack pass's test at j: v leaves unless strictly below the chord link(v)–j
        a = local[v]
        cross = (xc[v] - xc[a]) * (yj - yc[a]) - (yc[v] - yc[a]) * (xj - xc[a])
        return (a != v) & (turn * cross <= 0)

    first = popped(start)
    cur = start
    for table in reversed(tables):
        target = table[cur]
        cur = np.where(first & popped(target), target, cur)
    link[rest] = ends[np.where(first, local[cur], start)]
    return link


def _stack_links(x: np.ndarray, y: np.ndarray, reverse: bool) -> np.ndarray:
    """:func:`_lower_hull_links` of every point by one stack pass (points 0 … n−1, x rising
    strictly)."""
    n = len(x)
    link = list(range(n))
    xs, ys = x.tolist(), y.tolist()
    order = range(n - 1, -1, -1) if reverse else range(n)
    turn = -1.0 if reverse else 1.0  # the sign of (b − a) × (j − a) that keeps b
    stack: list[int] = []
    stack_x: list[float] = []
    stack_y: list[float] = []
    for j in order:
        xj, yj = xs[j], ys[j]
        while len(stack) > 1:
            ax, ay, bx, by = stack_x[-2], stack_y[-2], stack_x[-1], stack_y[-1]
            if turn * ((bx - ax) * (yj - ay) - (by - ay) * (xj - ax)) > 0:
                break  # b is strictly below the chord a–j: it stays on the hull
            stack.pop()
            stack_x.pop()
            stack_y.pop()
        if stack:
            link[j] = stack[-1]
        stack.append(j)
        stack_x.append(xj)
        stack_y.append(yj)
    return np.array(link, dtype=np.int64)


@dataclass(frozen=True)
class _Chains:
    """The hull chains of one diagram in one direction: ``tables[k][j]``, the vertex 2^k links
    from j (a chain's end links to itself), and each vertex's edge to its next one (``dx``,
    ``dy``; 0 at a chain's end)."""

    tables: list[np.ndarray]
    dx: np.ndarray
    dy: np.ndarray


def _chains(x: np.ndarray, y: np.ndarray, reverse: bool) -> _Chains:
    link = _lower_hull_links(x, y, reverse)
    return _Chains(lifting_tables(link), x[link] - x, y[link] - y)


def lifting_tables(link: np.ndarray) -> list[np.ndarray]:
    """The binary-lifting tables of ``link`` (each index's next one; a chain's end links to
    itself): ``tables[k][j]`` is the index 2^k links from j, up to the first k at which every
    index has reached its chain's end."""
    tables = [link]
    while True:
        step = tables[-1][tables[-1]]
        if np.array_equal(step, tables[-1]):
            return tables
        tables.append(step)


def gap_values(weights: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p0, p1): the isotonic value at an added point with label 0, resp. 1, in every gap
    i = 0 … m of m ordered tie groups of ``weights`` samples with ``positives`` ones (module
    docstring: the lower common tangent of the prefix hull ending at P_i and the suffix hull
    starting at P_i + (1, label)). The hulls are shared by the two labels."""
    x = np.concatenate([[0], np.cumsum(weights)]).astype(np.float64)
    y = np.concatenate([[0], np.cumsum(positives)]).astype(np.float64)
    left, right = _chains(x, y, reverse=False), _chains(x, y, reverse=True)
    p0, p1 = (_tangent_slopes(x, y, left, right, float(label)) for label in (0, 1))
    return p0, p1


def _tangent_slopes(
    x: np.ndarray, y: np.ndarray, left: _Chains, right: _Chains, rise: float
) -> np.ndarray:
    """Slope of the lower common tangent, for every gap i, of the prefix hull ending at
    (x_i, y_i) (``left``) and the suffix hull starting there (``right``) shifted by
    (1, ``rise``): Preparata & Hong's walk, the left end moving left and the right end right,
    each move a binary-lifting search for the tangent from the other end. A gap is done when a
    round leaves its right end in place (its left end is then the tangent from it already)."""
    a = np.arange(len(x))  # tangent vertex on the prefix hull, per gap
    b = np.arange(len(x))  # on the suffix hull
    active = np.arange(len(x))
    while len(active):
        fixed = (x[b[active]] + 1.0, y[b[active]] + rise)
        cur = _walk(left, a[active], (x, y, 0.0, 0.0), fixed, 1.0)
        a[active] = cur
        cur = _walk(right, b[active], (x, y, 1.0, rise), (x[cur], y[cur]), -1.0)
        moved = cur != b[active]
        b[active] = cur
        active = active[moved]
    return (y[b] + rise - y[a]) / (x[b] + 1.0 - x[a])


def _walk(
    chains: _Chains,
    start: np.ndarray,
    points: tuple[np.ndarray, np.ndarray, float, float],
    fixed: tuple[np.ndarray, np.ndarray],
    side: float,
) -> np.ndarray:
    """From each ``start`` vertex, the first vertex along its chain whose step to the next one
    does not lower the line to the chain's other end ``fixed`` (right of the chain for ``side``
    1, left for −1); ``points``: the vertices' x, y and the shift of the chain. A step lowers
    the line where the next vertex lies strictly below it, which holds on a run of the chain
    from the start up to the tangent (the chain is convex), so binary lifting finds its end.
    Exact: every coordinate is a whole number."""
    x, y, shift_x, shift_y = points
    fx, fy = fixed
    fx, fy = fx - shift_x, fy - shift_y

    def steps(v: np.ndarray) -> np.ndarray:
        # the next vertex below the line v–fixed: side · (fixed − v) × edge < 0
        return side * ((fx - x[v]) * chains.dy[v] - (fy - y[v]) * chains.dx[v]) < 0

    cur = start
    for table in reversed(chains.tables):
        target = table[cur]
        cur = np.where(steps(target), target, cur)
    return np.where(steps(cur), chains.tables[0][cur], cur)


def interval_of(
    scores: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(c, p0, p1, m) of one IVAP fitted on float64 ``scores`` and 0/1 ``labels``: the distinct
    scores (rising) at which p0 or p1 changes, the values of every gap between them
    (:func:`gap_values`) and the number m of distinct scores. A score between two gaps of
    equal p0 and p1 is left out: the two gaps are one, and a new score equal to it gets the
    same values either way (p0 from the gap above, p1 from the gap below)."""
    c, group, weights = np.unique(scores, return_inverse=True, return_counts=True)
    positives = np.bincount(group.reshape(-1), weights=labels, minlength=len(c))
    p0, p1 = gap_values(weights, positives)
    change = (p0[:-1] != p0[1:]) | (p1[:-1] != p1[1:])
    if not change.any():  # one constant map: keep one score
        change[0] = True
    after = np.flatnonzero(change) + 1
    kept_p0 = np.concatenate([p0[:1], p0[after]])
    return c[change], kept_p0, np.concatenate([p1[:1], p1[after]]), len(c)


def lookup(c: np.ndarray, p0: np.ndarray, p1: np.ndarray, s: np.ndarray) -> tuple[Any, Any]:
    """(p0(s), p1(s)) of a fitted IVAP at scores ``s``: gap searchsorted(c, s, "right") for p0
    and "left" for p1 (the tie rule of the module docstring)."""
    return p0[np.searchsorted(c, s, "right")], p1[np.searchsorted(c, s, "left")]


def merged(low: Any, high: Any) -> Any:
    """p = p1 / (1 − p0 + p1) (the log-loss merge of Vovk, Petej & Fedorova 2015)."""
    return high / (1.0 - low + high)


#: The saved body: per map the calibration scores c (log-odds, rising) and the values p0, p1
#: of every gap between them, probabilities.
FIELDS = (
    choice("method", (METHOD,)),
    integer("n_classes", 2),
    saved_array("c", (None, None)),
    saved_array("p0", (None, None), 0.0, 1.0),
    saved_array("p1", (None, None), 0.0, 1.0),
)


@dataclass(frozen=True)
class VennAbersMap(SavedMap):
    """Fitted inductive Venn–Abers predictor(s): one map (K = 2: class 1 against class 0) or
    one per class (K > 2, one-vs-all), each the distinct calibration scores ``c`` and the
    values ``p0``, ``p1`` of every gap (len(c) + 1 each); scores are log-odds. Each row is an
    ``array("d")`` (:func:`float_row`): 8 bytes a number, where a tuple of floats takes 32,
    and a map keeps up to three numbers per fit sample and class."""

    FIELDS = FIELDS

    n_classes: int
    c: tuple[array[float], ...]
    p0: tuple[array[float], ...]
    p1: tuple[array[float], ...]
    method: str = METHOD

    def __post_init__(self) -> None:
        fields = (self.c, self.p0, self.p1)
        if all(_is_row(row) for rows in fields for row in rows):
            views = tuple([np.frombuffer(row, dtype=np.float64) for row in rows] for rows in fields)
            head = {"method": self.method, "n_classes": self.n_classes}
            parts = _check_map(head, "calibrator", views)
        else:  # rows of another kind: checked (and their faults named) as a file's would be
            parts = _check_map(self.to_dict(), "calibrator")
        self.__dict__["_arrays"] = list(zip(*parts, strict=True))  # the cached property

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibrator") -> VennAbersMap:
        """Rebuild from :meth:`to_dict` output; every fault is an :class:`InputError` naming
        ``source``."""
        c, p0, p1 = (tuple(map(float_row, part)) for part in _check_map(data, source))
        return cls(data["n_classes"], c, p0, p1)

    @cached_property
    def _arrays(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [
            (np.asarray(c), np.asarray(p0), np.asarray(p1))
            for c, p0, p1 in zip(self.c, self.p0, self.p1, strict=True)
        ]

    def intervals(self, logp: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(p0, p1) of float64 N×K log-probabilities: N×1 (K = 2, class 1) or N×K."""
        n, k = logp.shape
        shape = (n, 1 if self.n_classes == 2 else k)
        low, high = np.empty(shape), np.empty(shape)
        for rows in _row_chunks(n, k):
            low[rows], high[rows] = self._chunk_intervals(logp[rows])
        return low, high

    def _chunk_intervals(self, logp: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(p0, p1) of a row chunk, N×1 or N×K C-ordered; the lookups run by class on a
        class-major copy of the scores (a column of a row-major chunk is read with one cache
        miss per row)."""
        s = log_odds(logp)
        if self.n_classes == 2:
            s = s[:, 1:]
        by_class = np.ascontiguousarray(s.T)
        low, high = np.empty_like(by_class), np.empty_like(by_class)
        for k, (c, p0, p1) in enumerate(self._arrays):
            low[k], high[k] = lookup(c, p0, p1, by_class[k])
        return np.ascontiguousarray(low.T), np.ascontiguousarray(high.T)

    def _map_rows(self, logp: torch.Tensor) -> torch.Tensor:
        return self._log_rows(*self._chunk_intervals(logp))

    def _log_rows(self, low: np.ndarray, high: np.ndarray) -> torch.Tensor:
        """log q of the rows whose intervals are (``low``, ``high``)."""
        p = torch.from_numpy(merged(low, high))
        if self.n_classes == 2:
            return torch.cat([torch.log1p(-p), torch.log(p)], dim=1)
        return one_vs_rest_log_probabilities(p)

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities of N×K ``scores`` after the map."""
        return apply_by_rows(
            scores, kind, source, METHOD, self.n_classes, self._map_rows, CHUNK_ELEMENTS
        )

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        """float64 calibrated probabilities of N×K ``scores`` (exp of :meth:`apply`, by row
        chunks)."""
        return apply_by_rows(
            scores,
            kind,
            source,
            METHOD,
            self.n_classes,
            lambda logp: torch.exp(self._map_rows(logp)),
            CHUNK_ELEMENTS,
        )


@dataclass(frozen=True)
class VennAbersFit(MapFit[VennAbersMap]):
    """An IVAP fitted on one split: ``input`` (the score), ``distinct_scores`` per map and the
    ``knots`` kept of them (where p0 or p1 changes), the
    in-sample width p1 − p0 at the fit scores (``width_mean``, ``width_max``), NLL before and
    after on the fit split (in-sample)."""

    method: str
    input: str
    distinct_scores: tuple[int, ...]
    knots: tuple[int, ...]
    n_parameters: int
    width_mean: float
    width_max: float


def fit_venn_abers(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    names: InputNames = INPUTS,
) -> VennAbersFit:
    """Fit the inductive Venn–Abers predictor on (``scores``, ``labels``): binary for K = 2,
    one-vs-all for K > 2 (module docstring)."""
    logp, y = fit_split(scores, labels, kind, names, "Venn-Abers")
    n, k = logp.shape
    if n == 0:
        raise InputError(names.scores, "has no samples; Venn-Abers needs at least one to fit")
    targets = y.numpy()
    columns = [1] if k == 2 else list(range(k))
    s = log_odds_by_class(logp, columns)
    maps: list[tuple[array[float], ...]] = []  # (c, p0, p1) per map, kept as rows at once
    fitted_sizes = []  # (kept scores, distinct scores) per map
    for i, j in enumerate(columns):
        c, p0, p1, m = interval_of(s[i], (targets == j).astype(np.float64))
        maps.append((float_row(c), float_row(p0), float_row(p1)))
        fitted_sizes.append((len(c), m))
    del s
    c_rows, p0_rows, p1_rows = zip(*maps, strict=True)
    del maps
    calibrator = VennAbersMap(k, c_rows, p0_rows, p1_rows)
    del c_rows, p0_rows, p1_rows
    width = np.empty((n, len(columns)))
    own = torch.empty(n, 1, dtype=torch.float64)  # log q_y of every fit row
    for rows in _row_chunks(n, k):
        low, high = calibrator._chunk_intervals(logp[rows])
        width[rows] = high - low
        own[rows] = calibrator._log_rows(low, high).gather(1, y[rows, None])
    return VennAbersFit(
        method=METHOD,
        input="log-odds of class 1" if k == 2 else "log-odds of each class vs rest",
        distinct_scores=tuple(m for _, m in fitted_sizes),
        knots=tuple(kept for kept, _ in fitted_sizes),
        n_parameters=sum(3 * kept + 2 for kept, _ in fitted_sizes),
        width_mean=float(width.mean()),
        width_max=float(width.max()),
        nll_before=fit_nll(logp, y),
        nll_after=float(-own.mean()),  # fit_nll of the mapped rows
        n_samples=n,
        calibrator=calibrator,
    )


def float_row(values: np.ndarray) -> array[float]:
    """A float64 array as an ``array("d")`` of the same numbers (bit for bit)."""
    row = array("d")
    row.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    return row


def _is_row(row: Any) -> bool:
    return isinstance(row, array) and row.typecode == "d" and len(row) > 0


def _check_map(
    data: Any, source: str, rows: tuple[list[np.ndarray], ...] | None = None
) -> tuple[list[np.ndarray], ...]:
    """The rows (c, p0, p1) of a saved map, checked; ``rows`` given: those, already float64
    arrays (a map made in memory), checked for everything but their JSON form."""
    if rows is None:
        data = read_fields(data, FIELDS, source)
    else:
        read_fields(data, FIELDS[:2], source)
    k = data["n_classes"]
    n_rows = 1 if k == 2 else k
    parts = []
    for i, name in enumerate(("c", "p0", "p1")):
        value = data[name] if rows is None else rows[i]
        if len(value) != n_rows:
            raise InputError(source, f"{METHOD} with {k} classes needs {n_rows} row(s) of {name}")
        if rows is not None and not all(np.isfinite(row).all() for row in value):
            raise InputError(source, f"{name} must be finite")
        parts.append(value)
    for c, p0, p1 in zip(*parts, strict=True):
        if len(p0) != len(c) + 1 or len(p1) != len(c) + 1:
            raise InputError(source, "every row of p0 and p1 needs one more value than c")
        if not (np.diff(c) > 0).all():
            raise InputError(source, "c must rise strictly")
        if (p0 < 0).any() or (p0 >= 1).any() or (p1 <= 0).any() or (p1 > 1).any():
            raise InputError(source, "p0 must lie in [0, 1) and p1 in (0, 1]")
        if (np.diff(p0) < 0).any() or (np.diff(p1) < 0).any():
            raise InputError(source, "p0 and p1 must not fall")
    return parts[0], parts[1], parts[2]
