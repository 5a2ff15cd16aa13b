"""Vector, matrix and Dirichlet scaling: a linear map of the scores, then softmax, fitted by NLL.

The calibrated probabilities of N×K inputs x are

    q = softmax(w ⊙ x + b)          vector scaling (Guo et al. 2017), w, b ∈ R^K
    q = softmax(W x + b)            matrix scaling (Guo et al. 2017), W ∈ R^{K×K}, b ∈ R^K
    q = softmax(W log p + b)        Dirichlet calibration (Kull et al. 2019), the same W, b

where x, for vector and matrix scaling, is the logits z themselves for ``kind`` ``logits`` and
log p for ``probs``/``logprobs``; Dirichlet calibration always takes log p (log_softmax z for
logits). log p is floored at :data:`LOG_FLOOR`. On probabilities matrix scaling and Dirichlet
calibration are the same map; on logits they differ (W z and W (z − logsumexp z) differ
unless every row of W sums to the same number). The fit minimises on the fit split, in
float64,

    L = mean_n[logsumexp(s_n) − s_{n,y_n}] + R(W, b)

with R, for the full maps (:func:`penalty_weights`), the off-diagonal and intercept
regulariser (ODIR) of Kull et al. 2019, λ_od · Σ_{i≠j} W_ij² / (K(K−1)) + λ_b · Σ_j b_j² / K,
or (Dirichlet's L2 variant) λ · (Σ_ij W_ij² + Σ_j b_j²) / (K(K+1)), its strength chosen by
stratified cross-validation on the fit split (:func:`fit_matrix_odir`); vector scaling has no
regulariser (its b is reported centred, Σ_j b_j = 0: softmax ignores a common shift). L is
convex in the parameters (the scores are linear in them), so a descent method started at the
identity (w = 1 or W = I, b = 0) reaches the minimum. Vector scaling takes Newton steps with a
backtracking line search (:func:`_newton`: exact steps from the formed 2K×2K Hessian up to
:data:`VECTOR_DENSE_CLASSES` classes, else conjugate gradients on Hessian-vector products); the
full maps are fitted in whitened coordinates (:class:`_FullProblem`) by a preconditioned
trust-region Newton–CG (:func:`_trust_newton`), preconditioned by a Kronecker approximation of
the Hessian until a step's solve needs :data:`STRETCH_PRODUCTS` products, then (a regularised
fit that nearly interpolates) by per-class blocks (:mod:`curvcal.calibration.class_blocks`). Only if Newton stalls above the tolerance does
L-BFGS go on from there (a line search that ends early is restarted, at most
:data:`RESTARTS` times), followed by Newton polish steps (each kept only when it lowers
max |gradient|). The fit is ``converged`` when the largest component of the gradient ends
under :data:`GRADIENT_TOL` within :data:`MAX_ITERATIONS`. Gradients are closed form: with
G = (q − onehot(y))/N, ∂L/∂w = Σ_n G_n ⊙ x_n, ∂L/∂W = Gᵀx (+ the regulariser),
∂L/∂b = Σ_n G_n. Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg

from curvcal.calibration.class_blocks import (
    BlockBasis,
    block_basis,
    class_block_preconditioner,
    has_block_base,
)
from curvcal.calibration.inputs import (
    INPUTS,
    InputNames,
    check_finite_logits,
    chunk_rows,
    class_labels,
    log_probabilities,
    validated_scores,
)
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import Field, SavedMap, choice, coefficients
from curvcal.errors import InputError, SettingsError, setting_name

LINEAR_METHODS = ("vector", "matrix", "dirichlet")
#: Regularisers of the full maps: off-diagonal and intercept (ODIR), or L2 on every parameter.
REGULARISERS = ("odir", "l2")
#: Eigenvalues of AᵀA/N below this fraction of the largest are raised to it when whitening
#: (a direction the scores do not span is then left to the regulariser).
WHITEN_FLOOR = 1e-10
#: Stop when max |∂L/∂θ| falls under this (L is a mean NLL in nats).
GRADIENT_TOL = 1e-8
#: Most L-BFGS iterations; a fit that reaches it reports ``converged`` false.
MAX_ITERATIONS = 10_000
#: Most restarts of L-BFGS after a line search that ends above the tolerance.
RESTARTS = 5
#: Newton steps after L-BFGS, and conjugate-gradient iterations (Hessian-vector products,
#: one pass over the N×K scores each) per step.
NEWTON_STEPS = 8
#: The polish stops once max |gradient| is this fraction of the tolerance.
POLISH_FACTOR = 1e-2
CG_ITERATIONS = 200
#: Most Newton steps of a full map's fit before it falls back to L-BFGS and the polish, and
#: halvings of a step in its line search.
NEWTON_ITERATIONS = 100
LINE_SEARCH_HALVINGS = 30
#: The full maps' trust-region Newton (:func:`_trust_newton`) keeps a step when L falls by at
#: least this fraction of the decrease its quadratic model predicts, and gives up at a point
#: after this many tries along a step (each a quarter of the last).
TRUST_ACCEPT = 1e-4
TRUST_REJECTIONS = 30
#: A full map's fit changes to the per-class block preconditioner
#: (:mod:`curvcal.calibration.class_blocks`) once a Newton step's solve has needed this many
#: Hessian products with the Kronecker one: the sign of the nearly interpolating stretch, where
#: the Kronecker preconditioner leaves conjugate gradients near their cap. Measured, Dirichlet
#: ODIR λ = 0.01, products (CPU s) of the whole fit, 20 against 40: 2,000 × 300: 227 (8.3)
#: against 313 (9.1); 2,000 × 1,000: 130 (87.4) against 360 (95.5); 20,000 × 100, where the
#: Kronecker one needs 2–33 products a step: 110 (2.7) against 127 (2.5).
STRETCH_PRODUCTS = 20
#: Relative residual at which conjugate gradients stop: an inexact Newton step still shrinks
#: the gradient by about this factor (and each step starts from a new Hessian, so a loose
#: solve costs steps, not accuracy).
CG_RTOL = 1e-3
#: L-BFGS hands over to the Newton polish once the largest component of its gradient is under
#: this; only when the polish cannot reach :data:`GRADIENT_TOL` does L-BFGS go on to it.
HANDOFF_TOL = 1e-4
#: L-BFGS history (pairs of parameter-sized vectors kept).
HISTORY = 10
#: ODIR strengths of matrix scaling when fixed (:func:`fit_linear`'s default, and the fallback
#: of :func:`fit_matrix_odir` on a fit split too small for its folds).
L2_OFF_DIAGONAL = 1e-2
L2_BIAS = 1e-2
#: The ODIR strengths λ (λ_od = λ_b = λ) cross-validation chooses from, and its folds.
ODIR_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
CV_FOLDS = 5
#: Cross-validation walks the grid from the largest λ down and stops once the mean held-out
#: NLL has risen at this many strengths in a row (the smaller ones, the costliest fits, are
#: then not tried); ``None`` tries the whole grid.
CV_PATIENCE = 2
#: log p below this (exact zeros among them) is raised to it: log of float64's smallest normal.
LOG_FLOOR = math.log(2.2250738585072014e-308)
#: The most classes the full maps take: their K² + K parameters, L-BFGS history and whitening
#: in float64 need about 8·(2·HISTORY + 10)·(K² + K) bytes (K = 1000: 0.24 GB; K = 2048:
#: 1.0 GB).
MAX_MATRIX_CLASSES = 2048


def matrix_memory_bytes(n_classes: int) -> int:
    """Bytes of the float64 (K+1)-sized state of a full map's fit with ``n_classes`` classes:
    parameters, gradient, 2·:data:`HISTORY` L-BFGS vectors, scipy's work copies and the four
    (K+1)×(K+1) whitening matrices, bounded by 8·(2·HISTORY + 10)·(K² + K) bytes. The work
    arrays come on top: five float64 arrays of N×(K+1) (scores, whitened scores, scores of
    the map, softmax and its copy for the Hessian) and four float32 ones (whitened scores,
    softmax, and the Hessian-vector product's two), and, once the per-class block preconditioner
    is in use (:mod:`curvcal.calibration.class_blocks`), two more float64 N×(K+1) (the rotated
    rows and the curvatures q(1 − q))."""
    return 8 * (2 * HISTORY + 10) * (n_classes * n_classes + n_classes)


@dataclass(frozen=True)
class LinearMap(SavedMap):
    """A fitted vector, matrix or Dirichlet scaling map: ``method`` ``vector`` (``weights`` K
    numbers), ``matrix`` or ``dirichlet`` (``weights`` K rows of K numbers, W with
    s = W x + b), and ``bias`` K numbers. x: log p for ``dirichlet``; for the others the
    logits when applied to logits, log p otherwise."""

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
    def saved_fields(cls, data: Mapping[str, Any]) -> tuple[Field, ...]:
        """``method``, ``weights`` (K numbers for vector scaling, K×K otherwise) and ``bias``
        (K), every coefficient within ±:data:`~curvcal.calibration.saved.COEFFICIENT_BOUND`."""
        shape: tuple[str, ...] = ("K",) if data.get("method") == "vector" else ("K", "K")
        return (
            choice("method", LINEAR_METHODS),
            coefficients("weights", shape),
            coefficients("bias", ("K",)),
        )

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> LinearMap:
        weights, bias = values["weights"], values["bias"]
        rows = tuple(weights.tolist()) if weights.ndim == 1 else tuple(map(tuple, weights.tolist()))
        return cls(values["method"], rows, tuple(bias.tolist()))

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> torch.Tensor:
        """float64 log-probabilities log softmax(w ⊙ x + b) or log softmax(W x + b) of N×K
        ``scores``."""
        x = linear_inputs(scores, kind, source, self.method)
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


@dataclass(frozen=True)
class LinearFit(MapFit[LinearMap]):
    """Vector or matrix scaling fitted on one split (see the module docstring).

    ``nll_before``/``nll_after``: NLL on the fit split under the identity map and the fitted
    one; ``objective_after`` adds the regulariser, ``regulariser`` (``odir``, ``l2`` or
    ``none`` for vector scaling) with strengths ``l2_off_diagonal``/``l2_bias`` (equal for
    ``l2``). ``converged``: the largest gradient
    component ``gradient_max`` fell under ``gradient_tol`` within ``max_iterations``.
    ``cv_strengths``/``cv_nll``: the ODIR strengths λ (λ_od = λ_b = λ) tried by
    :func:`fit_matrix_odir` and their mean held-out NLL over ``cv_folds`` folds (empty when the
    strength was fixed). ``no_minimum``: why the objective has no minimum on these rows (a
    class with no fit row whose bias, or diagonal weight, is not regularised; for vector
    scaling, which has no regulariser, also a fitted map that puts every fit row's label
    first), so that the map is only where the gradient fell under the tolerance; ``None``
    when it has one (:func:`_no_minimum`).
    """

    method: str
    input: str
    objective_after: float
    l2_off_diagonal: float
    l2_bias: float
    n_parameters: int
    iterations: int
    gradient_max: float
    gradient_tol: float
    max_iterations: int
    converged: bool
    cv_folds: int = 0
    cv_strengths: tuple[float, ...] = ()
    cv_nll: tuple[float, ...] = ()
    regulariser: str = "odir"
    no_minimum: str | None = None


def linear_inputs(scores: Any, kind: str, source: str, method: str = "matrix") -> torch.Tensor:
    """The float64 x the linear maps act on: for vector and matrix scaling the logits for
    ``logits`` (validated finite); else, and always for ``dirichlet``, log p floored at
    :data:`LOG_FLOOR`."""
    if kind == "logits" and method != "dirichlet":
        z = validated_scores(scores, kind, source).to(torch.float64)
        step = chunk_rows(z.shape[1])
        for start in range(0, z.shape[0], step):
            check_finite_logits(z[start : start + step], start, source)
        return z
    return log_probabilities(scores, kind, source).clamp_min(LOG_FLOOR)


def penalty_weights(
    regulariser: str, k: int, strength_off: float, strength_bias: float
) -> torch.Tensor:
    """The K×(K+1) weights c of the regulariser Σ c ⊙ [W, b]² of a full map (W ∈ R^{K×K} and b
    side by side): ``odir`` λ_od/(K(K−1)) off the diagonal of W, 0 on it, λ_b/K on b; ``l2``
    λ/(K(K+1)) on every entry (λ = ``strength_off``); ``none`` zero."""
    c = torch.zeros((k, k + 1), dtype=torch.float64)
    if regulariser == "odir":
        c[:, :k] = strength_off / max(k * (k - 1), 1)
        c[:, :k].fill_diagonal_(0.0)
        c[:, k] = strength_bias / k
    elif regulariser == "l2":
        c[:] = strength_off / (k * (k + 1))
    return c


#: A Hessian-vector product at a point, and a preconditioner for it (``None``: none).
_Hessian = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray] | None]
#: A full map's fit calls a trace, when given, at every point where it evaluates its
#: objective, with the objective (mean NLL + regulariser, float64) and a function that returns
#: that point's map [W, b] (K×(K+1), a new tensor; call it inside the trace, not later). It
#: changes nothing in the fit: a caller that takes its own clock in it gets the solver's
#: (time, objective) path.
Trace = Callable[[float, Callable[[], torch.Tensor]], None]


@dataclass(frozen=True)
class _Solution:
    theta: np.ndarray
    value: float
    nll: float
    iterations: int
    gradient_max: float


@dataclass(frozen=True)
class _Objective:
    """A smooth objective L(θ) as the solvers here see it: ``value_and_gradient`` gives L and
    ∇L, ``hessian_at`` the products of ∇²L at θ with a preconditioner (:data:`_Hessian`),
    ``measure`` a gradient's largest |∂L/∂θ| in the map's own parameters (which decides
    convergence), and ``stretch_at``, for the full maps, the same Hessian with the per-class
    block preconditioner that the nearly interpolating stretch takes (:func:`_trust_newton`)."""

    value_and_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]]
    hessian_at: Callable[[np.ndarray], _Hessian]
    measure: Callable[[np.ndarray], float]
    stretch_at: Callable[[np.ndarray], _Hessian] | None = None


def _residual_tol(current: float, target: float, floor: float = 0.0) -> float:
    """The relative residual η = min(½, max(√g, t/(2g), ``floor``)) a Newton step's solve
    stops at (g = ``current``, t = ``target``): loose far from the minimum, tight near it, but
    no tighter than the last step needs."""
    return min(0.5, max(math.sqrt(current), 0.5 * target / current, floor))


def _rounding_hides(value: float, new_value: float) -> bool:
    """Whether L's change from ``value`` to ``new_value`` is within its rounding (near the
    minimum, where a step is then judged by the gradient instead)."""
    return abs(new_value - value) <= 1e-12 * max(abs(value), 1.0)


def _cg_step(hessian: _Hessian, gradient: np.ndarray, rtol: float) -> np.ndarray:
    """H⁻¹∇L by at most :data:`CG_ITERATIONS` (preconditioned) conjugate-gradient iterations
    on the products ``hessian``, to the relative residual ``rtol``."""
    times, precondition = hessian
    size = gradient.size
    operator = LinearOperator((size, size), matvec=times, dtype=np.float64)
    preconditioner = (
        None
        if precondition is None
        else LinearOperator((size, size), matvec=precondition, dtype=np.float64)
    )
    step, _ = cg(operator, gradient, rtol=rtol, maxiter=CG_ITERATIONS, M=preconditioner)
    return step


def _fall_back(
    objective: _Objective,
    theta: np.ndarray,
    done: bool,
    iterations: int,
    gradient_tol: float,
    max_iterations: int,
    fallback_tol: float,
) -> tuple[np.ndarray, int]:
    """``theta`` and ``iterations`` as Newton left them when it converged (``done``); else
    :func:`_minimise` from there for the iterations left (at least one), its count added."""
    if done:
        return theta, iterations
    theta, more = _minimise(
        objective, theta, gradient_tol, max(max_iterations - iterations, 1), fallback_tol
    )
    return theta, iterations + more


def _minimise(
    objective: _Objective,
    theta0: np.ndarray,
    gradient_tol: float,
    max_iterations: int,
    lbfgs_tol: float,
) -> tuple[np.ndarray, int]:
    """L-BFGS from ``theta0`` until the largest component of its gradient is under
    :data:`HANDOFF_TOL`, then :func:`_newton_polish`; if that does not reach ``gradient_tol``,
    L-BFGS on to ``lbfgs_tol`` (its own gradient's bound that guarantees ``gradient_tol``),
    restarted after a line search that ends early, and the polish again. ``measure`` maps a
    gradient to the max |∂L/∂θ| in the map's own parameters, which decides convergence."""
    result = minimize(
        objective.value_and_gradient,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={
            "maxiter": max_iterations,
            "maxfun": 4 * max_iterations,
            "gtol": max(HANDOFF_TOL, lbfgs_tol),
            "ftol": 0.0,
            "maxcor": HISTORY,
        },
    )
    theta, iterations = result.x, int(result.nit)
    theta = _newton_polish(objective, theta, gradient_tol)
    if (
        objective.measure(objective.value_and_gradient(theta)[1]) < gradient_tol
        or iterations >= max_iterations
    ):
        return theta, iterations
    # A line search in float64 cannot resolve decreases below the rounding of L, and may end
    # early with the gradient still above the tolerance: restart from there with a fresh
    # history (the gradient test, not the line search, decides convergence).
    for _ in range(RESTARTS):
        result = minimize(
            objective.value_and_gradient,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={
                "maxiter": max_iterations - iterations,
                "maxfun": 4 * max_iterations,
                "gtol": lbfgs_tol,
                "ftol": 0.0,
                "maxcor": HISTORY,
            },
        )
        theta, iterations = result.x, iterations + int(result.nit)
        if objective.measure(result.jac) < gradient_tol or iterations >= max_iterations:
            break
        if int(result.nit) == 0:
            break
    theta = _newton_polish(objective, theta, gradient_tol)
    return theta, iterations


def _newton(
    objective: _Objective,
    theta0: np.ndarray,
    gradient_tol: float,
    max_steps: int,
) -> tuple[np.ndarray, int, bool]:
    """Inexact Newton from ``theta0``: each step solves H d = ∇L by preconditioned conjugate
    gradients on exact Hessian-vector products to a relative residual η = min(½, max(√g, t/(2g))) (g =
    ``measure``(∇L), the max |∂L/∂θ| in the map's own parameters, t the target
    ``POLISH_FACTOR`` · ``gradient_tol``: loose far from the minimum, tight near it, so the
    convergence is superlinear, but no tighter than the last step needs), then backtracks on L (Armijo, halving)
    from the full step. Near the minimum, where L's rounding hides its decrease, a step is
    kept when it lowers g instead. Stops once g is under ``POLISH_FACTOR`` · ``gradient_tol``;
    returns the point, the steps taken and whether g ended under ``gradient_tol``."""
    theta = theta0
    value, gradient = objective.value_and_gradient(theta)
    current = objective.measure(gradient)
    target = POLISH_FACTOR * gradient_tol
    steps = 0
    while steps < max_steps and not current < target:
        step = _cg_step(objective.hessian_at(theta), gradient, _residual_tol(current, target))
        slope = -float(step @ gradient)
        if not slope < 0.0:
            break
        steps += 1
        t = 1.0
        accepted = False
        for _ in range(LINE_SEARCH_HALVINGS):
            candidate = theta - t * step
            new_value, new_gradient = objective.value_and_gradient(candidate)
            new = objective.measure(new_gradient)
            if new_value <= value + 1e-4 * t * slope or (
                new < current and _rounding_hides(value, new_value)
            ):
                accepted = True
                break
            t *= 0.5
        if not accepted:
            break
        theta, value, gradient, current = candidate, new_value, new_gradient, new
    return theta, steps, current < gradient_tol


def _steihaug(
    times: Callable[[np.ndarray], np.ndarray],
    precondition: Callable[[np.ndarray], np.ndarray] | None,
    gradient: np.ndarray,
    radius: float,
    rtol: float,
    max_products: int,
    floor: float = -math.inf,
) -> tuple[np.ndarray, float, float]:
    """Steihaug–Toint truncated conjugate gradients: an approximate minimiser d of the model
    m(d) = gᵀd + ½ dᵀHd (g = ``gradient``, H by ``times``) within ‖d‖_M ≤ ``radius``, in the
    norm of M, the matrix whose inverse ``precondition`` applies (the identity when ``None``).
    Preconditioned CG from d = 0; it stops at a relative residual ‖Hd + g‖ ≤ ``rtol`` ‖g‖, on
    the boundary (the last direction followed to it) when an iterate would leave the region or
    meets dᵀHd ≤ 0, where m would fall under ``floor`` (at m = ``floor``), or after
    ``max_products`` products. ‖d‖_M is carried by the recurrences of
    Gould et al. (1999), so M itself is never applied. Returns d, m(d) and ‖d‖_M (``radius`` when d
    is on the boundary)."""

    def apply(vector: np.ndarray) -> np.ndarray:
        return vector.copy() if precondition is None else precondition(vector)

    d = np.zeros_like(gradient)
    r = gradient.copy()
    z = apply(r)
    p = -z
    rz = float(r @ z)
    stop = rtol * float(np.linalg.norm(gradient))
    d_md, d_mp, p_mp, model = 0.0, 0.0, rz, 0.0
    for _ in range(max_products):
        if not rz > 0.0:
            break
        hp = times(p)
        curvature = float(p @ hp)
        r_p = float(r @ p)
        if not curvature > 0.0 and math.isinf(radius):
            break  # no region to go to the edge of: keep the iterate so far
        alpha = rz / curvature if curvature > 0.0 else math.inf
        if not curvature > 0.0 or d_md + 2.0 * alpha * d_mp + alpha * alpha * p_mp >= radius**2:
            # To the boundary along p: the positive root of ‖d + τp‖²_M = radius².
            tau = (-d_mp + math.sqrt(max(d_mp**2 + p_mp * (radius**2 - d_md), 0.0))) / p_mp
            return d + tau * p, model + tau * r_p + 0.5 * tau * tau * curvature, radius
        if model + alpha * r_p + 0.5 * alpha * alpha * curvature < floor:
            # the first τ on p where m = floor: ½ c τ² + (rᵀp) τ + (m − floor) = 0, r_p < 0
            disc = max(r_p * r_p - 2.0 * curvature * (model - floor), 0.0)
            tau = (-r_p - math.sqrt(disc)) / curvature
            norm = d_md + 2.0 * tau * d_mp + tau * tau * p_mp
            return d + tau * p, floor, math.sqrt(max(norm, 0.0))
        d += alpha * p
        r += alpha * hp
        model += alpha * r_p + 0.5 * alpha * alpha * curvature
        d_md += 2.0 * alpha * d_mp + alpha * alpha * p_mp
        if float(np.linalg.norm(r)) <= stop:
            break
        z = apply(r)
        rz_next = float(r @ z)
        beta = rz_next / rz
        d_mp = beta * (d_mp + alpha * p_mp)
        p_mp = rz_next + beta * beta * p_mp
        p = -z + beta * p
        rz = rz_next
    return d, model, math.sqrt(max(d_md, 0.0))


def _trust_newton(
    objective: _Objective, theta0: np.ndarray, gradient_tol: float, max_steps: int
) -> tuple[np.ndarray, int, bool]:
    """Trust-region inexact Newton (Newton–CG, Steihaug) from ``theta0``, for the full maps.

    Each step minimises L's quadratic model m within a radius Δ in the preconditioner's norm
    by :func:`_steihaug`, to a relative residual η = min(½, max(√g, t/(2g))) (g =
    ``measure``(∇L), the max |∂L/∂θ| in the map's own parameters, t = ``POLISH_FACTOR`` ·
    ``gradient_tol``) as :func:`_newton` does, loosened to Eisenstat and Walker's 0.9 (g/g₋₁)²
    when the last step cut g by less than that. The step d is kept when L falls by at least
    :data:`TRUST_ACCEPT` of the model's decrease (near the minimum, where L's rounding hides
    its decrease, when it lowers g instead); when it does not, τd is tried for τ = ¼, 1/16, …
    (m(τd) = τ gᵀd + τ² ½ dᵀHd: no new products), as in Nocedal and Yuan's (1998) trust
    region with backtracking. The ratio ρ of L's decrease to m's at the step kept sets the
    next radius: ρ < ¼: a quarter of the step's length; ρ > ¾ with the whole step on the
    boundary: twice the radius; after backtracking: the length kept. Far from the minimum,
    where the model is poor (a weak regulariser, many classes), CG stops at the boundary after
    a few products instead of running to its cap and the step cannot overshoot far; near it
    every step is interior: plain Newton. There is no radius until the model first predicts
    a decrease larger than L itself, which L ≥ 0 cannot make: CG stops there (m = −L) and
    that step's length is the first radius. Returns the point, the steps kept and whether g
    ended under ``gradient_tol``.

    The objective's ``stretch_at``, when given, is the Hessian with another preconditioner for
    the nearly interpolating stretch: once a step's solve has needed :data:`STRETCH_PRODUCTS`
    products, every later step takes it instead of ``hessian_at`` (the radius, measured in the
    old preconditioner's norm, is dropped)."""
    theta = theta0
    value, gradient = objective.value_and_gradient(theta)
    current = objective.measure(gradient)
    radius = math.inf
    target = POLISH_FACTOR * gradient_tol
    steps = 0
    progress = 0.0
    stretch = False
    while steps < max_steps and not current < target:
        hessian_at = (
            objective.stretch_at if stretch and objective.stretch_at else objective.hessian_at
        )
        times, precondition = hessian_at(theta)
        products = [0]

        def counted(
            vector: np.ndarray,
            times: Callable[[np.ndarray], np.ndarray] = times,
            products: list[int] = products,
        ) -> np.ndarray:
            products[0] += 1
            return times(vector)

        rtol = _residual_tol(current, target, progress)
        step, model, length = _steihaug(
            counted, precondition, gradient, radius, rtol, CG_ITERATIONS, -value
        )
        if objective.stretch_at is not None and not stretch and products[0] >= STRETCH_PRODUCTS:
            stretch, radius = True, math.inf
        slope = float(gradient @ step)
        if not (model < 0.0 and slope < 0.0):
            break
        half_curvature = model - slope  # ½ dᵀHd
        scale = 1.0
        for _ in range(TRUST_REJECTIONS):
            candidate = theta + scale * step
            new_value, new_gradient = objective.value_and_gradient(candidate)
            new = objective.measure(new_gradient)
            predicted = scale * slope + scale * scale * half_curvature
            if _rounding_hides(value, new_value):
                ratio = 1.0 if new < current else 0.0
            else:
                ratio = (value - new_value) / -predicted
            if ratio >= TRUST_ACCEPT:
                break
            scale *= 0.25
        else:
            break
        if model == -value and math.isinf(radius):
            radius = length  # the first time the model's floor stopped a step
        if ratio < 0.25:
            radius = 0.25 * scale * length
        elif scale < 1.0:
            radius = scale * length
        elif ratio > 0.75 and length >= radius:
            radius *= 2.0
        # Eisenstat and Walker's (1996) forcing term 0.9 (g_new / g)²: when the last step cut g
        # by a factor only (a nearly interpolating fit, where L's tail is exponential and a
        # Newton step gains about a factor e whatever the solve), a tighter solve buys nothing.
        progress = 0.9 * (new / current) ** 2 if current > 0.0 else 0.0
        theta, value, gradient, current = candidate, new_value, new_gradient, new
        steps += 1
    return theta, steps, current < gradient_tol


class _FullProblem:
    """The NLL of a full map s = W x + b on fixed (x, y), in whitened coordinates.

    With A = [x, 1] (N×(K+1)) and V = [W, b], s = A Vᵀ. The fit runs in Ṽ = V P⁻¹ with P the
    symmetric inverse square root of AᵀA/N (eigenvalues below :data:`WHITEN_FLOOR` of the
    largest raised to it), so that s = (AP) Ṽᵀ with (AP)ᵀ(AP)/N ≈ I: the same minimiser (an
    invertible change of variables) but a Hessian whose x-side factor is the identity, which
    is what makes L-BFGS and conjugate gradients take few steps when the scores are large or
    correlated. Built once per data set and reused for every regulariser strength; the
    cross-validation folds are subsets of rows of it (:meth:`subset`)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        n = x.shape[0]
        a = torch.cat([x, torch.ones((n, 1), dtype=torch.float64)], dim=1)
        gram = a.T @ a / n
        eigenvalues, vectors = torch.linalg.eigh(gram)
        eigenvalues = eigenvalues.clamp_min(float(eigenvalues.max()) * WHITEN_FLOOR)
        p = (vectors * eigenvalues.rsqrt()) @ vectors.T
        p_inverse = (vectors * eigenvalues.sqrt()) @ vectors.T
        self._set(a @ p, y, p, p_inverse)

    def _set(
        self, a: torch.Tensor, y: torch.Tensor, p: torch.Tensor, p_inverse: torch.Tensor
    ) -> None:
        self.n, self.k, self.y = a.shape[0], a.shape[1] - 1, y
        self.a, self.p, self.p_inverse = a, p, p_inverse
        # max |G_V| ≤ max |G_Ṽ| · max column sum of |P⁻¹| (G_V = G_Ṽ P⁻¹)
        self.gradient_scale = float(p_inverse.abs().sum(0).max())
        self.rows = torch.arange(self.n)

    def subset(self, rows: torch.Tensor) -> _FullProblem:
        """The same problem on the rows ``rows`` (a mask) only, whitened by this P, not by the
        subset's own: still an invertible change of variables (the same minimiser), and a
        cross-validation fold of 1 − 1/folds of the rows has nearly the same second moment,
        so the Hessian's x-side factor stays close to the identity. Saves the fold's own
        whitening (two N·(K+1)² passes and an eigendecomposition)."""
        problem = _FullProblem.__new__(_FullProblem)
        problem._set(self.a[rows], self.y[rows], self.p, self.p_inverse)
        return problem

    def nll(self, theta: np.ndarray) -> float:
        """Mean NLL of the map ``theta`` (whitened) on these rows, summed in row chunks."""
        vt = torch.from_numpy(theta).view(self.k, self.k + 1)
        total = 0.0
        step = chunk_rows(self.k)
        for start in range(0, self.n, step):
            logq = torch.log_softmax(self.a[start : start + step] @ vt.T, dim=1)
            total -= float(logq[torch.arange(logq.shape[0]), self.y[start : start + step]].sum())
        return total / max(self.n, 1)

    def to_whitened(self, v: torch.Tensor) -> np.ndarray:
        return (v @ self.p_inverse).reshape(-1).numpy()

    def to_map(self, theta: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(theta).view(self.k, self.k + 1) @ self.p

    def solve(
        self,
        penalty: torch.Tensor,
        start: torch.Tensor,
        gradient_tol: float,
        max_iterations: int,
        trace: Trace | None = None,
    ) -> _Solution:
        """Minimise mean NLL + Σ ``penalty`` ⊙ V² from V = ``start`` (K×(K+1)); ``trace``
        (:data:`Trace`) sees every objective evaluated."""
        n, k, y, rows = self.n, self.k, self.y, self.rows
        a, p = self.a, self.p
        last_nll = [0.0]
        unregularised = not bool((penalty > 0).any())

        # The softmax at the last point evaluated, which the Hessian at that point reuses.
        last_q: list[Any] = [None, None]

        def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
            vt = torch.from_numpy(theta).view(k, k + 1)
            logq = torch.log_softmax(a @ vt.T, dim=1)
            nll = -float(logq[rows, y].sum()) / n
            if unregularised:
                _refuse_separated(logq, y)
            q = logq.exp_()
            last_q[0], last_q[1] = theta, q.clone()
            q[rows, y] -= 1.0
            grad = q.T @ a / n
            v = vt @ p
            grad += (2.0 * penalty * v) @ p
            last_nll[0] = nll
            objective = nll + float((penalty * v * v).sum())
            if trace is not None:
                trace(objective, lambda: v.clone())
            return objective, grad.reshape(-1).numpy()

        # The regulariser's Hessian in whitened coordinates is 2 P diag(c_i) P for row i;
        # replacing c_i by the column means c̄ of c (exact for ``l2``; for ``odir`` it differs
        # only on the diagonal of W) makes it the same for every row, 2 P diag(c̄) P = U D Uᵀ.
        # float32 first; float64 when Newton stalls with it (a regulariser so weak that the
        # softmax's flat directions drown in float32 rounding).
        precision = [torch.float32]
        a32 = a.to(torch.float32)
        column_mean = penalty.mean(0)
        penalty_values, penalty_vectors = torch.linalg.eigh(2.0 * (p * column_mean) @ p)
        penalty_values = penalty_values.clamp_min(0.0)

        def softmax_at(theta: np.ndarray) -> torch.Tensor:
            """q at ``theta``: the last evaluation's when it was at ``theta``."""
            if last_q[0] is theta:
                return last_q[1]
            return torch.softmax(a @ torch.from_numpy(theta).view(k, k + 1).T, dim=1)

        def hessian_at(theta: np.ndarray, kronecker: bool = True) -> _Hessian:
            q = softmax_at(theta)
            # The product in float32 (half the time of two N×K×(K+1) and two K×(K+1)×(K+1)
            # products): it only steers the step; the gradient that decides convergence stays
            # float64. The preconditioner stays float64: float32's rounding of the directions
            # where M's eigenvalues are tiny, times their huge inverse, would swamp the rest.
            product_dtype = precision[0]
            a_product = a32 if product_dtype == torch.float32 else a
            p_product = p.to(product_dtype)
            penalty_product = (2.0 * penalty).to(product_dtype)
            q32 = _flush_tiny(q.to(product_dtype, copy=True))
            top = q.argmax(1, keepdim=True)

            def times(vector: np.ndarray) -> np.ndarray:
                dvt = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64))
                # The product is linear: taken of the vector scaled to max |entry| 1 and scaled
                # back, so that its intermediates stay far from the subnormal range whatever
                # the vector's size (CG's late directions are tiny).
                scale = float(dvt.abs().max())
                if scale == 0.0:
                    return np.zeros_like(vector, dtype=np.float64)
                if not math.isfinite(scale):
                    scale = 1.0  # a NaN or infinity goes through as it would unscaled
                dvt = (dvt / scale).view(k, k + 1)
                ds = a_product @ dvt.T.to(product_dtype)
                # (diag q − q qᵀ) ds ignores a shift of ds's row; measured from the most
                # probable class's entry, q ⊙ ds − q (qᵀds) loses nothing to cancellation when
                # q is nearly one-hot (where the fit nearly interpolates, as at K = 1000 with
                # few samples per class, float32 would otherwise keep no digit of it).
                ds -= ds.gather(1, top)
                r = q32 * ds
                r -= q32 * r.sum(1, keepdim=True)
                product = r.T @ a_product / n
                product += (penalty_product * (dvt.to(product_dtype) @ p_product)) @ p_product
                return (product.to(torch.float64) * scale).reshape(-1).numpy()

            if not kronecker:
                return times, None
            # H ≈ M ⊗ I + I ⊗ U D Uᵀ: the mean softmax curvature M = mean_n(diag q_n − q_n q_nᵀ)
            # times the whitened scores' second moment (the identity), plus the regulariser
            # with the column means c̄ of its weights: both factors diagonalise at once
            # (M = Q m Qᵀ), so the inverse, Q [(Qᵀ R U) / (m_i + D_j)] Uᵀ, costs four
            # K×K×(K+1) products.
            curvature = torch.diag(q.mean(0)) - q.T @ q / n
            m_values, m_vectors = torch.linalg.eigh(curvature)
            inverse = 1.0 / (m_values.clamp_min(0.0)[:, None] + penalty_values[None, :])
            inverse = torch.where(torch.isfinite(inverse), inverse, 0.0)

            def precondition(vector: np.ndarray) -> np.ndarray:
                d = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64)).view(k, k + 1)
                rotated = m_vectors.T @ d @ penalty_vectors
                out = m_vectors @ (inverse * rotated) @ penalty_vectors.T
                if unregularised:
                    # Without a regulariser L ignores a common shift of every class's row of
                    # Ṽ (softmax ignores it); M's eigenvalue there is 0 only up to rounding,
                    # and its inverse (up to 1e17) sent the steps far along that direction:
                    # the same probabilities, but a map with |W| in the hundreds and CG near
                    # its cap at every step. Projecting it out keeps the iterates' class mean
                    # at the start's.
                    out -= out.mean(0, keepdim=True)
                return out.reshape(-1).numpy()

            return times, precondition

        blocks: list[BlockBasis] = []

        def stretch_at(theta: np.ndarray) -> _Hessian:
            times, _ = hessian_at(theta, kronecker=False)
            if not blocks:
                blocks.append(block_basis(a, p, penalty))
            return times, class_block_preconditioner(blocks[0], softmax_at(theta))

        # An unregularised column has no positive definite block base: Kronecker throughout.
        stretch = stretch_at if has_block_base(penalty) else None

        def measure(gradient: np.ndarray) -> float:
            g = torch.from_numpy(np.ascontiguousarray(gradient)).view(k, k + 1)
            return float((g @ self.p_inverse).abs().max())

        objective = _Objective(value_and_gradient, hessian_at, measure, stretch)
        newton_steps = min(max_iterations, NEWTON_ITERATIONS)
        theta, iterations, done = _trust_newton(
            objective, self.to_whitened(start), gradient_tol, newton_steps
        )
        if not done and precision[0] == torch.float32:
            precision[0] = torch.float64
            theta, more, done = _trust_newton(
                objective, theta, gradient_tol, max(newton_steps - iterations, 1)
            )
            iterations += more
        theta, iterations = _fall_back(
            objective, theta, done, iterations,
            gradient_tol, max_iterations, gradient_tol / self.gradient_scale,
        )  # fmt: skip
        value, gradient = value_and_gradient(theta)
        return _Solution(theta, value, last_nll[0], iterations, measure(gradient))


