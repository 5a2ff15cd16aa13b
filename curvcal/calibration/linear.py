"""Vector and matrix scaling: a linear map of the scores, then softmax, fitted by NLL.

For N×K inputs x (the logits z themselves for ``kind`` ``logits``; log p, floored at
:data:`LOG_FLOOR`, for ``probs``/``logprobs``) the calibrated probabilities are

    q = softmax(w ⊙ x + b)          vector scaling (Guo et al. 2017), w, b ∈ R^K
    q = softmax(W x + b)            matrix scaling (Guo et al. 2017), W ∈ R^{K×K}, b ∈ R^K

(on log-probabilities matrix scaling is Dirichlet calibration, Kull et al. 2019). The fit
minimises on the fit split, in float64,

    L = mean_n[logsumexp(s_n) − s_{n,y_n}]
        + λ_od · Σ_{i≠j} W_ij² / (K(K−1)) + λ_b · Σ_j b_j² / K      (matrix scaling only)

the off-diagonal and intercept regulariser (ODIR) of Kull et al. 2019; vector scaling has no
regulariser. L is convex in the parameters (the scores are linear in them), so L-BFGS
started at the identity (w = 1 or W = I, b = 0) reaches the minimum; it stops when the largest
component of the gradient falls under :data:`GRADIENT_TOL` (``converged``) or after
:data:`MAX_ITERATIONS`, and says which. Gradients are closed form: with G = (q − onehot(y))/N,
∂L/∂w = Σ_n G_n ⊙ x_n, ∂L/∂W = Gᵀx (+ the regulariser), ∂L/∂b = Σ_n G_n. Pure: no file I/O,
no printing, no global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize

from curvcal.calibration.inputs import (
    check_finite_logits,
    chunk_rows,
    class_labels,
    log_probabilities,
    validated_scores,
)
from curvcal.errors import InputError

LINEAR_METHODS = ("vector", "matrix")
#: Stop when max |∂L/∂θ| falls under this (L is a mean NLL in nats).
GRADIENT_TOL = 1e-8
#: Most L-BFGS iterations; a fit that reaches it reports ``converged`` false.
MAX_ITERATIONS = 10_000
#: L-BFGS history (pairs of parameter-sized vectors kept).
HISTORY = 10
#: ODIR strengths of matrix scaling (fixed; not yet chosen by cross-validation).
L2_OFF_DIAGONAL = 1e-2
L2_BIAS = 1e-2
#: log p below this (exact zeros among them) is raised to it: log of float64's smallest normal.
LOG_FLOOR = math.log(2.2250738585072014e-308)
#: The most classes matrix scaling takes: its K² + K parameters and L-BFGS history in float64
#: need about 8·(2·HISTORY + 6)·(K² + K) bytes (K = 1000: 0.21 GB; K = 2048: 0.87 GB).
MAX_MATRIX_CLASSES = 2048


def matrix_memory_bytes(n_classes: int) -> int:
    """Bytes of float64 parameters, gradient and L-BFGS history of matrix scaling with
    ``n_classes`` classes (the N×K work arrays come on top: 3 float64 arrays of N×K)."""
    return 8 * (2 * HISTORY + 6) * (n_classes * n_classes + n_classes)


@dataclass(frozen=True)
class LinearMap:
    """A fitted vector or matrix scaling map: ``method`` ``vector`` (``weights`` K numbers) or
    ``matrix`` (``weights`` K rows of K numbers, W with s = W x + b), and ``bias`` K numbers.
    ``input_kind`` decides x: the logits for ``logits``, log p otherwise."""

    method: str
    weights: tuple[Any, ...]
    bias: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_map(self.method, self.weights, self.bias, "calibrator")

    @property
    def n_classes(self) -> int:
        return len(self.bias)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: ``{"method", "weights", "bias"}`` (numbers only)."""
        weights = (
            list(self.weights) if self.method == "vector" else [list(row) for row in self.weights]
        )
        return {"method": self.method, "weights": weights, "bias": list(self.bias)}

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibrator") -> LinearMap:
        """Rebuild from :meth:`to_dict` output; every fault is an :class:`InputError`
        naming ``source``."""
        if not isinstance(data, dict):
            raise InputError(source, f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"method", "weights", "bias"})
        if unknown:
            raise InputError(source, f"unknown calibrator keys {unknown}")
        missing = [key for key in ("method", "weights", "bias") if key not in data]
        if missing:
            raise InputError(source, f"missing keys {missing}")
        method, weights, bias = data["method"], data["weights"], data["bias"]
        if method not in LINEAR_METHODS:
            raise InputError(source, f"unknown method {method!r}", "vector or matrix")
        bias_t = _numbers(bias, source, "bias")
        if method == "vector":
            weights_t: tuple[Any, ...] = _numbers(weights, source, "weights")
        else:
            if not isinstance(weights, list):
                raise InputError(source, "weights must be a list of rows")
            weights_t = tuple(_numbers(row, source, "weights row") for row in weights)
        _check_map(method, weights_t, bias_t, source)
        return cls(method, weights_t, bias_t)

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities log softmax(w ⊙ x + b) or log softmax(W x + b) of N×K
        ``scores``."""
        x = linear_inputs(scores, kind, source)
        if x.shape[1] != self.n_classes:
            raise InputError(
                source,
                f"has {x.shape[1]} classes but the {self.method} scaling map has {self.n_classes}",
            )
        weights = torch.tensor(self.weights, dtype=torch.float64)
        bias = torch.tensor(self.bias, dtype=torch.float64)
        out = torch.empty_like(x)
        step = chunk_rows(x.shape[1])
        for start in range(0, x.shape[0], step):
            block = x[start : start + step]
            s = block * weights if self.method == "vector" else block @ weights.T
            out[start : start + step] = torch.log_softmax(s + bias, dim=1)
        return out

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        """float64 calibrated probabilities of N×K ``scores``."""
        return torch.exp(self.apply(scores, kind, source))


@dataclass(frozen=True)
class LinearFit:
    """Vector or matrix scaling fitted on one split (see the module docstring).

    ``nll_before``/``nll_after``: NLL on the fit split under the identity map and the fitted
    one; ``objective_after`` adds the regulariser. ``converged``: the largest gradient
    component ``gradient_max`` fell under ``gradient_tol`` within ``max_iterations``.
    """

    method: str
    input: str
    nll_before: float
    nll_after: float
    objective_after: float
    l2_off_diagonal: float
    l2_bias: float
    n_parameters: int
    iterations: int
    gradient_max: float
    gradient_tol: float
    max_iterations: int
    converged: bool
    n_samples: int
    calibrator: LinearMap

    def to_dict(self) -> dict[str, Any]:
        """The fit's record without its parameters (they are in the saved calibrator)."""
        return {key: getattr(self, key) for key in self.__dataclass_fields__ if key != "calibrator"}


