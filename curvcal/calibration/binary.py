"""Platt scaling and beta calibration: logistic maps for binary problems (K = 2).

With log p_0, log p_1 the float64 log-probabilities of the two classes (log_softmax of the
logits; log 0 of rounded probabilities raised to :data:`~curvcal.calibration.linear.LOG_FLOOR`)
the calibrated probability of class 1 is q_1 = σ(s), q_0 = σ(−s) (both from log σ, exact for
saturated rows), with

    s = a·x + b,  x = log p_1 − log p_0  (the logit difference z_1 − z_0)     Platt scaling
    s = a·ln p_1 + b·(−ln p_0) + c          (−ln p_0 = −ln(1 − p_1))          beta calibration

* **Platt** (Platt 1999, as scikit-learn's ``CalibratedClassifierCV(method="sigmoid")``):
  (a, b) minimise the cross-entropy against Platt's smoothed targets t = (N_1 + 1)/(N_1 + 2)
  for y = 1 and 1/(N_0 + 2) for y = 0 (his prior correction: the fit stays finite on
  separable data or a single class), no other regulariser.
* **beta** (Kull, Silva Filho & Flach 2017, the reference ``betacal`` code): (a, b, c)
  minimise the cross-entropy against the labels plus ‖(a, b)‖²/(2C), C = 10¹¹ (the
  reference's ``LogisticRegression(C=99999999999)``; the intercept is not penalised). The map
  is monotone only for a, b ≥ 0, handled as the reference does: if a < 0 the fit is redone on
  −ln p_0 alone (a = 0), else if b < 0 on ln p_1 alone (b = 0). It needs both classes in the
  fit split.

Both are convex and fitted by Newton's method in float64 (exact gradient and Hessian, steps
halved until the objective falls) until the largest component of the gradient of the mean
objective falls under :data:`GRADIENT_TOL`. A feature that is the same for every fit sample
(all scores equal) is left out (its coefficient 0): the map is then the constant the
intercept gives. Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from curvcal.calibration.inputs import INPUTS, InputNames, class_labels, log_probabilities
from curvcal.calibration.linear import LOG_FLOOR
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import COEFFICIENT_BOUND, Field, SavedMap, choice, number
from curvcal.calibration.univariate import fit_nll
from curvcal.errors import InputError, SettingsError, setting_name

BINARY_METHODS = ("platt", "beta")
#: Stop when max |∂(objective / N)/∂θ| falls under this.
GRADIENT_TOL = 1e-10
#: Most Newton steps (a fit that reaches it reports ``converged`` false).
MAX_ITERATIONS = 200
#: The reference beta calibration's inverse L2 strength on (a, b).
BETA_C = 99999999999.0
_NAMES = {"platt": "Platt scaling", "beta": "beta calibration"}


def binary_features(logp: torch.Tensor, method: str) -> np.ndarray:
    """N×d float64 features of ``method`` (Platt: [x]; beta: [ln p_1, −ln p_0])."""
    logs = logp.clamp_min(LOG_FLOOR).numpy()
    if method == "platt":
        return (logs[:, 1] - logs[:, 0])[:, None]
    return np.stack([logs[:, 1], -logs[:, 0]], axis=1)


def _sigmoid(s: np.ndarray) -> np.ndarray:
    """σ(s) without overflow."""
    return 0.5 * (1.0 + np.tanh(0.5 * s))


def logistic_newton(
    features: np.ndarray,
    targets: np.ndarray,
    l2: float = 0.0,
    tol: float = GRADIENT_TOL,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[np.ndarray, float, int, float]:
    """(weights, intercept, iterations, max |gradient|) minimising
    (1/N)[Σ_i softplus(s_i) − t_i s_i + (l2/2)‖w‖²], s = features·w + intercept, from 0.

    Columns of ``features`` that are constant get weight 0 and stay out of the fit."""
    n, d = features.shape
    varies = np.ptp(features, axis=0) > 0 if n else np.zeros(d, dtype=bool)
    design = np.concatenate([features[:, varies], np.ones((n, 1))], axis=1)
    m = design.shape[1]
    penalty = np.full(m, l2)
    penalty[-1] = 0.0

    def objective(theta: np.ndarray) -> float:
        s = design @ theta
        return float((np.logaddexp(0.0, s) - targets * s).sum() + 0.5 * (penalty * theta**2).sum())

    theta = np.zeros(m)
    value = objective(theta)
    iterations = 0
    while True:
        prob = _sigmoid(design @ theta)
        gradient = design.T @ (prob - targets) + penalty * theta
        gradient_max = float(np.abs(gradient).max()) / max(n, 1)
        if gradient_max < tol or iterations >= max_iterations:
            break
        hessian = (design * (prob * (1.0 - prob))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.lstsq(hessian, gradient, rcond=None)[0]
        scale = 1.0
        candidate = theta - step
        new_value = objective(candidate)
        while new_value > value and scale > 1e-12:  # halve a step that raises the objective
            scale /= 2
            candidate = theta - scale * step
            new_value = objective(candidate)
        if new_value > value:
            break
        iterations += 1
        if np.array_equal(candidate, theta):
            break
        theta, value = candidate, new_value
    weights = np.zeros(d)
    weights[varies] = theta[:-1]
    return weights, float(theta[-1]), iterations, gradient_max


@dataclass(frozen=True)
class BinaryMap(SavedMap):
    """Fitted Platt scaling (``weights`` = (a,), s = a·x + ``intercept``) or beta calibration
    (``weights`` = (a, b), s = a·ln p_1 − b·ln p_0 + ``intercept``)."""

    method: str
    weights: tuple[float, ...]
    intercept: float

    def __post_init__(self) -> None:
        if self.method not in BINARY_METHODS:
            raise InputError("calibrator", f"unknown method {self.method!r}", "platt or beta")
        if len(self.weights) != (1 if self.method == "platt" else 2):
            raise InputError("calibrator", f"{self.method} has the wrong number of weights")
        if not all(math.isfinite(v) for v in (*self.weights, self.intercept)):
            raise InputError("calibrator", f"{self.method} coefficients must be finite")

    @property
    def n_classes(self) -> int:
        """Platt scaling and beta calibration are maps of binary problems: 2."""
        return 2

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: ``{"method": "platt", "slope": a, "intercept": b}`` or
        ``{"method": "beta", "a": a, "b": b, "c": c}``."""
        if self.method == "platt":
            return {"method": "platt", "slope": self.weights[0], "intercept": self.intercept}
        a, b = self.weights
        return {"method": "beta", "a": a, "b": b, "c": self.intercept}

    @classmethod
    def saved_fields(cls, data: Mapping[str, Any]) -> tuple[Field, ...]:
        """Platt: ``slope`` and ``intercept``; beta: ``a``, ``b``, ``c``; every coefficient
        within ±:data:`~curvcal.calibration.saved.COEFFICIENT_BOUND`, and beta's ``a`` and
        ``b`` at least 0 (the map is monotone only then, and the fit never gives less)."""
        bound = COEFFICIENT_BOUND
        coefficients: tuple[Field, ...] = (
            (number("slope", -bound, bound), number("intercept", -bound, bound))
            if data.get("method") == "platt"
            else (number("a", 0.0, bound), number("b", 0.0, bound), number("c", -bound, bound))
        )
        return (choice("method", BINARY_METHODS), *coefficients)

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> BinaryMap:
        if values["method"] == "platt":
            return cls("platt", (values["slope"],), values["intercept"])
        return cls("beta", (values["a"], values["b"]), values["c"])

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities [log σ(−s), log σ(s)] of N×2 ``scores``."""
        logp = log_probabilities(scores, kind, source)
        if logp.shape[1] != 2:
            raise InputError(
                source, f"has {logp.shape[1]} classes but {_NAMES[self.method]} needs 2"
            )
        s = torch.from_numpy(binary_features(logp, self.method) @ np.asarray(self.weights))
        s = s + self.intercept
        return torch.stack(
            [torch.nn.functional.logsigmoid(-s), torch.nn.functional.logsigmoid(s)], 1
        )


@dataclass(frozen=True)
class BinaryFit(MapFit[BinaryMap]):
    """Platt scaling or beta calibration fitted on one split. ``fixed``: the beta coefficient
    set to 0 by the a, b ≥ 0 rule (``"a"``, ``"b"`` or ``""``); ``converged``: the largest
    gradient component ``gradient_max`` of the mean objective fell under ``gradient_tol``."""

    method: str
    input: str
    coefficients: dict[str, float]
    fixed: str
    l2: float
    iterations: int
    gradient_max: float
    gradient_tol: float
    converged: bool


def fit_binary(
    scores: Any,
    labels: Any,
    method: str = "platt",
    kind: str = "logits",
    names: InputNames = INPUTS,
) -> BinaryFit:
    """Fit Platt scaling (``method="platt"``) or beta calibration (``"beta"``) on
    (``scores``, ``labels``) of a binary problem (see the module docstring)."""
    if method not in BINARY_METHODS:
        raise SettingsError("method", f"unknown binary map {method!r}", "platt or beta")
    logp = log_probabilities(scores, kind, names.scores)
    n, k = logp.shape
    if k != 2:
        raise SettingsError(
            "method",
            f"{_NAMES[method]} is for binary problems (K = 2); {names.scores} has {k} classes",
            "use isotonic-ovr, histogram-ovr, vector or ts for K > 2",
            value=method,
        )
    y = class_labels(labels, n, k, names.labels)
    target = y.numpy().astype(np.float64)
    features = binary_features(logp, method)
    n_1 = float(target.sum())
    n_0 = n - n_1
    fixed = ""
    if method == "platt":
        smoothed = np.where(target > 0, (n_1 + 1.0) / (n_1 + 2.0), 1.0 / (n_0 + 2.0))
        weights, intercept, iterations, gradient_max = logistic_newton(features, smoothed)
        coefficients = {"slope": float(weights[0]), "intercept": intercept}
        l2 = 0.0
    else:
        if n_1 == 0 or n_0 == 0:
            raise InputError(
                names.labels,
                f"beta calibration needs both classes in the fit split; it has only class "
                f"{int(target[0]) if n else 0}",
                f"fit on more samples, or use {setting_name('method')} platt (its targets are smoothed)",
            )
        l2 = 1.0 / BETA_C
        weights, intercept, iterations, gradient_max = logistic_newton(features, target, l2)
        if weights[0] < 0 or weights[1] < 0:
            fixed = "a" if weights[0] < 0 else "b"
            keep = 1 if fixed == "a" else 0
            one, intercept, more, gradient_max = logistic_newton(features[:, [keep]], target, l2)
            iterations += more
            weights = np.zeros(2)
            weights[keep] = one[0]
        coefficients = {"a": float(weights[0]), "b": float(weights[1]), "c": intercept}
    fitted = BinaryMap(method, tuple(float(w) for w in weights), intercept)
    return BinaryFit(
        method=method,
        input="logit difference" if method == "platt" else "ln p_1, −ln p_0",
        coefficients=coefficients,
        fixed=fixed,
        l2=l2,
        nll_before=fit_nll(logp, y),
        nll_after=fit_nll(fitted.apply(logp, "logprobs", names.scores), y),
        iterations=iterations,
        gradient_max=gradient_max,
        gradient_tol=GRADIENT_TOL,
        converged=gradient_max < GRADIENT_TOL,
        n_samples=n,
        calibrator=fitted,
    )