def _flush_tiny(q: torch.Tensor) -> torch.Tensor:
    """``q`` (probabilities, in place) with every entry below √(smallest normal number) of its
    dtype set to 0 (float32: 1.1e-19; float64: 1.5e-154).

    Where a fit nearly interpolates, most of q's entries are far below any curvature the
    float32 Hessian product resolves, and many are subnormal, or make subnormal products with
    the scores: a CPU computes those about 100× slower (a float32 N×K by K×(K+1) product with
    subnormal entries measured 130× slower, one thread), which made a full map's last Newton
    steps at K ≥ 200 cost several times their products. An entry this small adds less than
    √tiny · max |a|² to any curvature, far below the product's own rounding (its terms of size
    q_top · |a|² carry a relative error of the dtype's epsilon)."""
    floor = math.sqrt(torch.finfo(q.dtype).tiny)
    return q.masked_fill_(q < floor, 0.0)


def _labels_first(scores: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether every row of N×K ``scores`` puts its label ``y`` strictly first."""
    rows = torch.arange(scores.shape[0])
    labelled = scores[rows, y]
    others = scores.index_put((rows, y), torch.tensor(-math.inf, dtype=scores.dtype))
    return bool((labelled > others.max(dim=1).values).all())


def _no_minimum(
    x: torch.Tensor,
    y: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor,
    penalty: torch.Tensor | None = None,
) -> str | None:
    """Why the NLL (plus regulariser) of a linear map fitted on (``x``, ``y``) has no minimum,
    given the fitted ``weights`` and ``bias``; ``None`` when it has one as far as these tests
    tell. ``penalty``: the K×(K+1) regulariser weights of a full map (:func:`penalty_weights`),
    ``None`` for vector scaling (no regulariser).

    A class k with no row: ∂L/∂b_k = mean_n q_nk > 0 everywhere, so L falls without end as
    b_k → −∞ when b_k is not regularised; and ∂L/∂W_kk = mean_n q_nk x_nk, of one sign when
    x_k is (log p ≤ 0 of Dirichlet calibration), so L falls without end along W_kk when it is
    not regularised (ODIR leaves the diagonal free). Vector scaling with a map that puts every
    row's label strictly first: c·s does too for every c > 1, with a lower NLL."""
    n, k = x.shape
    free = []
    for cls in (torch.bincount(y, minlength=k) == 0).nonzero().reshape(-1).tolist():
        column = x[:, cls]
        one_sign = bool((column <= 0).all() or (column >= 0).all()) and bool((column != 0).any())
        if penalty is None or penalty[cls, k] == 0 or (penalty[cls, cls] == 0 and one_sign):
            free.append(cls)
    if free:
        named = ", ".join(str(cls) for cls in free[:10]) + (", ..." if len(free) > 10 else "")
        along = (
            "their bias goes to −∞"
            if penalty is None or bool((penalty[free, k] == 0).all())
            else "their diagonal weight grows (not regularised; their input has one sign)"
        )
        return (
            f"{len(free)} of its {k} classes ({named}) {'has' if len(free) == 1 else 'have'} "
            "no fit row, and the NLL falls "
            f"without end as {along}"
        )
    if penalty is not None:
        return None  # a full map that separates the rows with no regulariser is refused
    step = chunk_rows(k)
    if all(
        _labels_first(x[start : start + step] * weights + bias, y[start : start + step])
        for start in range(0, n, step)
    ):
        return (
            f"the fitted map classifies all {n:,} fit rows correctly, and the NLL falls towards "
            "0 as the map is scaled up"
        )
    return None


def _refuse_separated(logq: torch.Tensor, y: torch.Tensor) -> None:
    """Raise when the map whose log-probabilities are ``logq`` puts every row's label strictly
    first: then the classes are separated by a linear map of the scores, and scaling that map
    by c → ∞ drives the unregularised NLL to 0, so it has no minimiser (the fit would chase
    it with ever larger weights until the gradient, which falls like e^{−c}, passes the
    tolerance: a meaningless map, reached slowly through a singular Hessian)."""
    if _labels_first(logq, y):
        raise InputError(
            "full-map fit with no regulariser (λ = 0)",
            f"a linear map of the scores classifies all {logq.shape[0]:,} fit rows correctly, "
            "so the NLL has no minimum (it falls towards 0 as the weights grow)",
            "use an ODIR strength λ > 0; the default chooses one by cross-validation",
        )


#: Vector scaling forms its 2K×2K Hessian exactly and takes exact Newton steps up to this many
#: classes; above it, block-Jacobi preconditioned conjugate gradients on Hessian-vector products.
#: A formed Hessian costs a Gram product of N·(2K)² multiply-adds a Newton step, the products
#: about (m + ½) passes of N·K (m ≈ 1–3 conjugate-gradient iterations a step): both linear in
#: N, so the crossover is in K alone. Measured (one thread, N = 200,000, both paths to the same
#: minimiser): the formed Hessian 1.0–1.6× faster at K ≤ 30, level at K = 40–64, 1.7–1.9×
#: slower at K = 100; at K = 1,000 one formed Hessian (9 s) costs nearly a whole fit by
#: products (11 s).
VECTOR_DENSE_CLASSES = 32
#: Eigenvalues of vector scaling's Hessian at most this fraction of the largest count as zero.
VECTOR_RCOND = 1e-13
#: Rows per chunk of the Hessian's matrix product.
VECTOR_HESSIAN_ROWS = 1024


def _softmax_rows(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q = softmax(w ⊙ x + b) of the rows ``x`` (a new tensor) and their logsumexp."""
    s = torch.addcmul(b, x, w)
    top = s.amax(1, keepdim=True)
    s -= top
    s.exp_()
    total = s.sum(1, keepdim=True)
    s /= total
    return s, (top + total.log()).squeeze(1)


def _vector_value_gradient(
    x: torch.Tensor,
    labelled: torch.Tensor,
    counts: torch.Tensor,
    theta: np.ndarray,
    probabilities: torch.Tensor,
) -> tuple[float, np.ndarray]:
    """Vector scaling's mean NLL L at θ = [w, b] and its gradient, in one pass over the rows in
    chunks, writing q = softmax(w ⊙ x + b) into ``probabilities`` (N×K): L = (Σ_n
    logsumexp(s_n) − Σ_j (w_j·X_j + b_j·N_j))/N with X_j = Σ_{n: y_n = j} x_nj (``labelled``)
    and N_j the count of label j (``counts``), ∂L/∂w = (Σ_n q_n ⊙ x_n − X)/N, ∂L/∂b = (Σ_n q_n
    − N_j)/N."""
    n, k = x.shape
    t = torch.from_numpy(theta)
    w, b = t[:k], t[k:]
    lse = torch.zeros((), dtype=torch.float64)
    q_sum = torch.zeros(k, dtype=torch.float64)
    qx_sum = torch.zeros(k, dtype=torch.float64)
    step = chunk_rows(k)
    for start in range(0, n, step):
        rows = x[start : start + step]
        q, row_lse = _softmax_rows(rows, w, b)
        probabilities[start : start + step] = q
        lse += row_lse.sum()
        q_sum += q.sum(0)
        qx_sum += q.mul_(rows).sum(0)
    value = float(lse - w @ labelled - b @ counts) / n
    return value, torch.cat([(qx_sum - labelled) / n, (q_sum - counts) / n]).numpy()


def _vector_hessian(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Vector scaling's 2K×2K Hessian where the probabilities are ``q`` (N×K), formed exactly:
    with C_n = diag(q_n) − q_n q_nᵀ, H_ww = Σ_n diag(x_n) C_n diag(x_n)/N, H_wb = Σ_n
    diag(x_n) C_n/N, H_bb = Σ_n C_n/N, i.e. diag(Σ_n [q⊙x⊙x, q⊙x; q⊙x, q]) − AᵀA with A =
    [q⊙x, q] (N×2K), one matrix product per chunk of rows."""
    n, k = x.shape
    gram = torch.zeros((2 * k, 2 * k), dtype=torch.float64)
    qxx_sum = torch.zeros(k, dtype=torch.float64)
    qx_sum = torch.zeros(k, dtype=torch.float64)
    q_sum = torch.zeros(k, dtype=torch.float64)
    step = VECTOR_HESSIAN_ROWS
    for start in range(0, n, step):
        rows = x[start : start + step]
        q_rows = q[start : start + step]
        a = torch.cat([q_rows * rows, q_rows], dim=1)
        gram.addmm_(a.T, a)
        qx = a[:, :k]
        q_sum += q_rows.sum(0)
        qx_sum += qx.sum(0)
        qxx_sum += (qx * rows).sum(0)
    hessian = gram.neg_()
    hessian.diagonal()[:k] += qxx_sum
    hessian.diagonal()[k:] += q_sum
    hessian.diagonal(k)[:] += qx_sum
    hessian.diagonal(-k)[:] += qx_sum
    return hessian.div_(n)


def _pseudo_inverse(hessian: torch.Tensor) -> Callable[[np.ndarray], np.ndarray]:
    """v ↦ H⁺v for a symmetric positive semi-definite H, by its eigendecomposition: directions
    whose eigenvalue is at most :data:`VECTOR_RCOND` times the largest are left out (the
    softmax's b → b + c·1 always, and any other direction along which every row's scores move
    by a common shift, e.g. w_j, b_j along (1, −c) when x_·j ≡ c: the NLL is exactly constant
    along them, so the Newton step, the minimum-norm solution, moves none of them)."""
    values, vectors = torch.linalg.eigh(hessian)
    kept = values > VECTOR_RCOND * max(float(values[-1]), 0.0)
    basis = vectors[:, kept].numpy()
    inverse = (1.0 / values[kept]).numpy()

    def solve(v: np.ndarray) -> np.ndarray:
        return basis @ (inverse * (basis.T @ v))

    return solve


def _vector_products(x: torch.Tensor, q: torch.Tensor) -> _Hessian:
    """Hessian-vector products of vector scaling where the probabilities are ``q`` (N×K; one
    chunked pass over x and q each), and the block-Jacobi preconditioner: the Hessian's 2×2
    block of (w_j, b_j), Σ_n q_nj(1 − q_nj) [x², x; x, 1]/N, inverted exactly for every class;
    it leaves out only the coupling −q_ni q_nj between classes."""
    n, k = x.shape
    h_bb = torch.zeros(k, dtype=torch.float64)
    h_wb = torch.zeros(k, dtype=torch.float64)
    h_ww = torch.zeros(k, dtype=torch.float64)
    step = chunk_rows(k)
    for start in range(0, n, step):
        rows = x[start : start + step]
        q_rows = q[start : start + step]
        c = q_rows * (1.0 - q_rows)
        h_bb += c.sum(0)
        cx = c.mul_(rows)
        h_wb += cx.sum(0)
        h_ww += cx.mul_(rows).sum(0)
    h_bb /= n
    h_wb /= n
    h_ww /= n
    det = h_ww * h_bb - h_wb * h_wb
    usable = det > 1e-300
    det = torch.where(usable, det, 1.0)

    def times(vector: np.ndarray) -> np.ndarray:
        d = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64))
        dw, db = d[:k], d[k:]
        out_w = torch.zeros(k, dtype=torch.float64)
        out_b = torch.zeros(k, dtype=torch.float64)
        for start in range(0, n, step):
            rows = x[start : start + step]
            q_rows = q[start : start + step]
            r = torch.addcmul(db, rows, dw).mul_(q_rows)
            r.addcmul_(q_rows, r.sum(1, keepdim=True), value=-1.0)
            out_b += r.sum(0)
            out_w += r.mul_(rows).sum(0)
        return torch.cat([out_w, out_b]).div_(n).numpy()

    def precondition(vector: np.ndarray) -> np.ndarray:
        d = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64))
        dw, db = d[:k], d[k:]
        out_w = torch.where(usable, (h_bb * dw - h_wb * db) / det, dw)
        out_b = torch.where(usable, (h_ww * db - h_wb * dw) / det, db)
        return torch.cat([out_w, out_b]).numpy()

    return times, precondition