def linear_inputs(scores: Any, kind: str, source: str) -> torch.Tensor:
    """The float64 x the linear maps act on: the logits for ``logits`` (validated finite),
    else log p floored at :data:`LOG_FLOOR`."""
    if kind == "logits":
        z = validated_scores(scores, kind, source).to(torch.float64)
        step = chunk_rows(z.shape[1])
        for start in range(0, z.shape[0], step):
            check_finite_logits(z[start : start + step], start, source)
        return z
    return log_probabilities(scores, kind, source).clamp_min(LOG_FLOOR)


def fit_linear(
    scores: Any,
    labels: Any,
    method: str,
    kind: str = "logits",
    source: str = "scores",
    labels_source: str = "labels",
    l2_off_diagonal: float = L2_OFF_DIAGONAL,
    l2_bias: float = L2_BIAS,
    gradient_tol: float = GRADIENT_TOL,
    max_iterations: int = MAX_ITERATIONS,
) -> LinearFit:
    """Fit vector (``method="vector"``) or matrix scaling on (``scores``, ``labels``) by
    L-BFGS on the regularised mean NLL, in float64, from the identity map."""
    if method not in LINEAR_METHODS:
        raise InputError("--method", f"unknown linear map {method!r}", "vector or matrix")
    x = linear_inputs(scores, kind, source)
    n, k = x.shape
    if method == "matrix" and k > MAX_MATRIX_CLASSES:
        raise InputError(
            "--method matrix",
            f"{k} classes need {k * k + k:,} parameters and about "
            f"{matrix_memory_bytes(k) / 1e9:.1f} GB for the fit (most: {MAX_MATRIX_CLASSES} "
            "classes)",
            "use --method vector or ts",
        )
    y = class_labels(labels, n, k, labels_source)
    onehot = torch.zeros((n, k), dtype=torch.float64)
    onehot[torch.arange(n), y] = 1.0
    lam_od, lam_b = (l2_off_diagonal, l2_bias) if method == "matrix" else (0.0, 0.0)
    off = 1.0 - torch.eye(k, dtype=torch.float64)
    weight_shape = (k,) if method == "vector" else (k, k)
    n_weights = int(np.prod(weight_shape))

    def split(theta: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.from_numpy(theta)
        return t[:n_weights].reshape(weight_shape), t[n_weights:]

    def nll_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        weights, bias = split(theta)
        s = (x * weights if method == "vector" else x @ weights.T) + bias
        logq = torch.log_softmax(s, dim=1)
        value = float(-(logq * onehot).sum()) / n
        g = (torch.exp(logq) - onehot) / n
        grad_w = (g * x).sum(0) if method == "vector" else g.T @ x
        grad_b = g.sum(0)
        if method == "matrix":
            value += lam_od * float((weights * off).pow(2).sum()) / max(k * (k - 1), 1)
            value += lam_b * float(bias.pow(2).sum()) / k
            grad_w = grad_w + 2 * lam_od * weights * off / max(k * (k - 1), 1)
            grad_b = grad_b + 2 * lam_b * bias / k
        return value, torch.cat([grad_w.reshape(-1), grad_b]).numpy()

    start_w = torch.ones(k, dtype=torch.float64) if method == "vector" else torch.eye(k)
    theta0 = torch.cat([start_w.to(torch.float64).reshape(-1), torch.zeros(k)]).numpy()
    nll_before = nll_and_grad(theta0)[0]
    result = minimize(
        nll_and_grad,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={
            "maxiter": max_iterations,
            "maxfun": 4 * max_iterations,
            "gtol": gradient_tol,
            "ftol": 0.0,
            "maxcor": HISTORY,
        },
    )
    value, grad = nll_and_grad(result.x)
    gradient_max = float(np.abs(grad).max())
    weights, bias = split(result.x)
    fitted = LinearMap(
        method,
        tuple(weights.tolist()) if method == "vector" else tuple(map(tuple, weights.tolist())),
        tuple(bias.tolist()),
    )
    penalty = 0.0
    if method == "matrix":
        penalty = lam_od * float((weights * off).pow(2).sum()) / max(k * (k - 1), 1)
        penalty += lam_b * float(bias.pow(2).sum()) / k
    return LinearFit(
        method=method,
        input="logits" if kind == "logits" else "log-probabilities",
        nll_before=nll_before,
        nll_after=value - penalty,
        objective_after=value,
        l2_off_diagonal=lam_od,
        l2_bias=lam_b,
        n_parameters=n_weights + k,
        iterations=int(result.nit),
        gradient_max=gradient_max,
        gradient_tol=gradient_tol,
        max_iterations=max_iterations,
        converged=gradient_max < gradient_tol,
        n_samples=n,
        calibrator=fitted,
    )


def _numbers(values: Any, source: str, what: str) -> tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise InputError(source, f"{what} must be a non-empty list of numbers")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(source, f"{what} must hold numbers only, got {value!r}")
    return tuple(float(value) for value in values)


def _check_map(method: Any, weights: tuple[Any, ...], bias: tuple[float, ...], source: str) -> None:
    if method not in LINEAR_METHODS:
        raise InputError(source, f"unknown method {method!r}", "vector or matrix")
    k = len(bias)
    rows = [weights] if method == "vector" else list(weights)
    if len(weights) != k or any(len(row) != k for row in rows):
        shape = f"{k}" if method == "vector" else f"{k}×{k}"
        raise InputError(source, f"{method} scaling weights must be {shape} for {k} biases")
    if not all(math.isfinite(v) for row in rows for v in row) or not all(
        math.isfinite(v) for v in bias
    ):
        raise InputError(source, f"{method} scaling weights and bias must be finite")
