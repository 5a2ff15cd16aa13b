"""Spectral density of a symmetric operator by stochastic Lanczos quadrature (SLQ).

For each of R runs, a Rademacher vector v (normalised, ‖v‖ = 1) starts ``steps`` Lanczos steps
with full reorthogonalisation; the tridiagonal matrix T = S diag(θ) Sᵀ gives the Gauss
quadrature vᵀ f(A) v ≈ Σ_j w_j f(θ_j) with w_j = S_{1j}² (Golub & Meurant; Lin, Saad & Yang 2016;
Ghorbani et al. 2019). Averaged over runs, Σ_j w_j δ(t − θ_j) estimates the spectral density
(1/P) Σ_i δ(t − λ_i); it is smoothed with a Gaussian of width σ = ``bandwidth`` (default 1% of
the span of the Ritz values) and evaluated on ``n_grid`` points spanning the Ritz values ± 3σ.

The quadrature is exact for polynomials of degree ≤ 2·steps − 1: in particular
Σ_j w_j θ_j = vᵀAv, which the tests check.

For an operator whose vectors are each rank's slice (a model sharded over ranks,
:mod:`curvcal.curvature.vectors`), the start vector is drawn a parameter at a time (the same ±1
values as a whole draw), and α = qᵀAq, β = ‖w‖ and the basis' projections are summed over the
ranks: the tridiagonal matrix is the whole vectors' up to the order of summation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from curvcal.curvature.krylov import operator_basis
from curvcal.curvature.operators import LinearOperator, as_operator, product_into
from curvcal.curvature.progress import OnStep
from curvcal.curvature.results import DensityResult
from curvcal.curvature.vectors import space_of
from curvcal.errors import InputError
from curvcal.seeds import seeded_generator


def _tridiagonal_kept(
    op: LinearOperator, start: Tensor, steps: int
) -> tuple[list[float], list[float]]:
    """α and β of ``steps`` Lanczos steps from unit ``start`` with full reorthogonalisation
    (stops early on an invariant subspace): the basis is kept as
    :func:`~curvcal.curvature.eigen.lanczos` keeps it, float32 rows for float32 products
    computed in float64, and α is the coefficient the float64 clearing removes along q_m."""
    # at most steps + 1 rows: the start, steps − 1 commits and the row the last image goes to
    basis, buffer = operator_basis(op, max_rows=steps + 1)
    product = product_into(op)
    basis.append(start)
    alphas: list[float] = []
    betas: list[float] = []
    scale = 0.0

    for _ in range(steps):
        product(basis.latest(buffer), basis.next_row())  # A·q_m into the next row
        _image, coefficients = basis.clear_next()  # full reorthogonalisation, in place
        alphas.append(float(coefficients[-1]))
        scale = max(scale, abs(alphas[-1]))
        beta = basis.remainder_norm  # ‖image‖, measured as it was cleared
        if len(alphas) == steps or _invariant(beta, scale, op.dtype):
            break  # a quadrature on an invariant subspace is already exact for this v
        betas.append(beta)
        basis.commit(beta)
    return alphas, betas


def _tridiagonal_three_term(
    op: LinearOperator, start: Tensor, steps: int
) -> tuple[list[float], list[float]]:
    """α and β of ``steps`` Lanczos steps from unit ``start`` by the three-term recurrence alone,
    w = A q_m − β_{m−1} q_{m−1}, α_m = q_mᵀw, β_m q_{m+1} = w − α_m q_m, in float64 (Paige's
    ordering): three float64 vectors and one in the operator's dtype, whatever ``steps``.
    ``start`` (float64) becomes one of the three: it is overwritten."""
    space, wide = space_of(op), torch.float64
    n_params = space.size
    current = start.to(wide)
    previous = torch.zeros_like(current)
    work = torch.empty_like(current)
    tangent = None if op.dtype == wide else torch.empty(n_params, dtype=op.dtype, device=op.device)
    product = product_into(op)
    alphas: list[float] = []
    betas: list[float] = []
    scale = 0.0
    for _ in range(steps):
        product(current if tangent is None else tangent.copy_(current), work)
        if betas:
            work.sub_(previous, alpha=betas[-1])
        alphas.append(float(space.dot(current, work)))
        work.sub_(current, alpha=alphas[-1])
        scale = max(scale, abs(alphas[-1]))
        beta = float(space.norm(work))
        if len(alphas) == steps or _invariant(beta, scale, op.dtype):
            break
        betas.append(beta)
        previous, current, work = current, work.div_(beta), previous
    return alphas, betas


def _invariant(beta: float, scale: float, dtype: torch.dtype) -> bool:
    """Whether β is rounding-small against the largest |α| seen: an invariant subspace (100 ε of
    the products' dtype, at most 1e-4: bfloat16's 100 ε would stop a run at 0.78‖A‖)."""
    return beta <= min(100 * torch.finfo(dtype).eps, 1e-4) * max(scale, beta)


def spectral_density(
    operator: LinearOperator | Tensor,
    *,
    runs: int = 5,
    steps: int = 40,
    n_grid: int = 200,
    bandwidth: float | None = None,
    seed: int = 0,
    reorthogonalise: bool = True,
    on_step: OnStep = None,
) -> DensityResult:
    """SLQ density of the eigenvalues of A with ``runs`` start vectors and ``steps`` Lanczos steps
    each (capped at P). ``on_step`` receives the number of completed runs.

    ``reorthogonalise``: keep each run's basis (``steps`` vectors of P values) and make every
    new vector orthogonal to all of it; otherwise the three-term recurrence alone, in four
    vectors of P values. Without it the vectors lose orthogonality as Ritz values converge and
    converged values reappear as copies ("ghosts"), but the copies share the weight of the one
    they repeat: the quadrature of run r stays exact for polynomials of degree ≤ 2·steps − 1, to
    within rounding that grows slowly with the steps (Paige 1976; Greenbaum 1989; Knizhnerman
    1996). The smoothed density built from it is as close to the spectrum's while the steps are
    few against P; where many Ritz values have converged, their copies take nodes and a few
    more steps buy the same accuracy (``benchmarks/bench_density.py``)."""
    op = as_operator(operator)
    for name, value, minimum in (("runs", runs, 1), ("steps", steps, 1), ("n_grid", n_grid, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InputError(name, f"must be an integer ≥ {minimum}, got {value!r}")
    if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
        raise InputError("bandwidth", f"must be a finite number > 0, got {bandwidth!r}")
    if not isinstance(reorthogonalise, bool):
        raise InputError("reorthogonalise", f"must be True or False, got {reorthogonalise!r}")
    n_params = op.shape[0]
    steps = min(steps, n_params)
    generator = seeded_generator(seed)
    space = space_of(op)
    all_nodes: list[Tensor] = []
    all_weights: list[Tensor] = []
    matvecs = 0
    for run in range(runs):
        start = space.probes(1, "rademacher", generator)[:, 0] / math.sqrt(n_params)
        tridiagonal_of = _tridiagonal_kept if reorthogonalise else _tridiagonal_three_term
        alphas, betas = tridiagonal_of(op, start.to(device=op.device, dtype=torch.float64), steps)
        del start  # the three-term recurrence works in it
        matvecs += len(alphas)
        tridiagonal = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            tridiagonal = tridiagonal + torch.diag(off, 1) + torch.diag(off, -1)
        nodes, vectors = torch.linalg.eigh(tridiagonal)
        all_nodes.append(nodes)
        all_weights.append(vectors[0, :] ** 2)
        if on_step is not None:
            on_step(run + 1)
    nodes_flat = torch.cat(all_nodes)
    weights_flat = torch.cat(all_weights) / runs
    low, high = float(nodes_flat.min()), float(nodes_flat.max())
    span = high - low
    sigma = (
        bandwidth
        if bandwidth is not None
        else (0.01 * span if span > 0 else max(1e-3 * abs(high), 1e-6))
    )
    grid = torch.linspace(low - 3 * sigma, high + 3 * sigma, n_grid, dtype=torch.float64)
    kernel = torch.exp(-0.5 * ((grid[:, None] - nodes_flat[None, :]) / sigma) ** 2) / (
        sigma * math.sqrt(2 * math.pi)
    )
    density = kernel @ weights_flat
    return DensityResult(
        grid=tuple(float(x) for x in grid),
        density=tuple(float(x) for x in density),
        nodes=tuple(tuple(float(x) for x in n) for n in all_nodes),
        weights=tuple(tuple(float(x) for x in w) for w in all_weights),
        runs=runs,
        steps=steps,
        bandwidth=float(sigma),
        matvecs=matvecs,
        seed=seed,
        reorthogonalised=reorthogonalise,
    )