def _vector_exact(x: torch.Tensor, q: torch.Tensor) -> _Hessian:
    """The exact Hessian where the probabilities are ``q`` (:func:`_vector_hessian`) as a
    product and its pseudo-inverse as the preconditioner: conjugate gradients then return
    the exact Newton step H⁺∇L in one iteration, with no pass over the rows."""
    hessian = _vector_hessian(x, q)
    dense = hessian.numpy()

    def times(vector: np.ndarray) -> np.ndarray:
        return dense @ vector

    return times, _pseudo_inverse(hessian)


def _fit_vector(
    x: torch.Tensor, y: torch.Tensor, gradient_tol: float, max_iterations: int
) -> tuple[torch.Tensor, torch.Tensor, _Solution]:
    """Vector scaling s = w ⊙ x + b from w = 1, b = 0 (no regulariser), by Newton's method:
    exact steps from the formed Hessian when K ≤ :data:`VECTOR_DENSE_CLASSES`, else
    conjugate gradients on Hessian-vector products with a block-Jacobi preconditioner."""
    n, k = x.shape
    labelled = torch.zeros(k, dtype=torch.float64).index_add_(0, y, x[torch.arange(n), y])
    counts = torch.bincount(y, minlength=k).to(torch.float64)
    # q at the last θ evaluated: Newton asks for the Hessian where it last took the gradient
    q = torch.empty_like(x)
    last: list[tuple[np.ndarray, float, np.ndarray]] = []

    def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        if last and np.array_equal(last[0][0], theta):
            return last[0][1], last[0][2]
        value, gradient = _vector_value_gradient(x, labelled, counts, theta, q)
        last[:] = [(theta.copy(), value, gradient)]
        return value, gradient

    def hessian_at(theta: np.ndarray) -> _Hessian:
        value_and_gradient(theta)  # q at θ
        return _vector_exact(x, q) if k <= VECTOR_DENSE_CLASSES else _vector_products(x, q)

    def measure(gradient: np.ndarray) -> float:
        return float(np.abs(gradient).max())

    objective = _Objective(value_and_gradient, hessian_at, measure)
    theta0 = torch.cat([torch.ones(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)])
    theta, iterations, done = _newton(
        objective, theta0.numpy(), gradient_tol, min(max_iterations, NEWTON_ITERATIONS)
    )
    theta, iterations = _fall_back(
        objective, theta, done, iterations, gradient_tol, max_iterations, gradient_tol
    )
    value, gradient = value_and_gradient(theta)
    t = torch.from_numpy(theta)
    solution = _Solution(theta, value, value, iterations, measure(gradient))
    return t[:k].clone(), t[k:].clone(), solution


