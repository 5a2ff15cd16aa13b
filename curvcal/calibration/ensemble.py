"""Ensemble temperature scaling (Zhang, Kailkhura & Han 2020, "Mix-n-Match").

A convex combination of three distributions over the K classes of each sample,

    q = w_ts · softmax(log p / T) + w_un · p + w_u · 1/K,   w ≥ 0, w_ts + w_un + w_u = 1,

the temperature-scaled probabilities, the uncalibrated ones p (softmax z for logits) and the
uniform distribution. Fitted as the paper does, in two stages on the fit split: T first, by
temperature scaling on NLL (:func:`~curvcal.calibration.scaling.fit_temperature`, bracket
[0.01, 100]), then the weights with T fixed, by minimising the mean NLL
−mean_n log(w_ts · a_n1 + w_un · a_n2 + w_u · a_n3), a_n = (softmax(log p_n / T)_y, p_{n,y}, 1/K),
over the simplex (the paper's code minimises the squared error by default; its NLL variant,
used here, is the proper score curvcal fits every map by). That objective is convex in w, and
only the true class's three probabilities enter it, so the weights are exact:
:func:`simplex_nll_weights` takes the best of the vertices, the minimum on each edge (bisection
on the derivative, to float64 resolution), the interior minimum (Newton in the plane of the
simplex, kept strictly inside) and SciPy's SLSQP with the exact gradient (for an interior
minimum near an edge, where the Newton steps are cut short). Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from curvcal.calibration.inputs import INPUTS, InputNames, chunk_rows, log_probabilities
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import TEMPERATURE_RANGE, SavedMap, array, choice, number
from curvcal.calibration.scaling import fit_temperature
from curvcal.calibration.univariate import fit_split
from curvcal.errors import InputError

METHOD = "ensemble-temperature"
#: Interior Newton steps and bisection halvings of the weight fit.
NEWTON_STEPS = 500
BISECTIONS = 200
#: The interior Newton stops once the largest gradient component in the simplex's plane is
#: under this (mean NLL, nats).
WEIGHT_GRADIENT_TOL = 1e-13
#: A point where no Newton step lowers the NLL (its rounding reached) is the interior minimum
#: when its gradient is under this.
ROUNDING_GRADIENT = 1e-8
#: The interior Newton gives up after this many steps in a row cut short by the boundary (each
#: goes 0.99 of the way there): the minimum is then on an edge, which the edge searches find
#: exactly (a minimum near an edge but inside is SLSQP's candidate).
BLOCKED_STEPS = 20


@dataclass(frozen=True)
class EnsembleMap(SavedMap):
    """A fitted ensemble temperature map: ``temperature`` T > 0 and ``weights``
    (w_ts, w_un, w_u) of the temperature-scaled, uncalibrated and uniform distributions."""

    temperature: float
    weights: tuple[float, float, float]

    def __post_init__(self) -> None:
        _check(self.temperature, self.weights, "calibrator")

    @property
    def method(self) -> str:
        return METHOD

    #: The saved body: T within TS's range, three weights (TS, uncalibrated, uniform) in [0, 1].
    FIELDS = (
        choice("method", (METHOD,)),
        number("temperature", *TEMPERATURE_RANGE),
        array("weights", (3,), 0.0, 1.0),
    )

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> EnsembleMap:
        w_ts, w_un, w_u = values["weights"].tolist()
        _check(values["temperature"], (w_ts, w_un, w_u), source)
        return cls(values["temperature"], (w_ts, w_un, w_u))

    def apply(
        self,
        scores: Any,
        kind: str = "logits",
        source: str = "scores",
        *,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        """float64 log q of N×K ``scores``: log Σ_i w_i q_i, summed as a logsumexp of
        log w_i + log q_i over the components with w_i > 0; computed on ``device`` (default:
        the CPU) and returned there."""
        logp = log_probabilities(scores, kind, source, device=device)
        k = logp.shape[1]
        out = torch.empty_like(logp)
        step = chunk_rows(k, logp.device)
        for start in range(0, logp.shape[0], step):
            block = logp[start : start + step]
            parts = []
            w_ts, w_un, w_u = self.weights
            if w_ts > 0:
                parts.append(math.log(w_ts) + torch.log_softmax(block / self.temperature, dim=1))
            if w_un > 0:
                parts.append(math.log(w_un) + block)
            if w_u > 0:
                parts.append(torch.full_like(block, math.log(w_u) - math.log(k)))
            out[start : start + step] = torch.logsumexp(torch.stack(parts), dim=0)
        return out


@dataclass(frozen=True)
class EnsembleFit(MapFit[EnsembleMap]):
    """Ensemble temperature scaling fitted on one split: ``temperature`` (by TS on NLL), the
    ``weights``, and the fit split's NLL before, after TS alone (``nll_ts``) and after the
    ensemble (``nll_after``)."""

    temperature: float
    weights: tuple[float, float, float]
    nll_ts: float


def fit_ensemble_temperature(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    names: InputNames = INPUTS,
    *,
    device: torch.device | None = None,
) -> EnsembleFit:
    """Fit T by temperature scaling on NLL, then the simplex weights by NLL with T fixed
    (module docstring), on (``scores``, ``labels``). ``device``: where the N×K passes (the
    log-probabilities, the TS fit, the label columns) run; the N×3 simplex fit runs on the
    CPU."""
    logp, y = fit_split(scores, labels, kind, names, None, device=device)
    n, k = logp.shape
    temperature = fit_temperature(
        logp, y, kind="logprobs", objective="nll", device=logp.device
    ).temperature
    rows = torch.arange(n, device=logp.device)
    true_ts = torch.log_softmax(logp / temperature, dim=1)[rows, y].exp()
    true_un = logp[rows, y].exp()
    columns = torch.stack([true_ts, true_un, torch.full_like(true_ts, 1.0 / k)], dim=1).cpu()
    weights = simplex_nll_weights(columns.numpy())
    fitted = EnsembleMap(temperature, weights)
    return EnsembleFit(
        temperature=temperature,
        weights=weights,
        nll_before=_mean_nll(columns.numpy(), (0.0, 1.0, 0.0)),
        nll_ts=_mean_nll(columns.numpy(), (1.0, 0.0, 0.0)),
        nll_after=_mean_nll(columns.numpy(), weights),
        n_samples=n,
        calibrator=fitted,
    )


def _mean_nll(a: np.ndarray, w: tuple[float, float, float] | np.ndarray) -> float:
    mixed = a @ np.asarray(w, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return float(-np.log(mixed).mean())


def simplex_nll_weights(a: np.ndarray) -> tuple[float, float, float]:
    """argmin over the probability simplex of −mean_n log(a_n · w) for N×3 non-negative
    ``a``: the best of the three vertices, the minimum on each edge and the interior minimum
    (module docstring). Ties go to the earlier candidate (vertices, then edges, then the
    interior)."""
    candidates: list[np.ndarray] = [np.eye(3)[i] for i in range(3)]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        t = _edge_minimum(a[:, i], a[:, j])
        w = np.zeros(3)
        w[i], w[j] = t, 1.0 - t
        candidates.append(w)
    interior = _interior_minimum(a)
    if interior is not None:
        candidates.append(interior)
    candidates.append(_slsqp_minimum(a))
    values = [_mean_nll(a, w) for w in candidates]
    best = candidates[int(np.argmin(values))]
    best = np.clip(best, 0.0, 1.0)
    best = best / best.sum()
    return (float(best[0]), float(best[1]), float(best[2]))


def _edge_minimum(first: np.ndarray, second: np.ndarray) -> float:
    """argmin over t ∈ [0, 1] of −mean log(t · first + (1 − t) · second): convex in t, so the
    root of its derivative −mean((first − second)/(second + t(first − second))), by bisection
    (an end when the derivative does not change sign)."""
    diff = first - second

    def slope(t: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            mixed = second + t * diff
            terms = np.where(diff == 0.0, 0.0, diff / mixed)
        return float(-terms.mean())

    low, high = 0.0, 1.0
    if not slope(low) < 0.0:
        return 0.0
    if not slope(high) > 0.0:
        return 1.0
    for _ in range(BISECTIONS):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if slope(middle) < 0.0:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _slsqp_minimum(a: np.ndarray) -> np.ndarray:
    """SciPy's SLSQP on the simplex with the exact gradient, from the centre: a fallback for
    an interior minimum close to an edge, where the Newton steps of
    :func:`_interior_minimum` are cut short by the boundary."""
    from scipy.optimize import minimize

    def value_and_gradient(w: np.ndarray) -> tuple[float, np.ndarray]:
        mixed = np.maximum(a @ w, 1e-300)
        return float(-np.log(mixed).mean()), -(a / mixed[:, None]).mean(0)

    result = minimize(
        value_and_gradient,
        np.full(3, 1.0 / 3.0),
        jac=True,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * 3,
        constraints={"type": "eq", "fun": lambda w: w.sum() - 1.0},
        options={"ftol": 1e-16, "maxiter": 1000},
    )
    w = np.clip(result.x, 0.0, 1.0)
    return w / w.sum()


def _interior_minimum(a: np.ndarray) -> np.ndarray | None:
    """Newton on (w_0, w_1) with w_2 = 1 − w_0 − w_1 from the centre, each step shortened to
    stay strictly inside the simplex and to lower the objective; ``None`` when it does not
    converge inside (the minimum is then on the boundary), or when :data:`BLOCKED_STEPS`
    steps in a row were cut short by the boundary."""
    d = a[:, :2] - a[:, 2:3]
    w = np.full(2, 1.0 / 3.0)

    def parts(w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        mixed = a[:, 2] + d @ w
        ratio = d / mixed[:, None]
        return float(-np.log(mixed).mean()), -ratio.mean(0), ratio.T @ ratio / len(a)

    value, gradient, hessian = parts(w)
    blocked_in_a_row = 0
    for _ in range(NEWTON_STEPS):
        if np.abs(gradient).max() < WEIGHT_GRADIENT_TOL:
            return np.array([w[0], w[1], 1.0 - w.sum()])
        try:
            step = np.linalg.solve(hessian, gradient)
        except np.linalg.LinAlgError:
            return None
        # at most 0.99 of the way to the boundary (w_0, w_1 > 0 and w_0 + w_1 < 1)
        scale = 1.0
        moves = np.array([step[0], step[1], -step.sum()])
        room = np.array([w[0], w[1], 1.0 - w.sum()])
        blocked = moves > 0
        if blocked.any():
            scale = min(1.0, 0.99 * float((room[blocked] / moves[blocked]).min()))
        blocked_in_a_row = blocked_in_a_row + 1 if scale < 1.0 else 0
        if blocked_in_a_row > BLOCKED_STEPS:
            return None
        while scale > 1e-20:
            trial = w - scale * step
            if trial.min() > 0.0 and trial.sum() < 1.0:
                trial_value, trial_gradient, trial_hessian = parts(trial)
                if trial_value <= value:
                    break
            scale *= 0.5
        else:
            # no step lowers the objective any more: the rounding of the NLL is reached
            converged = np.abs(gradient).max() < ROUNDING_GRADIENT
            return np.array([w[0], w[1], 1.0 - w.sum()]) if converged else None
        w, value, gradient, hessian = trial, trial_value, trial_gradient, trial_hessian
    return None


def _check(temperature: float, weights: tuple[float, ...], source: str) -> None:
    if not (math.isfinite(temperature) and temperature > 0):
        raise InputError(source, f"temperature must be a finite number > 0, got {temperature!r}")
    if len(weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in weights):
        raise InputError(source, f"weights must be 3 finite numbers ≥ 0, got {list(weights)!r}")
    if abs(sum(weights) - 1.0) > 1e-9:
        raise InputError(source, f"weights must sum to 1, got {sum(weights)!r}")
