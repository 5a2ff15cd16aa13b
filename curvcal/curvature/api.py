"""Convenience functions: build a :class:`HessianOperator` and run one algorithm on it.

Each takes the model and the data (see :class:`~curvcal.curvature.hvp.HessianOperator` for
``criterion``, ``gamma``, ``params``, ``engine``, ``mode``, ``cache``, ``device``,
``probe_batch`` and ``all_reduce``) and returns the algorithm's result with ``engine`` set to
the Hessian-vector-product engine that ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn

from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import DEFAULT_TOL, eigenvalues
from curvcal.curvature.hvp import AllReduce, BatchSource, HessianOperator
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.results import DensityResult, EigenSpectrum, LayerCurvature, TraceResult
from curvcal.curvature.trace import trace_estimate

OnStep = Callable[[int], None] | None


def hessian_eigenvalues(
    model: nn.Module,
    batches: BatchSource,
    k: int = 1,
    *,
    method: str | None = None,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    seed: int = 0,
    criterion: str = "ce",
    gamma: float = 0.0,
    params: Sequence[str] | None = None,
    engine: str = "auto",
    mode: str = "eval",
    cache: str = "auto",
    device: torch.device | str | None = None,
    probe_batch: int = 8,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
) -> EigenSpectrum:
    """The k largest (``which="smallest"``: smallest) algebraic eigenvalues of the Hessian of
    the mean loss over ``batches``; Lanczos by default (``method="power"`` for power iteration).

    >>> import torch; from torch import nn; import curvcal
    >>> model = nn.Linear(4, 3).double()
    >>> x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    >>> spectrum = curvcal.hessian_eigenvalues(model, [(x[:7], y[:7]), (x[7:], y[7:])], k=2)
    >>> spectrum.values[0].converged
    True
    """
    operator = HessianOperator(
        model,
        batches,
        criterion,
        gamma,
        params,
        engine,
        mode,
        cache,
        device,
        probe_batch,
        all_reduce,
    )
    spectrum = eigenvalues(
        operator,
        k,
        method=method,
        which=which,
        tol=tol,
        max_iter=max_iter,
        seed=seed,
        on_step=on_step,
    )
    return dataclasses.replace(spectrum, engine=operator.engine)


def hessian_trace(
    model: nn.Module,
    batches: BatchSource,
    n_probes: int = 100,
    *,
    method: str = "hutch++",
    rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    distribution: str = "rademacher",
    seed: int = 0,
    criterion: str = "ce",
    gamma: float = 0.0,
    params: Sequence[str] | None = None,
    engine: str = "auto",
    mode: str = "eval",
    cache: str = "auto",
    device: torch.device | str | None = None,
    probe_batch: int = 8,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
) -> TraceResult:
    """tr(H) by Hutch++ (the default) or XTrace with ``n_probes`` products, or Hutchinson (fixed
    ``n_probes``, or adaptive with ``rtol``), with standard error and 95% interval."""
    operator = HessianOperator(
        model,
        batches,
        criterion,
        gamma,
        params,
        engine,
        mode,
        cache,
        device,
        probe_batch,
        all_reduce,
    )
    result = trace_estimate(
        operator,
        n_probes,
        method=method,
        rtol=rtol,
        max_probes=max_probes,
        min_probes=min_probes,
        distribution=distribution,
        seed=seed,
        probe_batch=probe_batch,
        on_step=on_step,
    )
    return dataclasses.replace(result, engine=operator.engine)


def hessian_density(
    model: nn.Module,
    batches: BatchSource,
    *,
    runs: int = 5,
    steps: int = 40,
    n_grid: int = 200,
    bandwidth: float | None = None,
    seed: int = 0,
    criterion: str = "ce",
    gamma: float = 0.0,
    params: Sequence[str] | None = None,
    engine: str = "auto",
    mode: str = "eval",
    cache: str = "auto",
    device: torch.device | str | None = None,
    probe_batch: int = 8,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
) -> DensityResult:
    """The Hessian's eigenvalue density by stochastic Lanczos quadrature."""
    operator = HessianOperator(
        model,
        batches,
        criterion,
        gamma,
        params,
        engine,
        mode,
        cache,
        device,
        probe_batch,
        all_reduce,
    )
    result = spectral_density(
        operator,
        runs=runs,
        steps=steps,
        n_grid=n_grid,
        bandwidth=bandwidth,
        seed=seed,
        on_step=on_step,
    )
    return dataclasses.replace(result, engine=operator.engine)


def hessian_layers(
    model: nn.Module,
    batches: BatchSource,
    *,
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    n_probes: int = 100,
    distribution: str = "rademacher",
    seed: int = 0,
    criterion: str = "ce",
    gamma: float = 0.0,
    params: Sequence[str] | None = None,
    engine: str = "auto",
    mode: str = "eval",
    cache: str = "auto",
    device: torch.device | str | None = None,
    probe_batch: int = 8,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
) -> list[LayerCurvature]:
    """λmax and trace of each module's diagonal Hessian block (see :mod:`curvcal.curvature.layers`)."""
    operator = HessianOperator(
        model,
        batches,
        criterion,
        gamma,
        params,
        engine,
        mode,
        cache,
        device,
        probe_batch,
        all_reduce,
    )
    return layer_curvature(
        operator,
        tol=tol,
        max_iter=max_iter,
        n_probes=n_probes,
        distribution=distribution,
        seed=seed,
        on_step=on_step,
    )