def _identity(k: int) -> torch.Tensor:
    return torch.cat(
        [torch.eye(k, dtype=torch.float64), torch.zeros((k, 1), dtype=torch.float64)], 1
    )


def _nll_of(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> float:
    """Mean NLL of the full map V = [W, b] on (x, y), summed in row chunks."""
    k = x.shape[1]
    total = 0.0
    step = chunk_rows(k)
    for start in range(0, x.shape[0], step):
        logq = torch.log_softmax(x[start : start + step] @ v[:, :k].T + v[:, k], dim=1)
        total -= float(logq[torch.arange(logq.shape[0]), y[start : start + step]].sum())
    return total / max(x.shape[0], 1)


def fit_linear(
    scores: Any,
    labels: Any,
    method: str,
    kind: str = "logits",
    names: InputNames = INPUTS,
    l2_off_diagonal: float = L2_OFF_DIAGONAL,
    l2_bias: float = L2_BIAS,
    gradient_tol: float = GRADIENT_TOL,
    max_iterations: int = MAX_ITERATIONS,
    regulariser: str = "odir",
    start: torch.Tensor | None = None,
    problem: _FullProblem | None = None,
    trace: Trace | None = None,
) -> LinearFit:
    """Fit vector (``method="vector"``), matrix or Dirichlet scaling on (``scores``,
    ``labels``) by Newton's method (see the module docstring) on the regularised mean NLL, in
    float64.

    ``regulariser`` (full maps): ``odir`` (λ_od = ``l2_off_diagonal``, λ_b = ``l2_bias``) or
    ``l2`` (λ = ``l2_off_diagonal``), see :func:`penalty_weights`. The fit starts at the
    identity map, or at ``start`` ([W, b], K×(K+1)) when given (a warm start: the minimiser is
    the same, the path shorter). ``problem``: the whitened data of these scores, when the
    caller already built it. A full map with both strengths 0 on classes that a linear map of
    the scores separates has no minimiser and is refused (:class:`InputError`) as soon as the
    fit meets such a map. ``trace`` (full maps only, off by default): called at every
    objective the solver evaluates (:data:`Trace`); the fit is the same with or without it."""
    if method not in LINEAR_METHODS:
        raise SettingsError(
            "method", f"unknown linear map {method!r}", "vector, matrix or dirichlet"
        )
    x = linear_inputs(scores, kind, names.scores, method)
    y = class_labels(labels, x.shape[0], x.shape[1], names.labels)
    given = "logits" if kind == "logits" and method != "dirichlet" else "log-probabilities"
    return _fit_inputs(
        x,
        y,
        method,
        given,
        strengths=(l2_off_diagonal, l2_bias),
        stopping=(gradient_tol, max_iterations),
        regulariser=regulariser,
        start=start,
        problem=problem,
        trace=trace,
    )


def _fit_inputs(
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    given: str,
    *,
    strengths: tuple[float, float],
    stopping: tuple[float, int],
    regulariser: str,
    start: torch.Tensor | None,
    problem: _FullProblem | None,
    trace: Trace | None,
) -> LinearFit:
    """:func:`fit_linear` on validated float64 inputs ``x`` (what the map multiplies) and
    labels ``y``, with its ``(l2_off_diagonal, l2_bias)`` as ``strengths`` and its
    ``(gradient_tol, max_iterations)`` as ``stopping`` (their defaults are
    :func:`fit_linear`'s alone); ``given`` names the scale of ``x`` in the record."""
    l2_off_diagonal, l2_bias = strengths
    gradient_tol, max_iterations = stopping
    if regulariser not in REGULARISERS:
        raise InputError("regulariser", f"unknown regulariser {regulariser!r}", "odir or l2")
    n, k = x.shape
    if method == "vector" and trace is not None:
        raise InputError("trace", "only the full maps (matrix, dirichlet) report a trace")
    if method != "vector" and k > MAX_MATRIX_CLASSES:
        raise SettingsError(
            "method",
            f"{k} classes need {k * k + k:,} parameters and about "
            f"{matrix_memory_bytes(k) / 1e9:.1f} GB for the fit (most: {MAX_MATRIX_CLASSES} "
            "classes)",
            f"use {setting_name('method')} vector or ts",
            value=method,
        )
    if method == "vector":
        weights, bias, solution = _fit_vector(x, y, gradient_tol, max_iterations)
        bias = bias - bias.mean()  # softmax ignores a common shift of b: report the centred one
        fitted = LinearMap(method, tuple(weights.tolist()), tuple(bias.tolist()))
        nll_before = _vector_nll(x, y)
        lam_od = lam_b = 0.0
        used = "none"
        no_minimum = _no_minimum(x, y, weights, bias)
    else:
        lam_od = l2_off_diagonal
        lam_b = l2_bias if regulariser == "odir" else l2_off_diagonal
        penalty = penalty_weights(regulariser, k, lam_od, lam_b)
        problem = problem if problem is not None else _FullProblem(x, y)
        initial = _identity(k) if start is None else start
        solution = problem.solve(penalty, initial, gradient_tol, max_iterations, trace=trace)
        v = problem.to_map(solution.theta)
        fitted = LinearMap(method, tuple(map(tuple, v[:, :k].tolist())), tuple(v[:, k].tolist()))
        nll_before = _nll_of(x, y, _identity(k))
        used = regulariser
        no_minimum = _no_minimum(x, y, v[:, :k], v[:, k], penalty)
    return LinearFit(
        method=method,
        input=given,
        nll_before=nll_before,
        nll_after=solution.nll,
        objective_after=solution.value,
        l2_off_diagonal=lam_od,
        l2_bias=lam_b,
        n_parameters=2 * k if method == "vector" else k * k + k,
        iterations=solution.iterations,
        gradient_max=solution.gradient_max,
        gradient_tol=gradient_tol,
        max_iterations=max_iterations,
        converged=solution.gradient_max < gradient_tol,
        n_samples=n,
        calibrator=fitted,
        regulariser=used,
        no_minimum=no_minimum,
    )


def _vector_nll(x: torch.Tensor, y: torch.Tensor) -> float:
    logq = torch.log_softmax(x, dim=1)
    return -float(logq[torch.arange(x.shape[0]), y].sum()) / max(x.shape[0], 1)


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
    names: InputNames = INPUTS,
    seed: int = 0,
    grid: tuple[float, ...] = ODIR_GRID,
    folds: int = CV_FOLDS,
    method: str = "matrix",
    regulariser: str = "odir",
    patience: int | None = CV_PATIENCE,
) -> LinearFit:
    """A full map (``method`` ``matrix`` or ``dirichlet``) with its regulariser strength λ
    chosen by ``folds``-fold stratified cross-validation on (``scores``, ``labels``) (Kull et
    al. 2019): for every λ of ``grid`` fit on all folds but one and take the mean NLL of the
    held-out fold; the λ with the lowest mean (the larger λ on ties) is refitted on all
    samples. ``regulariser``: ``odir`` (λ_od = λ_b = λ) or ``l2``. A split with fewer than two
    samples of some class per fold falls back to the fixed strengths of :func:`fit_linear`.

    The strengths are tried from the largest down, and the walk stops once the mean held-out
    NLL has risen at ``patience`` strengths in a row (``None``: the whole grid);
    ``cv_strengths``/``cv_nll`` record the strengths tried. Each fold's fit starts where its
    fit at the previous strength ended (warm starts: the minimiser of each is unchanged,
    within the gradient tolerance); the data are whitened once, for all samples, and the
    folds are subsets of those rows (:meth:`_FullProblem.subset`); the final fit starts from
    the mean of the folds' maps at the chosen λ."""
    x = linear_inputs(scores, kind, names.scores, method)
    n, k = x.shape
    y = class_labels(labels, n, k, names.labels)
    counts = torch.bincount(y, minlength=k)
    present = counts[counts > 0]
    given = "logits" if kind == "logits" and method != "dirichlet" else "log-probabilities"

    def fit(rows: Any, strength: float | None, start: Any = None, problem: Any = None) -> LinearFit:
        return _fit_inputs(
            x[rows],
            y[rows],
            method,
            given,
            strengths=(strength, strength) if strength is not None else (L2_OFF_DIAGONAL, L2_BIAS),
            stopping=(GRADIENT_TOL, MAX_ITERATIONS),
            regulariser=regulariser,
            start=start,
            problem=problem,
            trace=None,
        )

    if len(present) < 2 or int(present.min()) < 2 * folds:
        return fit(slice(None), None)
    fold = torch.from_numpy(cv_folds(y, folds, seed))
    problem = _FullProblem(x, y)
    order = sorted(range(len(grid)), key=lambda i: -grid[i])
    held_out: dict[int, float] = {}
    starts: list[torch.Tensor] = [_identity(k)] * folds
    best, best_start = order[0], starts[0]
    for position, i in enumerate(order):
        penalty = penalty_weights(regulariser, k, grid[i], grid[i])
        total = 0.0
        for f in range(folds):
            train, test = problem.subset(fold != f), problem.subset(fold == f)
            solution = train.solve(penalty, starts[f], GRADIENT_TOL, MAX_ITERATIONS)
            total += test.nll(solution.theta) * test.n
            starts[f] = train.to_map(solution.theta)
        held_out[i] = total / n
        if position == 0 or held_out[i] < held_out[best]:  # ties keep the larger λ
            best, best_start = i, torch.stack(starts).mean(0)
        if patience is not None and _past_the_minimum(
            [held_out[j] for j in order[: position + 1]], patience
        ):
            break
    tried = sorted(held_out)
    chosen = fit(slice(None), grid[best], best_start, problem)
    return replace(
        chosen,
        cv_folds=folds,
        cv_strengths=tuple(grid[i] for i in tried),
        cv_nll=tuple(held_out[i] for i in tried),
    )


