"""Temperature scaling and focal temperature scaling: fit on one split, apply to another.

Temperature scaling (Guo et al. 2017): p = softmax(z / T), T > 0. With s = 1/T the NLL
N(s) = mean[logsumexp(s·z) - s·z_y] is convex in s, with dN/ds = mean[E_p z - z_y] and
d²N/ds² = mean[Var_p z]. The NLL fit runs a bounded Brent search on ln T over the bracket
(default T ∈ [0.01, 100]; it can never return T <= 0 or NaN) unless the slope at an end
of the bracket already shows the minimum lies on that end, then polishes with safeguarded
Newton steps in s inside the bracket until |dN/d ln T| < 1e-10. The ``"ece"``/``"adaece"``
objectives use a log-spaced grid (Mukhoti et al. 2020 pick T by grid search): a coarse grid of
step 10·``grid_step`` in ln T over the bracket, then a fine grid of step ``grid_step`` around
the coarse minimum; ties go to the T closest to 1.

Focal temperature scaling (Komisarenko & Kull 2024): p = φ_γ(softmax(z / T)), φ_γ the focal
calibration map. For every γ of the grid (default includes 0, which is temperature scaling
exactly) T is fitted over the bracket by the same routine as above; γ is then the grid value
with the lowest objective (``"ece"`` by default, ``"nll"`` optional). φ_γ preserves the order
of the classes, so predictions never change and the correctness vector is that of z.

Scores are converted once to float64 log-probabilities (log_softmax); T then divides those,
which gives the same softmax as dividing the logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from curvcal.calibration import bins as binning
from curvcal.calibration.focal import check_gamma, focal_calibration_map
from curvcal.calibration.inputs import check_bins, chunk_rows, class_labels, log_probabilities
from curvcal.calibration.metrics import binned_errors
from curvcal.calibration.results import (
    Calibrator,
    FocalProfilePoint,
    FocalTemperatureFit,
    TemperatureFit,
)
from curvcal.errors import InputError

OBJECTIVES_TS = ("nll", "ece", "adaece")
OBJECTIVES_FTS = ("ece", "nll", "adaece")
DEFAULT_BRACKET = (0.01, 100.0)
DEFAULT_GAMMAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
DEFAULT_GRID_STEP = 0.01
POLISH_TOL = 1e-10


#: Log-probabilities below this (exact zeros among them) are clamped to it: for every T below
#: about 13,000 its weight exp(s·z) underflows to exactly 0, and products w·z stay finite.
LOG_FLOOR = -1e7


class _Scores:
    """Row-shifted float64 log-probabilities z - max_k z (N×K, top entry 0) with labels.

    Shifting by the row maximum keeps Σ_k exp(s·z_k) in [1, K] for every s > 0, so the NLL,
    its derivatives and the confidence need no further max-subtraction.
    """

    def __init__(self, logp: torch.Tensor, labels: torch.Tensor) -> None:
        self.correct = (logp.argmax(dim=1) == labels).to(torch.float64)
        logp -= logp.amax(dim=1, keepdim=True)  # logp is our own copy
        logp.clamp_(min=LOG_FLOOR)
        self.logp = logp
        self.labels = labels
        self.logp_y = logp.gather(1, labels[:, None])[:, 0]
        self.step = chunk_rows(logp.shape[1])
        self.flat = bool((logp.amin(dim=1) == 0).all())

    def chunks(self) -> list[tuple[int, torch.Tensor]]:
        return [(i, self.logp[i : i + self.step]) for i in range(0, self.logp.shape[0], self.step)]

    def log_partition(self, s: float) -> torch.Tensor:
        """log Σ_k exp(s·z_k) for every row (length N)."""
        out = torch.empty(self.logp.shape[0], dtype=torch.float64)
        buffer = torch.empty((self.step, self.logp.shape[1]), dtype=torch.float64)
        for i, block in self.chunks():
            work = buffer[: block.shape[0]]
            torch.mul(block, s, out=work).exp_()
            torch.sum(work, dim=1, out=out[i : i + block.shape[0]])
        return out.log_()

    def nll(self, s: float) -> float:
        """Mean NLL of softmax(s·z)."""
        return float((self.log_partition(s) - s * self.logp_y).mean())

    def nll_derivatives(self, s: float) -> tuple[float, float, float]:
        """(N, dN/ds, d²N/ds²) at s = 1/T in one pass: mean lse - s·z_y, E_p z - z_y, Var_p z."""
        value = first = second = 0.0
        buffer = torch.empty((self.step, self.logp.shape[1]), dtype=torch.float64)
        weighted = torch.empty_like(buffer)
        for _, block in self.chunks():
            w = buffer[: block.shape[0]]
            torch.mul(block, s, out=w).exp_()
            total = w.sum(dim=1)
            wz = torch.mul(w, block, out=weighted[: block.shape[0]])
            mean_z = wz.sum(dim=1) / total
            mean_z2 = wz.mul_(block).sum(dim=1) / total
            value += float(total.log().sum())
            first += float(mean_z.sum())
            second += float((mean_z2 - mean_z**2).clamp(min=0).sum())
        n = self.logp.shape[0]
        y_sum = float(self.logp_y.sum())
        return (value - s * y_sum) / n, (first - y_sum) / n, second / n

    def confidence(self, s: float) -> torch.Tensor:
        """Top-label confidence of softmax(s·z): 1 / Σ_k exp(s·z_k)."""
        return torch.exp(-self.log_partition(s))

    def scaled_log_probs(self, s: float, gamma: float) -> list[torch.Tensor]:
        return [_calibrated(block, s, gamma) for _, block in self.chunks()]


def _calibrated(logp: torch.Tensor, s: float, gamma: float) -> torch.Tensor:
    scaled = torch.log_softmax(s * logp, dim=1)
    return focal_calibration_map(scaled, gamma) if gamma else scaled


def _objective(
    scores: _Scores, objective: str, n_bins: int, edges: str
) -> Callable[[float, float], float]:
    """objective(s, γ) of the calibrated scores."""

    def evaluate(s: float, gamma: float) -> float:
        if objective == "nll" and gamma == 0:
            return scores.nll(s)
        if gamma == 0:
            confidence = scores.confidence(s)
            index = (
                binning.equal_width_index(confidence, n_bins, edges)
                if objective == "ece"
                else binning.equal_mass_index(confidence, n_bins)
            )
            return binned_errors(*binning.bin_sums(index, confidence, scores.correct, n_bins)).ece
        blocks = scores.scaled_log_probs(s, gamma)
        if objective == "nll":
            total = sum(
                float(b.gather(1, scores.labels[i : i + b.shape[0], None]).sum())
                for (i, _), b in zip(scores.chunks(), blocks, strict=True)
            )
            return -total / scores.logp.shape[0]
        confidence = torch.exp(torch.cat([b.max(dim=1).values for b in blocks]))
        if objective == "ece":
            index = binning.equal_width_index(confidence, n_bins, edges)
        else:
            index = binning.equal_mass_index(confidence, n_bins)
        return binned_errors(*binning.bin_sums(index, confidence, scores.correct, n_bins)).ece

    return evaluate


def _check_bracket(bracket: tuple[float, float]) -> tuple[float, float]:
    low, high = (float(v) for v in bracket)
    if not (0 < low < high < math.inf):
        raise InputError("bracket", f"need 0 < T_min < T_max < inf, got {bracket!r}")
    return low, high


def _check_grid_step(grid_step: float) -> float:
    if not (isinstance(grid_step, int | float) and 0 < grid_step <= 1):
        raise InputError(
            "grid_step", f"the grid step in ln T must lie in (0, 1], got {grid_step!r}"
        )
    return float(grid_step)


def _grid_minimum(
    fn: Callable[[float], float], low: float, high: float, step: float
) -> tuple[float, float, int]:
    """Minimise fn(u) over u ∈ [low, high]: coarse grid (10·step), then fine grid (step)."""

    def best(points: np.ndarray) -> tuple[float, float]:
        values = np.array([fn(float(u)) for u in points])
        minimal = np.flatnonzero(values <= values.min())
        pick = minimal[np.argmin(np.abs(points[minimal]))]  # ties: the T closest to 1
        return float(points[pick]), float(values[pick])

    coarse = np.unique(np.append(np.arange(low, high, 10 * step), high))
    u0, _ = best(coarse)
    fine = np.unique(np.clip(u0 + step * np.arange(-10, 11), low, high))
    u1, value = best(fine)
    return u1, value, coarse.size + fine.size


def _fit_nll_temperature(scores: _Scores, low: float, high: float) -> tuple[float, float, int]:
    """(T, dN/d ln T at T, evaluations): Brent on ln T, then Newton in s = 1/T."""
    if scores.flat:  # every row is constant: the NLL does not depend on T
        return 1.0, 0.0, 1
    s_low, s_high = 1.0 / high, 1.0 / low
    # Convexity in s: a one-signed slope at an end of the bracket puts the minimum on that end.
    _, slope_at_low_t, _ = scores.nll_derivatives(s_high)
    if slope_at_low_t <= 0:
        return low, -s_high * slope_at_low_t, 2
    _, slope_at_high_t, _ = scores.nll_derivatives(s_low)
    if slope_at_high_t >= 0:
        return high, -s_low * slope_at_high_t, 3
    result = minimize_scalar(
        lambda u: scores.nll(math.exp(-u)),
        bounds=(math.log(low), math.log(high)),
        method="bounded",
        options={"xatol": 1e-4},  # the Newton polish takes it from here
    )
    evaluations = int(result.nfev) + 3
    s = min(max(math.exp(-float(result.x)), s_low), s_high)
    value, first, second = scores.nll_derivatives(s)
    for _ in range(30):
        evaluations += 1
        if abs(s * first) < POLISH_TOL or second <= 0:
            break
        if (s == s_low and first > 0) or (s == s_high and first < 0):
            break  # the optimum lies outside the bracket
        step = first / second
        while True:  # safeguard: halve a step that would raise the NLL
            candidate = min(max(s - step, s_low), s_high)
            new_value, new_first, new_second = scores.nll_derivatives(candidate)
            evaluations += 1
            if new_value <= value + 1e-15 * abs(value) or abs(step) < 1e-15 * s:
                break
            step /= 2
        s, value, first, second = candidate, new_value, new_first, new_second
    return 1.0 / s, -s * first, evaluations


def _prepare(
    scores: Any, labels: Any, kind: str, bins: int, edges: str, source: str, labels_source: str
) -> _Scores:
    check_bins(bins, edges)
    logp = log_probabilities(scores, kind, source)
    return _Scores(logp, class_labels(labels, logp.shape[0], logp.shape[1], labels_source))


def _fit_one_gamma(
    scores: _Scores,
    evaluate: Callable[[float, float], float],
    objective: str,
    gamma: float,
    low: float,
    high: float,
    grid_step: float,
) -> tuple[float, float, int]:
    """(T, objective at T, evaluations) for one γ."""
    if objective == "nll" and gamma == 0:
        temperature, _, evaluations = _fit_nll_temperature(scores, low, high)
        return temperature, evaluate(1.0 / temperature, 0.0), evaluations
    if objective == "nll":
        result = minimize_scalar(
            lambda u: evaluate(math.exp(-u), gamma),
            bounds=(math.log(low), math.log(high)),
            method="bounded",
            options={"xatol": 1e-6},
        )
        temperature = min(max(math.exp(float(result.x)), low), high)
        return temperature, evaluate(1.0 / temperature, gamma), int(result.nfev) + 1
    u, value, evaluations = _grid_minimum(
        lambda u: evaluate(math.exp(-u), gamma), math.log(low), math.log(high), grid_step
    )
    return min(max(math.exp(u), low), high), value, evaluations  # exp(ln T) may round out


def _at_end(temperature: float, low: float, high: float) -> bool:
    return abs(math.log(temperature / low)) < 1e-9 or abs(math.log(temperature / high)) < 1e-9


def fit_temperature(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    objective: str = "nll",
    bins: int = 15,
    edges: str = "left",
    bracket: tuple[float, float] = DEFAULT_BRACKET,
    grid_step: float = DEFAULT_GRID_STEP,
    source: str = "scores",
    labels_source: str = "labels",
) -> TemperatureFit:
    """Fit T of p = softmax(z / T) on (``scores``, ``labels``) by ``objective`` (see module doc).

    >>> import torch
    >>> z = torch.tensor([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    >>> fit = fit_temperature(z, torch.tensor([0, 1, 1, 0]))
    >>> fit.temperature > 1  # over-confident scores are softened
    True
    """
    if objective not in OBJECTIVES_TS:
        raise InputError(
            "objective", f"unknown objective {objective!r}", f"one of {', '.join(OBJECTIVES_TS)}"
        )
    low, high = _check_bracket(bracket)
    step = _check_grid_step(grid_step)
    data = _prepare(scores, labels, kind, bins, edges, source, labels_source)
    evaluate = _objective(data, objective, bins, edges)
    temperature, value, evaluations = _fit_one_gamma(
        data, evaluate, objective, 0.0, low, high, step
    )
    _, first, _ = data.nll_derivatives(1.0 / temperature)
    return TemperatureFit(
        temperature=temperature,
        objective=objective,
        objective_before=evaluate(1.0, 0.0),
        objective_after=value,
        nll_before=data.nll(1.0),
        nll_after=data.nll(1.0 / temperature),
        derivative=-first / temperature,
        bracket=(low, high),
        at_bracket_end=_at_end(temperature, low, high),
        grid_step=None if objective == "nll" else step,
        n_evaluations=evaluations,
        n_samples=data.logp.shape[0],
    )


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
    source: str = "scores",
    labels_source: str = "labels",
) -> FocalTemperatureFit:
    """Fit (γ, T) of p = φ_γ(softmax(z / T)): T per γ over ``bracket``, γ by ``objective``.

    Ties between γ values go to the smaller γ. ``gammas=[0]`` is temperature scaling.
    """
    if objective not in OBJECTIVES_FTS:
        raise InputError(
            "objective", f"unknown objective {objective!r}", f"one of {', '.join(OBJECTIVES_FTS)}"
        )
    grid = sorted({check_gamma(g, "gammas") for g in gammas})
    if not grid:
        raise InputError("gammas", "the gamma grid is empty", "0 is temperature scaling")
    low, high = _check_bracket(bracket)
    step = _check_grid_step(grid_step)
    data = _prepare(scores, labels, kind, bins, edges, source, labels_source)
    evaluate = _objective(data, objective, bins, edges)
    profile = []
    for gamma in grid:
        temperature, value, _ = _fit_one_gamma(data, evaluate, objective, gamma, low, high, step)
        profile.append(
            FocalProfilePoint(gamma, temperature, value, _at_end(temperature, low, high))
        )
    chosen = min(profile, key=lambda point: point.objective)  # first minimum: the smaller γ
    nll = _objective(data, "nll", bins, edges)
    return FocalTemperatureFit(
        gamma=chosen.gamma,
        temperature=chosen.temperature,
        objective=objective,
        objective_before=evaluate(1.0, 0.0),
        objective_after=chosen.objective,
        nll_before=nll(1.0, 0.0),
        nll_after=nll(1.0 / chosen.temperature, chosen.gamma),
        profile=tuple(profile),
        bracket=(low, high),
        grid_step=None if objective == "nll" else step,
        n_samples=data.logp.shape[0],
    )


def apply_temperature(
    scores: Any, temperature: float, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """float64 log-probabilities log softmax(z / T) of N×K ``scores``."""
    return apply_calibrator(Calibrator("temperature", float(temperature)), scores, kind, source)


def apply_focal_temperature(
    scores: Any, temperature: float, gamma: float, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """float64 log-probabilities log φ_γ(softmax(z / T)) of N×K ``scores``."""
    return apply_calibrator(
        Calibrator("focal-temperature", float(temperature), float(gamma)), scores, kind, source
    )


def apply_calibrator(
    calibrator: Calibrator, scores: Any, kind: str = "logits", source: str = "scores"
) -> torch.Tensor:
    """Apply a :class:`Calibrator` to N×K scores; returns float64 log-probabilities."""
    logp = log_probabilities(scores, kind, source)
    if calibrator.method == "none":
        return logp
    out = torch.empty_like(logp)
    step = chunk_rows(logp.shape[1])
    for start in range(0, logp.shape[0], step):
        out[start : start + step] = _calibrated(
            logp[start : start + step], 1.0 / calibrator.temperature, calibrator.gamma
        )
    return out
