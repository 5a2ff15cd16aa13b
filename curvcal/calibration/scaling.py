"""Temperature scaling and focal temperature scaling: fit on one split, apply to another.

Temperature scaling (Guo et al. 2017): p = softmax(z / T), T > 0. With s = 1/T the NLL
N(s) = mean[logsumexp(s·z) - s·z_y] is convex in s, with dN/ds = mean[E_p z - z_y] and
d²N/ds² = mean[Var_p z]. The NLL fit runs a bounded Brent search on ln T over the bracket
(default T ∈ [0.01, 100]; it can never return T <= 0 or NaN) unless the slope at an end
of the bracket already shows the minimum lies on that end, then polishes with safeguarded
Newton steps in s inside the bracket until |dN/d ln T| < 1e-10. The ``"ece"``/``"adaece"``
objectives pick T on a lattice of step ``grid_step`` in ln T over the bracket (Mukhoti et al.
2020 pick T by grid search): the lowest objective, ties to the T closest to 1, found without
visiting the whole lattice by the exact bound of :mod:`curvcal.calibration.lattice`.

Focal temperature scaling (Komisarenko & Kull 2024): p = φ_γ(softmax(z / T)), φ_γ the focal
calibration map. For every γ of the grid (default includes 0, which is temperature scaling
exactly) T is fitted over the bracket by the same routine as above, each γ's search starting
where the previous one crossed (the optimum T grows with γ); γ is then the grid value with the
lowest objective (``"ece"`` by default, ``"nll"`` optional). The ECE searches run on float32
top-label confidences of a fused kernel (:func:`focal_top_confidence`), exact in their binning,
and every near-tie is decided in float64. φ_γ preserves the order
of the classes, so predictions never change and the correctness vector is that of z.

Scores are converted once to float64 log-probabilities (log_softmax); T then divides those,
which gives the same softmax as dividing the logits.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from curvcal.calibration import bins as binning
from curvcal.calibration import lattice
from curvcal.calibration.focal import check_gamma, focal_top_confidence
from curvcal.calibration.inputs import (
    INPUTS,
    InputNames,
    accepts_source_keywords,
    check_bins,
    chunk_rows,
)
from curvcal.calibration.maps import calibrated as _calibrated
from curvcal.calibration.metrics import binned_errors
from curvcal.calibration.results import (
    Calibrator,
    FocalProfilePoint,
    FocalTemperatureFit,
    TemperatureFit,
)
from curvcal.calibration.univariate import fit_split
from curvcal.errors import InputError
from curvcal.settings.calibration import DEFAULT_GAMMAS as DEFAULT_GAMMAS
from curvcal.settings.calibration import MAX_GAMMA
from curvcal.settings.calibration import OBJECTIVES_FTS as OBJECTIVES_FTS
from curvcal.settings.calibration import OBJECTIVES_TS as OBJECTIVES_TS

#: The focal-TS objective of Komisarenko & Kull's code: AdaECE (equal-mass bins) on the
#: linear grid T = 0.05, 0.10, ..., 5.00, the first minimum taken, for each γ; γ likewise.
AUTHORS_OBJECTIVE = "adaece-grid"
AUTHORS_T_GRID = tuple(round(0.05 * i, 2) for i in range(1, 101))
DEFAULT_BRACKET = (0.01, 100.0)
DEFAULT_GRID_STEP = 0.01
POLISH_TOL = 1e-10
SEARCH_PASSES = 80
#: Bound on |float32 - float64| of a top-label confidence of the fast search (seen: 2.5e-7 at
#: K = 1,000); the float64 comparison of the final candidates checks it.
FLOAT32_ERROR = 1e-5
#: Margin of the comparisons of float64 objective values (summation order only).
EXACT_TOLERANCE = 1e-12
#: Curvature d²N/d(ln s)² below which the NLL counts as flat (then an end of the bracket is tried).
FLAT_CURVATURE = 1e-8


#: Log-probabilities below this (exact zeros among them) are clamped to it: for every T below
#: about 13,000 its weight exp(s·z) underflows to exactly 0, and products w·z stay finite.
LOG_FLOOR = -1e7


class _Scores:
    """Row-shifted float64 log-probabilities z - max_k z (N×K, top entry 0) with labels.

    Shifting by the row maximum keeps Σ_k exp(s·z_k) in [1, K] for every s > 0, so the NLL,
    its derivatives and the confidence need no further max-subtraction.
    """

    def __init__(self, logp: torch.Tensor, labels: torch.Tensor) -> None:
        n, k = logp.shape
        self.device = device = logp.device
        self.step = chunk_rows(k, device)
        self.labels = labels
        self.top_index = torch.empty(n, dtype=torch.int64, device=device)
        self.correct = torch.empty(n, dtype=torch.float64, device=device)
        self.logp_y = torch.empty(n, dtype=torch.float64, device=device)
        nll_sum = 0.0
        flat = True
        # One cache-sized pass: correctness, NLL at T = 1, the row shift and the label entries.
        for i in range(0, n, self.step):
            block, y = logp[i : i + self.step], labels[i : i + self.step]
            top, prediction = block.max(dim=1, keepdim=True)
            log_y = block.gather(1, y[:, None])
            self.top_index[i : i + self.step] = prediction[:, 0]
            self.correct[i : i + self.step] = (prediction[:, 0] == y).to(torch.float64)
            nll_sum -= float(log_y.sum())
            block -= top  # logp is our own copy
            block.clamp_(min=LOG_FLOOR)
            self.logp_y[i : i + self.step] = (log_y - top).clamp_(min=LOG_FLOOR)[:, 0]
            flat = flat and bool((block.amin(dim=1) == 0).all())
        self.logp = logp
        self.nll_at_one = nll_sum / n  # mean -log p_y of the unscaled scores
        self.flat = flat
        self._logp32: torch.Tensor | None = None

    def chunks(self) -> list[tuple[int, torch.Tensor]]:
        return [(i, self.logp[i : i + self.step]) for i in range(0, self.logp.shape[0], self.step)]

    def single_precision(self) -> torch.Tensor:
        """A float32 copy of the shifted log-probabilities with the top entry of every row
        set to ``LOG_FLOOR`` (made once, for the fast searches).

        Masking the top entry (which is 0, weight exp(s·0) = 1) lets the rest Σ_{j≠top} exp(s·z_j)
        be summed on its own, which the focal confidence needs; it leaves Σ_j w_j·z_j and
        Σ_j w_j·z_j² unchanged, and the NLL pass adds the top weight 1 back.
        """
        if self._logp32 is None:
            masked = torch.empty(self.logp.shape, dtype=torch.float32, device=self.device)
            for i, block in self.chunks():
                rows = masked[i : i + block.shape[0]]
                rows.copy_(block)
                rows.scatter_(1, self.top_index[i : i + block.shape[0], None], LOG_FLOOR)
            self._logp32 = masked
        return self._logp32

    def masked(self, rows: slice | torch.Tensor) -> torch.Tensor:
        """float64 shifted log-probabilities of ``rows`` with the top entry set to ``LOG_FLOOR``."""
        block = self.logp[rows].clone()
        return block.scatter_(1, self.top_index[rows][:, None], LOG_FLOOR)

    def top_confidence(self, s: float, gamma: float, single: bool = False) -> torch.Tensor:
        """Top-label confidence of φ_γ(softmax(s·z)) for every row, as float64 (length N).

        ``single`` computes it from the float32 copy (error about 1e-7, bounded by
        ``FLOAT32_ERROR`` where it matters; see :func:`_fast_point`).
        """
        n = self.logp.shape[0]
        out = torch.empty(n, dtype=torch.float64, device=self.device)
        source = self.single_precision() if single else None
        dtype = torch.float32 if single else torch.float64
        shape = (min(n, self.step), self.logp.shape[1])
        first, second, third = (
            torch.empty(shape, dtype=dtype, device=self.device) for _ in range(3)
        )
        work = (first, second, third)
        for i in range(0, n, self.step):
            rows = slice(i, min(n, i + self.step))
            block = source[rows] if source is not None else self.masked(rows)
            out[rows] = focal_top_confidence(block, s, gamma, work)
        return out

    def log_partition(self, s: float) -> torch.Tensor:
        """log Σ_k exp(s·z_k) for every row (length N)."""
        out = torch.empty(self.logp.shape[0], dtype=torch.float64, device=self.device)
        buffer = torch.empty(
            (self.step, self.logp.shape[1]), dtype=torch.float64, device=self.device
        )
        for i, block in self.chunks():
            work = buffer[: block.shape[0]]
            torch.mul(block, s, out=work).exp_()
            torch.sum(work, dim=1, out=out[i : i + block.shape[0]])
        return out.log_()

    def nll(self, s: float) -> float:
        """Mean NLL of softmax(s·z)."""
        return float((self.log_partition(s) - s * self.logp_y).mean())

    def nll_derivatives(self, s: float, single: bool = False) -> tuple[float, float, float]:
        """(N, dN/ds, d²N/ds²) at s = 1/T in one pass: mean lse - s·z_y, E_p z - z_y, Var_p z.

        ``single`` runs the pass in float32 (about twice as fast; relative error ~1e-6), for
        the search only: every reported number comes from a float64 pass.
        """
        logp = self.single_precision() if single else self.logp
        value = first = second = 0.0
        buffer = torch.empty((self.step, logp.shape[1]), dtype=logp.dtype, device=self.device)
        weighted = torch.empty_like(buffer)
        for i in range(0, logp.shape[0], self.step):
            block = logp[i : i + self.step]
            w = torch.mul(block, s, out=buffer[: block.shape[0]]).exp_()
            total = w.sum(dim=1)
            if single:
                total += 1  # the masked top entry's weight
            wz = torch.mul(w, block, out=weighted[: block.shape[0]])
            mean_z = wz.sum(dim=1).div_(total)
            mean_z2 = wz.mul_(block).sum(dim=1).div_(total)
            value += float(total.log_().sum(dtype=torch.float64))
            first += float(mean_z.sum(dtype=torch.float64))
            second += float(
                mean_z2.sub_(mean_z.mul_(mean_z)).clamp_(min=0).sum(dtype=torch.float64)
            )
        n = logp.shape[0]
        y_sum = float(self.logp_y.sum())
        return (value - s * y_sum) / n, (first - y_sum) / n, second / n

    def confidence(self, s: float) -> torch.Tensor:
        """Top-label confidence of softmax(s·z): 1 / Σ_k exp(s·z_k)."""
        return torch.exp(-self.log_partition(s))

    def scaled_log_probs(self, s: float, gamma: float) -> list[torch.Tensor]:
        return [_calibrated(block, s, gamma) for _, block in self.chunks()]


def _objective(
    scores: _Scores, objective: str, n_bins: int, edges: str
) -> Callable[[float, float], float]:
    """objective(s, γ) of the calibrated scores."""

    def evaluate(s: float, gamma: float) -> float:
        if objective == "nll" and gamma == 0:
            return scores.nll(s)
        if gamma == 0:
            return _binned_value(scores.confidence(s), scores.correct, objective, n_bins, edges)
        blocks = scores.scaled_log_probs(s, gamma)
        if objective == "nll":
            total = sum(
                float(b.gather(1, scores.labels[i : i + b.shape[0], None]).sum())
                for (i, _), b in zip(scores.chunks(), blocks, strict=True)
            )
            return -total / scores.logp.shape[0]
        confidence = torch.exp(torch.cat([b.max(dim=1).values for b in blocks]))
        return _binned_value(confidence, scores.correct, objective, n_bins, edges)

    return evaluate


def _check_objective(objective: str, objectives: tuple[str, ...]) -> None:
    if objective not in objectives:
        raise InputError(
            "objective", f"unknown objective {objective!r}", f"one of {', '.join(objectives)}"
        )


def _check_search(bracket: tuple[float, float], grid_step: float) -> tuple[float, float, float]:
    """The T searched: (T_min, T_max) of ``bracket`` and the lattice step in ln T, checked."""
    low, high = (float(v) for v in bracket)
    if not (0 < low < high < math.inf):
        raise InputError("bracket", f"need 0 < T_min < T_max < inf, got {bracket!r}")
    if not (isinstance(grid_step, int | float) and 0 < grid_step <= 1):
        raise InputError(
            "grid_step", f"the grid step in ln T must lie in (0, 1], got {grid_step!r}"
        )
    return low, high, float(grid_step)


def _binned_value(
    confidence: torch.Tensor, correct: torch.Tensor, objective: str, n_bins: int, edges: str
) -> float:
    """ECE (equal-width bins) or AdaECE (equal-mass bins) of the top-label confidences, binned
    on the CPU (N numbers) wherever they were computed."""
    confidence, correct = confidence.cpu(), correct.cpu()
    if objective == "ece":
        index = binning.equal_width_index(confidence, n_bins, edges)
    else:
        index = binning.equal_mass_index(confidence, n_bins)
    return binned_errors(*binning.bin_sums(index, confidence, correct, n_bins)).ece


def _exact_point(
    scores: _Scores, s: float, gamma: float, objective: str, n_bins: int, edges: str
) -> lattice.LatticePoint:
    """Objective and mean confidence at s = 1/T from float64 confidences (one pass)."""
    confidence = scores.top_confidence(s, gamma)
    value = _binned_value(confidence, scores.correct, objective, n_bins, edges)
    return lattice.LatticePoint(value, float(confidence.mean()))


def _fast_point(
    scores: _Scores, s: float, gamma: float, n_bins: int, edges: str
) -> lattice.LatticePoint:
    """ECE and mean confidence from float32 confidences, each within ``FLOAT32_ERROR``.

    A float32 confidence differs from the float64 one by about 1e-7 (bounded by
    ``FLOAT32_ERROR``), which moves a sum of N confidences by at most N·FLOAT32_ERROR, but
    would put a confidence that close to a bin edge in the wrong bin: those few rows are
    recomputed in float64, so every bin holds exactly the samples it holds in float64 and the
    ECE is off by at most ``FLOAT32_ERROR``.
    """
    confidence = scores.top_confidence(s, gamma, single=True)
    scaled = confidence * n_bins
    nearest = torch.round(scaled)
    near_edge = ((scaled - nearest).abs_() <= FLOAT32_ERROR * n_bins) & (nearest > 0)
    near_edge &= nearest < n_bins
    rows = near_edge.nonzero()[:, 0]
    if rows.numel():
        confidence[rows] = focal_top_confidence(scores.masked(rows), s, gamma)
    value = _binned_value(confidence, scores.correct, "ece", n_bins, edges)
    return lattice.LatticePoint(value, float(confidence.mean()))


@dataclass(frozen=True)
class _GammaFit:
    """The lattice minimum at one γ: index, value (float64 when ``exact``), passes, crossing."""

    index: int
    value: float
    exact: bool
    passes: int
    exact_passes: int
    crossing: int


def _lattice_fit(
    scores: _Scores,
    objective: str,
    gamma: float,
    points: np.ndarray,
    start: int,
    n_bins: int,
    edges: str,
    exact_only: bool = False,
) -> _GammaFit:
    """Minimise ECE/AdaECE over the lattice ``points`` of ln T (see :mod:`lattice`).

    ECE is searched on float32 confidences (:func:`_fast_point`); the points within twice
    ``FLOAT32_ERROR`` of the best are then compared in float64, so the chosen point is the
    one the float64 objective picks over the whole lattice. AdaECE (equal-mass bins depend on
    the order of the confidences) is searched in float64.
    """
    accuracy = float(scores.correct.mean())
    fast = objective == "ece" and not exact_only

    def exact(j: int) -> lattice.LatticePoint:
        return _exact_point(scores, math.exp(-points[j]), gamma, objective, n_bins, edges)

    def quick(j: int) -> lattice.LatticePoint:
        return _fast_point(scores, math.exp(-points[j]), gamma, n_bins, edges)

    tolerance = FLOAT32_ERROR if fast else EXACT_TOLERANCE
    found = lattice.search(len(points), quick if fast else exact, accuracy, start, tolerance)
    passes, exact_passes = len(found.evaluated), 0 if fast else len(found.evaluated)
    values = {j: point.value for j, point in found.evaluated.items()}
    if found.monotone:
        best = min(values.values())
        values = {j: v for j, v in values.items() if v <= best + 2 * tolerance}
        if not fast or len(values) == 1:
            chosen = lattice.pick(points, values)
            return _GammaFit(chosen, values[chosen], not fast, passes, exact_passes, found.crossing)
        checked = {j: exact(j).value for j in values}
        exact_passes += len(checked)
        if all(abs(checked[j] - values[j]) <= tolerance for j in values):
            chosen = lattice.pick(points, checked)
            return _GammaFit(
                chosen, checked[chosen], True, passes + len(checked), exact_passes, found.crossing
            )
        # The float32 error bound failed (never seen): search again in float64.
        redo = _lattice_fit(scores, objective, gamma, points, start, n_bins, edges, True)
        return _GammaFit(
            redo.index,
            redo.value,
            True,
            passes + len(checked) + redo.passes,
            exact_passes + redo.exact_passes,
            redo.crossing,
        )
    # The bound's premise failed (never seen; the search checks it): visit the whole lattice.
    everything = {j: exact(j).value for j in range(len(points))}
    chosen = lattice.pick(points, everything)
    return _GammaFit(
        chosen,
        everything[chosen],
        True,
        passes + len(points),
        exact_passes + len(points),
        found.crossing,
    )


def _search_single(scores: _Scores, s_low: float, s_high: float) -> tuple[float, int]:
    """(s, float32 passes) near the NLL minimum: safeguarded Newton in s = 1/T.

    N(s) is convex, so dN/ds is increasing: every evaluated point with dN/ds < 0 (> 0) is a
    lower (upper) bound of the minimiser. A Newton step that leaves the bracket becomes a step
    to the untried end of the search range (which may hold the minimum) or a geometric
    bisection of the bracket; repeated steps towards an untried end at least double (halve) s,
    so a minimum far away, or on an end, is reached in a few passes. Runs in float32; the
    float64 polish of :func:`_fit_nll_temperature` decides.
    """
    lo, hi = s_low, s_high
    lo_known = hi_known = False  # whether dN/ds < 0 at lo (> 0 at hi) has been seen
    s = min(max(1.0, s_low), s_high)
    streak = 0  # consecutive steps towards an untried end
    for passes in range(1, SEARCH_PASSES + 1):
        _, first, second = scores.nll_derivatives(s, single=True)
        if first == 0 or (s >= s_high and first < 0) or (s <= s_low and first > 0):
            return s, passes
        if first < 0:
            lo, lo_known = s, True
        else:
            hi, hi_known = s, True
        target = s - first / second if second > 0 else (math.inf if first < 0 else 0.0)
        if not (lo_known and hi_known):
            streak += 1
            growth = 2.0 ** (streak - 1)
            target = max(target, s * growth) if first < 0 else min(target, s / growth)
        if not lo < target < hi:
            if target >= hi and not hi_known:
                target = s_high
            elif target <= lo and not lo_known:
                target = s_low
            else:
                target = math.sqrt(lo * hi)
        if abs(target - s) <= 1e-6 * s:
            return target, passes
        s = target
    return s, SEARCH_PASSES


def _fit_nll_temperature(
    scores: _Scores, low: float, high: float
) -> tuple[float, float, float, int]:
    """(T, dN/d ln T at T, NLL at T, float64 evaluations): float32 search, float64 Newton.

    The float32 search (:func:`_search_single`) lands within ~1e-6 of the minimiser; safeguarded
    float64 Newton steps in s = 1/T then polish until |dN/d ln T| < ``POLISH_TOL`` (one or two
    passes from there, the convergence being quadratic), never leaving the bracket.
    """
    if scores.flat:  # every row is constant: the NLL does not depend on T
        return 1.0, 0.0, scores.nll_at_one, 1
    s_low, s_high = 1.0 / high, 1.0 / low
    s, _ = _search_single(scores, s_low, s_high)
    value, first, second = scores.nll_derivatives(s)
    evaluations = 1
    for _ in range(30):
        if abs(s * first) < POLISH_TOL or second <= 0:
            break
        if (s <= s_low and first > 0) or (s >= s_high and first < 0):
            break  # the optimum lies outside the bracket
        step = first / second
        while True:  # safeguard: halve a step that would raise the NLL
            candidate = min(max(s - step, s_low), s_high)
            new_value, new_first, new_second = scores.nll_derivatives(candidate)
            evaluations += 1
            if new_value <= value + 1e-15 * abs(value) or abs(step) < 1e-15 * s:
                break
            step /= 2
        if candidate == s:
            break
        s, value, first, second = candidate, new_value, new_first, new_second
    if s * s * second < FLAT_CURVATURE:
        # The NLL is flat here to working precision (a separable set, say, where it decays
        # towards an end): by convexity the minimum over the bracket may be that end.
        end = s_high if first <= 0 else s_low
        if end != s:
            end_value, end_first, end_second = scores.nll_derivatives(end)
            evaluations += 1
            if end_value <= value:
                s, value, first, second = end, end_value, end_first, end_second
    return 1.0 / s, -s * first, value, evaluations


def _prepare(
    scores: Any,
    labels: Any,
    kind: str,
    bins: int,
    edges: str,
    names: InputNames,
    device: torch.device | None = None,
) -> _Scores:
    check_bins(bins, edges)
    return _Scores(*fit_split(scores, labels, kind, names, None, device=device))


def _nll_fit(
    scores: _Scores,
    evaluate: Callable[[float, float], float],
    gamma: float,
    low: float,
    high: float,
) -> tuple[float, float, int]:
    """(T, NLL at T, passes) for one γ: Brent on ln T, or the TS fit at γ = 0."""
    if gamma == 0:
        temperature, _, value, evaluations = _fit_nll_temperature(scores, low, high)
        return temperature, value, evaluations
    result = minimize_scalar(
        lambda u: evaluate(math.exp(-u), gamma),
        bounds=(math.log(low), math.log(high)),
        method="bounded",
        options={"xatol": 1e-6},
    )
    temperature = min(max(math.exp(float(result.x)), low), high)
    return temperature, evaluate(1.0 / temperature, gamma), int(result.nfev) + 1


def _temperature(points: np.ndarray, index: int, low: float, high: float) -> float:
    return min(max(math.exp(float(points[index])), low), high)  # exp(ln T) may round out


def _at_end(temperature: float, low: float, high: float) -> bool:
    return abs(math.log(temperature / low)) < 1e-9 or abs(math.log(temperature / high)) < 1e-9


@accepts_source_keywords
def fit_temperature(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    objective: str = "nll",
    bins: int = 15,
    edges: str = "left",
    bracket: tuple[float, float] = DEFAULT_BRACKET,
    grid_step: float = DEFAULT_GRID_STEP,
    names: InputNames = INPUTS,
    *,
    device: torch.device | None = None,
) -> TemperatureFit:
    """Fit T of p = softmax(z / T) on (``scores``, ``labels``) by ``objective`` (see module doc).

    ``device``: where the N×K passes run (default: the CPU), in float64 as there
    (:mod:`curvcal.calibration.device`). ``names``: what error messages call the inputs (the
    former keywords ``source`` and ``labels_source`` still work).

    >>> import torch
    >>> z = torch.tensor([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    >>> fit = fit_temperature(z, torch.tensor([0, 1, 1, 0]))
    >>> fit.temperature > 1  # over-confident scores are softened
    True
    """
    _check_objective(objective, OBJECTIVES_TS)
    low, high, step = _check_search(bracket, grid_step)
    data = _prepare(scores, labels, kind, bins, edges, names, device)
    evaluate = _objective(data, objective, bins, edges)
    if objective == "nll":
        temperature, derivative, value, evaluations = _fit_nll_temperature(data, low, high)
        nll_after, objective_before = value, data.nll_at_one
    else:
        points = lattice.lattice(math.log(low), math.log(high), step)
        start = int(np.argmin(np.abs(points)))
        found = _lattice_fit(data, objective, 0.0, points, start, bins, edges)
        temperature = _temperature(points, found.index, low, high)
        value, evaluations = found.value, found.passes
        if not found.exact:
            value = evaluate(1.0 / temperature, 0.0)
            evaluations += 1
        nll_after, first, _ = data.nll_derivatives(1.0 / temperature)
        derivative, objective_before = -first / temperature, evaluate(1.0, 0.0)
    return TemperatureFit(
        temperature=temperature,
        objective=objective,
        objective_before=objective_before,
        objective_after=value,
        nll_before=data.nll_at_one,
        nll_after=nll_after,
        derivative=derivative,
        bracket=(low, high),
        at_bracket_end=_at_end(temperature, low, high),
        grid_step=None if objective == "nll" else step,
        n_evaluations=evaluations,
        n_samples=data.logp.shape[0],
    )


@accepts_source_keywords
def fit_focal_temperature(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    objective: str = "ece",
    gammas: Sequence[float] = DEFAULT_GAMMAS,
    bins: int = 15,
    edges: str = "left",
    bracket: tuple[float, float] = DEFAULT_BRACKET,
    grid_step: float = DEFAULT_GRID_STEP,
    names: InputNames = INPUTS,
    *,
    device: torch.device | None = None,
) -> FocalTemperatureFit:
    """Fit (γ, T) of p = φ_γ(softmax(z / T)): T per γ over ``bracket``, γ by ``objective``.

    Ties between γ values go to the smaller γ. ``gammas=[0]`` is temperature scaling.
    ``device``: where the N×K passes run (default: the CPU), as for :func:`fit_temperature`.
    """
    _check_objective(objective, OBJECTIVES_FTS)
    grid = sorted({check_gamma(g, "gammas", MAX_GAMMA) for g in gammas})
    if not grid:
        raise InputError("gammas", "the gamma grid is empty", "0 is temperature scaling")
    low, high, step = _check_search(bracket, grid_step)
    data = _prepare(scores, labels, kind, bins, edges, names, device)
    if objective == AUTHORS_OBJECTIVE:
        return _authors_fit(data, grid, bins, edges)
    evaluate = _objective(data, objective, bins, edges)
    if objective == "nll":
        profile = []
        for gamma in grid:
            temperature, value, passes = _nll_fit(data, evaluate, gamma, low, high)
            at_end = _at_end(temperature, low, high)
            profile.append(FocalProfilePoint(gamma, temperature, value, at_end, passes))
        chosen = min(profile, key=lambda point: point.objective)  # first minimum: smaller γ
        evaluations = sum(point.n_evaluations for point in profile)
        exact_evaluations = evaluations
    else:
        chosen, profile, evaluations, exact_evaluations = _focal_lattice_fit(
            data, evaluate, objective, grid, low, high, step, bins, edges
        )
    return _focal_fit(
        data,
        chosen,
        profile,
        objective,
        evaluate,
        _objective(data, "nll", bins, edges),
        bracket=(low, high),
        grid_step=None if objective == "nll" else step,
        evaluations=evaluations,
        exact_evaluations=exact_evaluations,
    )


def _focal_fit(
    data: _Scores,
    chosen: FocalProfilePoint,
    profile: list[FocalProfilePoint],
    objective: str,
    evaluate: Callable[[float, float], float],
    nll: Callable[[float, float], float],
    *,
    bracket: tuple[float, float],
    grid_step: float | None,
    evaluations: int,
    exact_evaluations: int,
) -> FocalTemperatureFit:
    """The fit record of the ``chosen`` (γ, T) of a focal-TS ``profile``; ``evaluate`` and
    ``nll`` take (1/T, γ). Two passes more are counted: the objective before, the NLL after."""
    return FocalTemperatureFit(
        gamma=chosen.gamma,
        temperature=chosen.temperature,
        objective=objective,
        objective_before=evaluate(1.0, 0.0),
        objective_after=chosen.objective,
        nll_before=nll(1.0, 0.0),
        nll_after=nll(1.0 / chosen.temperature, chosen.gamma),
        profile=tuple(profile),
        bracket=bracket,
        grid_step=grid_step,
        n_samples=data.logp.shape[0],
        n_evaluations=evaluations + 2,
        n_exact_evaluations=exact_evaluations + 2,
    )


def _authors_fit(data: _Scores, grid: list[float], bins: int, edges: str) -> FocalTemperatureFit:
    """Komisarenko & Kull's selection: for each γ the T of :data:`AUTHORS_T_GRID` with the
    smallest float64 AdaECE (``bins`` equal-mass bins) on the fit split, the first (smallest T)
    on ties; then the γ with the smallest of those, the smaller γ on ties. Exhaustive: one pass
    per (γ, T), no search to stop short."""
    evaluate = _objective(data, "adaece", bins, edges)
    low, high = AUTHORS_T_GRID[0], AUTHORS_T_GRID[-1]
    profile = []
    for gamma in grid:
        values = [evaluate(1.0 / t, gamma) for t in AUTHORS_T_GRID]
        best = min(range(len(values)), key=values.__getitem__)  # first minimum: smaller T
        temperature = AUTHORS_T_GRID[best]
        at_end = best in (0, len(values) - 1)
        profile.append(FocalProfilePoint(gamma, temperature, values[best], at_end, len(values)))
    chosen = min(profile, key=lambda point: point.objective)  # first minimum: smaller γ
    evaluations = len(grid) * len(AUTHORS_T_GRID)
    return _focal_fit(
        data,
        chosen,
        profile,
        AUTHORS_OBJECTIVE,
        evaluate,
        _objective(data, "nll", bins, edges),
        bracket=(low, high),
        grid_step=None,  # a linear grid in T, not a step in ln T
        evaluations=evaluations,
        exact_evaluations=evaluations,
    )


def _focal_lattice_fit(
    data: _Scores,
    evaluate: Callable[[float, float], float],
    objective: str,
    grid: list[float],
    low: float,
    high: float,
    step: float,
    bins: int,
    edges: str,
) -> tuple[FocalProfilePoint, list[FocalProfilePoint], int, int]:
    """(chosen point, profile, passes, float64 passes) of the ECE/AdaECE fit over γ and T.

    γ ascending, each search starting at the previous γ's crossing (the optimum T grows with
    γ). Profile values from the float32 search are within ``FLOAT32_ERROR`` of float64; every
    γ whose value lies within twice that of the best is re-evaluated in float64 before γ is
    chosen (ties to the smaller γ), so the choice is the float64 one.
    """
    points = lattice.lattice(math.log(low), math.log(high), step)
    start = int(np.argmin(np.abs(points)))
    fits = []
    for gamma in grid:
        found = _lattice_fit(data, objective, gamma, points, start, bins, edges)
        fits.append(found)
        start = found.crossing
    passes = sum(f.passes for f in fits)
    exact_passes = sum(f.exact_passes for f in fits)
    best = min(f.value for f in fits)
    profile = []
    for i, gamma in enumerate(grid):
        found = fits[i]
        value = found.value
        if not found.exact and value <= best + 2 * FLOAT32_ERROR:
            value = evaluate(math.exp(-points[found.index]), gamma)
            passes, exact_passes = passes + 1, exact_passes + 1
            if abs(value - found.value) > FLOAT32_ERROR:  # the float32 bound failed: redo
                found = _lattice_fit(
                    data, objective, gamma, points, found.crossing, bins, edges, exact_only=True
                )
                fits[i], value = found, found.value
                passes, exact_passes = passes + found.passes, exact_passes + found.passes
        temperature = _temperature(points, found.index, low, high)
        at_end = _at_end(temperature, low, high)
        profile.append(FocalProfilePoint(gamma, temperature, value, at_end, found.passes))
    chosen = min(profile, key=lambda point: point.objective)  # first minimum: smaller γ
    return chosen, profile, passes, exact_passes


def apply_temperature(
    scores: Any, temperature: float, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """float64 log-probabilities log softmax(z / T) of N×K ``scores``."""
    calibrator = _argument_calibrator("temperature", temperature=temperature)
    return apply_calibrator(calibrator, scores, kind, source)


def apply_focal_temperature(
    scores: Any, temperature: float, gamma: float, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """float64 log-probabilities log φ_γ(softmax(z / T)) of N×K ``scores``."""
    calibrator = _argument_calibrator("focal-temperature", temperature=temperature, gamma=gamma)
    return apply_calibrator(calibrator, scores, kind, source)


def _argument_calibrator(method: str, **arguments: Any) -> Calibrator:
    """The calibrator of the Python arguments ``arguments`` (``temperature``, ``gamma``): each a
    real number (a one-element real tensor included; a bool, a string or ``None`` is not), and
    the calibrator's bounds, each refused naming the argument."""
    values: dict[str, float] = {}
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InputError(name, f"must be a real number, got {value!r}")
        values[name] = float(value)
    try:
        return Calibrator(method, values["temperature"], values.get("gamma", 0.0))
    except InputError as error:
        named = "gamma" if error.why.startswith("gamma") else "temperature"
        raise InputError(named, error.why, error.hint) from None


def apply_calibrator(
    calibrator: Calibrator, scores: Any, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """Apply a :class:`Calibrator` to N×K scores; returns float64 log-probabilities."""
    return calibrator.apply(scores, kind, source)