def _past_the_minimum(path: list[float], patience: int) -> bool:
    """Whether the held-out NLLs ``path`` (strengths from the largest down) rose at each of the
    last ``patience`` strengths (so the lowest so far lies before them)."""
    tail = path[-patience - 1 :]
    return len(tail) > patience and all(b > a for a, b in pairwise(tail))


def _newton_polish(objective: _Objective, theta: np.ndarray, gradient_tol: float) -> np.ndarray:
    """Newton steps θ − H⁻¹∇L, each solved by at most :data:`CG_ITERATIONS` conjugate-gradient
    iterations with exact Hessian-vector products; a step is kept only when it lowers
    ``measure``(∇L), the max |∂L/∂θ| in the map's own parameters (a test that, unlike a line
    search on L, is not lost in the rounding of L). Stops once that is under
    ``POLISH_FACTOR`` · ``gradient_tol``."""
    gradient = objective.value_and_gradient(theta)[1]
    current = objective.measure(gradient)
    for _ in range(NEWTON_STEPS):
        if current < POLISH_FACTOR * gradient_tol:
            break
        step = _cg_step(objective.hessian_at(theta), gradient, CG_RTOL)
        candidate = theta - step
        new_gradient = objective.value_and_gradient(candidate)[1]
        new = objective.measure(new_gradient)
        if not new < current:
            break
        theta, gradient, current = candidate, new_gradient, new
    return theta


def _check_map(method: Any, weights: tuple[Any, ...], bias: tuple[float, ...], source: str) -> None:
    if method not in LINEAR_METHODS:
        raise InputError(source, f"unknown method {method!r}", "vector, matrix or dirichlet")
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
