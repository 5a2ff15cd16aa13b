"""Extreme eigenvalues of a symmetric operator: power iteration with deflation, and Lanczos.

Both accept any :class:`~curvcal.curvature.operators.LinearOperator` or a dense symmetric tensor.

Stopping rule (both methods): a value λ with unit vector v has converged when the relative
residual ‖Av − λv‖ / d ≤ tol **and** the relative change |λ_t − λ_{t−1}| / d ≤ tol, with
d = max(|λ|, √ε·‖A‖) — ε the machine epsilon of the operator's dtype and ‖A‖ estimated by the
largest |eigenvalue| seen — so that an exactly zero eigenvalue can converge. A value that does
not converge within ``max_iter`` is returned with ``converged=False`` and a
:class:`~curvcal.curvature.results.ConvergenceWarning`.

Orders: ``which="largest"`` returns λ1 ≥ λ2 ≥ … ≥ λk, the largest *algebraic* eigenvalues;
``which="smallest"`` returns the k smallest, smallest first.

* Power iteration (Golub & Van Loan §8.2.1) finds the eigenvalue largest in magnitude, at the rate
  |λ2/λ1|; further values come by deflation: iterating with (I − UUᵀ)A(I − UUᵀ), U the vectors
  already found, whose residual is the one reported for those values.
  When the dominant remaining value has the wrong sign for the end asked for (a negative one for
  ``largest``), it is the far end of the spectrum (λmin), σ; the search goes on with A − σI, whose
  dominant eigenvalues are the wanted end shifted by −σ, still orthogonally to the values already
  found. The spectrum reports σ and the unshifted values (``dominant``).
* Lanczos with full reorthogonalisation (Golub & Van Loan §10.1; Ghorbani et al. 2019) builds a
  Krylov basis one product per step and stops as soon as the k wanted Ritz pairs meet the rule
  above (estimated residual |β_j s_jk|), then verifies the residuals with one block product.
  Both ends of the spectrum come directly, without a shift.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from curvcal.curvature.operators import LinearOperator, as_operator
from curvcal.curvature.results import ConvergenceWarning, EigenResult, EigenSpectrum
from curvcal.errors import InputError
from curvcal.progress import OnStep

METHODS = ("power", "lanczos")
WHICH = ("largest", "smallest")
DEFAULT_TOL = 1e-4
DEFAULT_POWER_ITER = 1000
DEFAULT_LANCZOS_STEPS = 300


def _check_common(op: LinearOperator, k: int, tol: float, max_iter: int | None, which: str) -> None:
    n_params = op.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError("k", f"the number of eigenvalues must be a positive integer, got {k!r}")
    if k > n_params:
        raise InputError(
            "k",
            f"asked for {k} eigenvalues of a {n_params}×{n_params} operator",
            f"use k ≤ {n_params}",
        )
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol > 0):
        raise InputError("tol", f"the tolerance must be a finite number > 0, got {tol!r}")
    if max_iter is not None and (
        isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1
    ):
        raise InputError("max_iter", f"must be a positive integer, got {max_iter!r}")
    if which not in WHICH:
        raise InputError(
            "which", f"unknown end of the spectrum {which!r}", "choose 'largest' or 'smallest'"
        )


def _random_unit(op: LinearOperator, generator: torch.Generator) -> Tensor:
    """A Gaussian start vector drawn on the CPU (same vector on every device), normalised."""
    vector = torch.randn(op.shape[0], generator=generator, dtype=torch.float64)
    vector = vector.to(device=op.device, dtype=op.dtype)
    return vector / vector.norm()


def _relative(amount: float, value: float, scale: float, dtype: torch.dtype) -> float:
    """amount / max(|value|, √ε·scale); 0 for 0/0 and inf for x/0."""
    denominator = max(abs(value), math.sqrt(torch.finfo(dtype).eps) * scale)
    if denominator == 0.0:
        return 0.0 if amount == 0.0 else math.inf
    return amount / denominator


def _orthogonalise(vector: Tensor, basis: list[Tensor]) -> Tensor:
    """Remove the components along orthonormal ``basis`` (twice: classical Gram-Schmidt is unstable once)."""
    for _ in range(2):
        for b in basis:
            vector = vector - torch.dot(b, vector) * b
    return vector


def _power_one(
    op: LinearOperator,
    shift: float,
    found: list[Tensor],
    tol: float,
    max_iter: int,
    scale: float,
    generator: torch.Generator,
    on_step: OnStep,
) -> tuple[EigenResult, Tensor]:
    """Dominant eigenvalue of (I − UUᵀ)(A − σI)(I − UUᵀ), U the ``found`` vectors; returns λ + σ."""
    vector = _orthogonalise(_random_unit(op, generator), found)
    vector = vector / vector.norm()
    previous: float | None = None
    value, residual, change = 0.0, math.inf, math.inf
    iterations = 0
    for iterations in range(1, max_iter + 1):
        # the deflated operator's image: its residual is not floored by the found vectors' error
        image = _orthogonalise(op.matvec(vector) - shift * vector, found)
        rayleigh = float(torch.dot(vector, image))
        value = rayleigh + shift
        scale = max(scale, abs(value), abs(rayleigh))
        residual = _relative(float((image - rayleigh * vector).norm()), value, scale, op.dtype)
        change = (
            math.inf
            if previous is None
            else _relative(abs(value - previous), value, scale, op.dtype)
        )
        previous = value
        if on_step is not None:
            on_step(iterations)
        if residual <= tol and change <= tol:
            break
        norm = image.norm()
        if float(norm) > 0.0:
            vector = image / norm
    converged = residual <= tol and change <= tol
    return EigenResult(value, iterations, iterations, residual, change, converged), vector


def power_iteration(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues by power iteration with deflation.

    ``max_iter`` (default 1000) bounds the iterations spent on each value and on each pass.
    """
    op = as_operator(operator)
    _check_common(op, k, tol, max_iter, which)
    iterations = DEFAULT_POWER_ITER if max_iter is None else max_iter
    generator = torch.Generator().manual_seed(seed)
    found: list[Tensor] = []
    results: list[EigenResult] = []
    passes: list[EigenResult] = []  # every unshifted result, for the record
    scale = 0.0
    used = 0
    shift: float | None = None
    while len(results) < k:
        result, vector = _power_one(
            op, 0.0 if shift is None else shift, found, tol, iterations, scale, generator, on_step
        )
        scale = max(scale, abs(result.value))
        used += result.matvecs
        wrong_sign = result.value < 0 if which == "largest" else result.value > 0
        if shift is None:
            passes.append(result)
            if wrong_sign:
                # The dominant remaining value is the far end (λmin for "largest"): A − σI has the
                # wanted end as its dominant eigenvalue; the values found so far stay valid.
                shift = result.value
                continue
        found.append(vector)
        results.append(result)
    final = sorted(results, key=lambda r: r.value, reverse=which == "largest")
    spectrum = EigenSpectrum(
        values=tuple(final),
        method="power",
        which=which,
        tol=float(tol),
        matvecs=used,
        converged=all(r.converged for r in final),
        shift=shift,
        dominant=tuple(passes) if shift is not None else None,
    )
    _warn_unconverged(
        spectrum,
        f"stopped at the iteration limit max_iter={iterations}; raise max_iter or loosen tol",
    )
    return spectrum


