"""Vector and matrix scaling: a linear map of the scores, then softmax, fitted by NLL.

For N×K inputs x (the logits z themselves for ``kind`` ``logits``; log p, floored at
:data:`LOG_FLOOR`, for ``probs``/``logprobs``) the calibrated probabilities are

    q = softmax(w ⊙ x + b)          vector scaling (Guo et al. 2017), w, b ∈ R^K
    q = softmax(W x + b)            matrix scaling (Guo et al. 2017), W ∈ R^{K×K}, b ∈ R^K

(on log-probabilities matrix scaling is Dirichlet calibration, Kull et al. 2019). The fit
minimises on the fit split, in float64,

    L = mean_n[logsumexp(s_n) − s_{n,y_n}]
        + λ_od · Σ_{i≠j} W_ij² / (K(K−1)) + λ_b · Σ_j b_j² / K      (matrix scaling only)

the off-diagonal and intercept regulariser (ODIR) of Kull et al. 2019, its strength λ_od = λ_b
chosen by stratified cross-validation on the fit split (:func:`fit_matrix_odir`); vector scaling has no
regulariser (its b is reported centred, Σ_j b_j = 0: softmax ignores a common shift). L is
convex in the parameters (the scores are linear in them), so L-BFGS
started at the identity (w = 1 or W = I, b = 0) reaches the minimum; it stops when the largest
component of the gradient falls under :data:`GRADIENT_TOL` (``converged``) or after
:data:`MAX_ITERATIONS` (a line search that ends early is restarted, at most :data:`RESTARTS`
times), then polishes with Newton steps (conjugate gradients on exact Hessian-vector
products, a step kept only when it lowers max |gradient|), and says whether the gradient
ended under the tolerance. Gradients are closed form: with G = (q − onehot(y))/N,
∂L/∂w = Σ_n G_n ⊙ x_n, ∂L/∂W = Gᵀx (+ the regulariser), ∂L/∂b = Σ_n G_n. Pure: no file I/O,
no printing, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg

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
#: Most restarts of L-BFGS after a line search that ends above the tolerance.
RESTARTS = 5
#: Newton steps after L-BFGS, and conjugate-gradient iterations (Hessian-vector products,
#: one pass over the N×K scores each) per step.
NEWTON_STEPS = 4
#: The polish stops once max |gradient| is this fraction of the tolerance.
POLISH_FACTOR = 1e-2
CG_ITERATIONS = 200
#: Relative residual at which conjugate gradients stop: an inexact Newton step still shrinks
#: the gradient by about this factor.
CG_RTOL = 1e-8
#: L-BFGS history (pairs of parameter-sized vectors kept).
HISTORY = 10
#: ODIR strengths of matrix scaling when fixed (:func:`fit_linear`'s default, and the fallback
#: of :func:`fit_matrix_odir` on a fit split too small for its folds).
L2_OFF_DIAGONAL = 1e-2
L2_BIAS = 1e-2
#: The ODIR strengths λ (λ_od = λ_b = λ) cross-validation chooses from, and its folds.
ODIR_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
CV_FOLDS = 5
#: log p below this (exact zeros among them) is raised to it: log of float64's smallest normal.
LOG_FLOOR = math.log(2.2250738585072014e-308)
#: The most classes matrix scaling takes: its K² + K parameters and L-BFGS history in float64
#: need about 8·(2·HISTORY + 6)·(K² + K) bytes (K = 1000: 0.21 GB; K = 2048: 0.87 GB).
MAX_MATRIX_CLASSES = 2048


def matrix_memory_bytes(n_classes: int) -> int:
    """Bytes of float64 parameters, gradient and L-BFGS history of matrix scaling with
    ``n_classes`` classes (the work arrays come on top: about six float64 arrays of N×K)."""
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
    ``cv_strengths``/``cv_nll``: the ODIR strengths λ (λ_od = λ_b = λ) tried by
    :func:`fit_matrix_odir` and their mean held-out NLL over ``cv_folds`` folds (empty when the
    strength was fixed).
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
    cv_folds: int = 0
    cv_strengths: tuple[float, ...] = ()
    cv_nll: tuple[float, ...] = ()

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
    # A line search in float64 cannot resolve decreases below the rounding of L, and may end
    # early with the gradient still above the tolerance: restart from there with a fresh
    # history (the gradient test, not the line search, decides convergence).
    theta, iterations = theta0, 0
    for _ in range(RESTARTS):
        result = minimize(
            nll_and_grad,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={
                "maxiter": max_iterations - iterations,
                "maxfun": 4 * max_iterations,
                "gtol": gradient_tol,
                "ftol": 0.0,
                "maxcor": HISTORY,
            },
        )
        theta, iterations = result.x, iterations + int(result.nit)
        if np.abs(result.jac).max() < gradient_tol or iterations >= max_iterations:
            break
        if int(result.nit) == 0:
            break

    def hessian_at(theta: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        weights, bias = split(theta)
        q = torch.softmax((x * weights if method == "vector" else x @ weights.T) + bias, dim=1)

        def times(vector: np.ndarray) -> np.ndarray:
            d_weights, d_bias = split(np.ascontiguousarray(vector, dtype=np.float64))
            ds = (x * d_weights if method == "vector" else x @ d_weights.T) + d_bias
            r = (q * ds - q * (q * ds).sum(1, keepdim=True)) / n
            h_w = (r * x).sum(0) if method == "vector" else r.T @ x
            h_b = r.sum(0)
            if method == "matrix":
                h_w = h_w + 2 * lam_od * d_weights * off / max(k * (k - 1), 1)
                h_b = h_b + 2 * lam_b * d_bias / k
            return torch.cat([h_w.reshape(-1), h_b]).numpy()

        return times

    theta = _newton_polish(theta, nll_and_grad, hessian_at, gradient_tol)
    value, grad = nll_and_grad(theta)
    gradient_max = float(np.abs(grad).max())
    weights, bias = split(theta)
    if method == "vector":  # softmax ignores a common shift of b: report the centred one
        bias = bias - bias.mean()
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
        iterations=iterations,
        gradient_max=gradient_max,
        gradient_tol=gradient_tol,
        max_iterations=max_iterations,
        converged=gradient_max < gradient_tol,
        n_samples=n,
        calibrator=fitted,
    )


def cv_folds(labels: torch.Tensor, folds: int, seed: int) -> np.ndarray:
    """The fold (0..folds−1) of every sample: stratified, each class's samples in a seeded
    random order dealt to the folds in turn (fold sizes differ by at most one per class)."""
    y = labels.numpy()
    order = np.random.default_rng(seed).permutation(len(y))
    fold = np.empty(len(y), dtype=np.int64)
    for cls in np.unique(y):
        members = order[y[order] == cls]
        fold[members] = np.arange(len(members)) % folds
    return fold


def fit_matrix_odir(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    source: str = "scores",
    labels_source: str = "labels",
    seed: int = 0,
    grid: tuple[float, ...] = ODIR_GRID,
    folds: int = CV_FOLDS,
) -> LinearFit:
    """Matrix scaling with the ODIR strength λ chosen by ``folds``-fold stratified
    cross-validation on (``scores``, ``labels``) (Kull et al. 2019): for every λ of ``grid``
    fit on all folds but one and take the mean NLL of the held-out fold; the λ with the lowest
    mean (the larger λ on ties) is refitted on all samples. A split with fewer than two
    samples of some class per fold falls back to the fixed strengths of :func:`fit_linear`."""
    x = linear_inputs(scores, kind, source)
    n, k = x.shape
    y = class_labels(labels, n, k, labels_source)
    counts = torch.bincount(y, minlength=k)
    present = counts[counts > 0]
    given = "logits" if kind == "logits" else "log-probabilities"
    if len(present) < 2 or int(present.min()) < 2 * folds:
        return replace(fit_linear(x, y, "matrix", "logits", source, labels_source), input=given)
    fold = torch.from_numpy(cv_folds(y, folds, seed))
    held_out_nll = []
    for strength in grid:
        total = 0.0
        for f in range(folds):
            train, test = fold != f, fold == f
            fitted = fit_linear(
                x[train], y[train], "matrix", "logits", source, labels_source, strength, strength
            ).calibrator
            logq = fitted.apply(x[test], "logits", source)
            total += float(-logq[torch.arange(len(logq)), y[test]].sum())
        held_out_nll.append(total / n)
    best = min(range(len(grid)), key=lambda i: (held_out_nll[i], -grid[i]))
    chosen = fit_linear(x, y, "matrix", "logits", source, labels_source, grid[best], grid[best])
    return replace(
        chosen,
        input=given,
        cv_folds=folds,
        cv_strengths=tuple(grid),
        cv_nll=tuple(held_out_nll),
    )


def _newton_polish(
    theta: np.ndarray,
    nll_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    hessian_at: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]],
    gradient_tol: float,
) -> np.ndarray:
    """Newton steps θ − H⁻¹∇L, each solved by at most :data:`CG_ITERATIONS` conjugate-gradient
    iterations with exact Hessian-vector products; a step is kept only when it lowers
    max |∇L| (a test that, unlike a line search on L, is not lost in the rounding of L). Stops
    once max |∇L| is under ``POLISH_FACTOR`` · ``gradient_tol``."""
    gradient = nll_and_grad(theta)[1]
    for _ in range(NEWTON_STEPS):
        if np.abs(gradient).max() < POLISH_FACTOR * gradient_tol:
            break
        size = theta.size
        operator = LinearOperator((size, size), matvec=hessian_at(theta), dtype=np.float64)
        step, _ = cg(operator, gradient, rtol=CG_RTOL, maxiter=CG_ITERATIONS)
        candidate = theta - step
        new_gradient = nll_and_grad(candidate)[1]
        if not np.abs(new_gradient).max() < np.abs(gradient).max():
            break
        theta, gradient = candidate, new_gradient
    return theta


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
        got = (
            f"{len(weights)}"
            if method == "vector"
            else "rows of " + str(sorted({len(row) for row in rows}))
        )
        raise InputError(
            source, f"{method} scaling needs {shape} weights for its {k} biases, got {got}"
        )
    if not all(math.isfinite(v) for row in rows for v in row) or not all(
        math.isfinite(v) for v in bias
    ):
        raise InputError(source, f"{method} scaling weights and bias must be finite")