def lanczos(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues by Lanczos with full reorthogonalisation.

    Runs until the k wanted Ritz values meet the stopping rule, the Krylov basis spans the whole
    space (then the values are exact and ``relative_change`` is 0), or ``max_iter`` steps
    (default min(P, 300)) are spent. An invariant subspace found early restarts the basis with a
    fresh random vector orthogonal to it, so repeated eigenvalues are found with their
    multiplicity. Every value reports the run's steps and products.
    """
    op = as_operator(operator)
    _check_common(op, k, tol, max_iter, which)
    n_params = op.shape[0]
    steps_allowed = min(n_params, DEFAULT_LANCZOS_STEPS if max_iter is None else max(max_iter, k))
    generator = torch.Generator().manual_seed(seed)
    eps = torch.finfo(op.dtype).eps
    basis: list[Tensor] = [_random_unit(op, generator)]
    alphas: list[float] = []
    betas: list[float] = []  # betas[j] couples basis[j] and basis[j + 1]
    scale = 0.0
    previous: list[float] | None = None
    wanted_values: list[float] = []
    changes: list[float] = [math.inf] * k
    exact = False
    estimate_met = False
    steps = 0
    while steps < steps_allowed:
        current = basis[-1]
        image = op.matvec(current)
        steps += 1
        alpha = float(torch.dot(current, image))
        alphas.append(alpha)
        image = image - alpha * current
        if betas:
            image = image - betas[-1] * basis[-2]
        image = _orthogonalise(image, basis)
        beta = float(image.norm())
        ritz, ritz_vectors = _ritz(alphas, betas)
        scale = max(scale, float(ritz.abs().max()))
        if on_step is not None:
            on_step(steps)
        if steps >= k:
            wanted = _wanted(len(alphas), k, which)
            wanted_values = [float(ritz[i]) for i in wanted]
            estimates = [
                _relative(abs(beta * float(ritz_vectors[-1, i])), float(ritz[i]), scale, op.dtype)
                for i in wanted
            ]
            if previous is not None:
                changes = [
                    _relative(abs(v - p), v, scale, op.dtype)
                    for v, p in zip(wanted_values, previous, strict=True)
                ]
            previous = wanted_values
            if all(e <= tol for e in estimates) and all(c <= tol for c in changes):
                estimate_met = True
                break
        if steps == n_params:
            exact = True
            break
        if beta <= 100 * eps * scale:  # invariant subspace: restart orthogonally to it
            fresh = _orthogonalise(_random_unit(op, generator), basis)
            beta = 0.0
            image = fresh
            if float(fresh.norm()) == 0.0:
                exact = True
                break
            image = fresh / fresh.norm()
        else:
            image = image / beta
        betas.append(beta)
        basis.append(image)
    if exact:
        changes = [0.0] * k
    wanted = _wanted(len(alphas), k, which)
    ritz, ritz_vectors = _ritz(alphas, betas)
    basis_matrix = torch.stack(basis[: len(alphas)], dim=1)
    vectors = basis_matrix @ ritz_vectors[:, wanted].to(device=op.device, dtype=op.dtype)
    images = op.matmat(vectors)
    used = steps + k
    results = []
    for column, index in enumerate(wanted):
        value = float(ritz[index])
        residual = _relative(
            float((images[:, column] - value * vectors[:, column]).norm()), value, scale, op.dtype
        )
        change = changes[column]
        results.append(
            EigenResult(value, steps, used, residual, change, residual <= tol and change <= tol)
        )
    spectrum = EigenSpectrum(
        values=tuple(results),
        method="lanczos",
        which=which,
        tol=float(tol),
        matvecs=used,
        converged=all(r.converged for r in results),
    )
    if estimate_met:
        limit = (
            f"the Lanczos residual estimate met tol but the measured residual did not "
            f"({op.dtype} round-off); loosen tol or use float64"
        )
    else:
        limit = f"stopped at the step limit max_iter={steps_allowed}; raise max_iter or loosen tol"
    _warn_unconverged(spectrum, limit)
    return spectrum


def _ritz(alphas: list[float], betas: list[float]) -> tuple[Tensor, Tensor]:
    """Eigenvalues (ascending) and eigenvectors of the Lanczos tridiagonal matrix, in float64."""
    size = len(alphas)
    tridiagonal = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if size > 1:
        off = torch.tensor(betas[: size - 1], dtype=torch.float64)
        tridiagonal = tridiagonal + torch.diag(off, 1) + torch.diag(off, -1)
    values, vectors = torch.linalg.eigh(tridiagonal)
    return values, vectors


def _wanted(size: int, k: int, which: str) -> list[int]:
    """Indices of the k wanted Ritz values among ``size`` ascending ones, in report order."""
    return list(range(size - 1, size - 1 - k, -1)) if which == "largest" else list(range(k))


def _warn_unconverged(spectrum: EigenSpectrum, limit: str) -> None:
    """Warn when an eigenvalue missed tol, naming ``limit``: what stopped the run and what to
    change."""
    if not spectrum.converged:
        worst = max(r.residual for r in spectrum.values)
        warnings.warn(
            ConvergenceWarning(
                f"{spectrum.method}: eigenvalues did not meet tol={spectrum.tol:g} "
                f"(worst relative residual {worst:.3g}): {limit}"
            ),
            stacklevel=3,
        )


def eigenvalues(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    method: str | None = None,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues of a symmetric operator.

    ``method``: ``"lanczos"`` (the default for every k) or ``"power"``. Lanczos with full
    reorthogonalisation spends one product per step, as power iteration does, and its Krylov
    space contains every power iterate, so it never needs more products; power iteration
    converges at the rate |λ₂/λ₁| and stalls on indefinite Hessians whose most negative
    eigenvalue is close to λmax in magnitude (common in trained networks).
    ``seed`` seeds the CPU generator of the start vectors.
    """
    if method is None:
        method = "lanczos"
    if method not in METHODS:
        raise InputError(
            "method", f"unknown eigenvalue method {method!r}", "choose 'power' or 'lanczos'"
        )
    solve = power_iteration if method == "power" else lanczos
    return solve(operator, k, which=which, tol=tol, max_iter=max_iter, seed=seed, on_step=on_step)
