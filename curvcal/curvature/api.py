"""Convenience functions: build the Hessian operator and run one algorithm on it.

Each takes the model and the data, the loss (``loss``: a loss object of :mod:`curvcal.losses`,
or the keywords ``criterion`` and ``gamma``) and how the operator runs (``options``: an
:class:`~curvcal.curvature.operator.OperatorOptions`, or its fields ``params``, ``engine``,
``mode``, ``cache``, ``device``, ``probe_batch``, ``allow_tf32`` as keywords), plus
``all_reduce`` for sharded data. The operator comes from
:func:`~curvcal.curvature.operator.build_operator` (NaN/Inf reported with the batches at
fault), and each function returns the algorithm's result with ``engine`` set to the
Hessian-vector-product engine that ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from curvcal.curvature.batches import AllReduce, BatchSource
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import DEFAULT_TOL, eigenvalues
from curvcal.curvature.guard import NaNGuard
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.memory import (
    density_keeps_basis,
    free_memory,
    lanczos_basis,
    sketch_limit,
)
from curvcal.curvature.operator import OperatorOptions, build_operator
from curvcal.curvature.residual import METHODS as SPLIT_METHODS
from curvcal.curvature.residual import estimator_of, split_trace
from curvcal.curvature.results import DensityResult, EigenSpectrum, LayerCurvature, TraceResult
from curvcal.curvature.trace import METHODS as TRACE_METHODS
from curvcal.curvature.trace import trace_estimate
from curvcal.errors import InputError
from curvcal.losses import Loss, loss_from_name
from curvcal.progress import OnStep

_OPTION_FIELDS = frozenset(field.name for field in dataclasses.fields(OperatorOptions))


def _operator(
    function: str,
    model: nn.Module,
    batches: BatchSource,
    loss: Loss | None,
    options: OperatorOptions | None,
    all_reduce: AllReduce | None,
    keywords: dict[str, Any],
) -> NaNGuard:
    """The operator of an API call: ``loss`` or ``criterion``/``gamma``, and ``options`` or
    its fields as ``keywords`` (one or the other, never both)."""
    unknown = sorted(set(keywords) - _OPTION_FIELDS - {"criterion", "gamma"})
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    loss_keywords = {k: keywords[k] for k in ("criterion", "gamma") if k in keywords}
    option_keywords = {k: v for k, v in keywords.items() if k in _OPTION_FIELDS}
    if loss is None:
        loss = loss_from_name(loss_keywords.get("criterion", "ce"), loss_keywords.get("gamma", 0.0))
    elif loss_keywords:
        raise InputError("loss", "give either a loss object or criterion/gamma, not both")
    if options is None:
        if option_keywords.get("params") is not None:
            option_keywords["params"] = tuple(
                [option_keywords["params"]]
                if isinstance(option_keywords["params"], str)
                else option_keywords["params"]
            )
        options = OperatorOptions(**option_keywords)
    elif option_keywords:
        shown = ", ".join(sorted(option_keywords))
        raise InputError("options", f"give either an OperatorOptions or {shown}, not both")
    return build_operator(model, loss, batches, options, all_reduce=all_reduce)


def hessian_eigenvalues(
    model: nn.Module,
    batches: BatchSource,
    k: int = 1,
    *,
    method: str | None = None,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    max_basis: int | None = None,
    seed: int = 0,
    loss: Loss | None = None,
    options: OperatorOptions | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> EigenSpectrum:
    """The k largest (``which="smallest"``: smallest) algebraic eigenvalues of the Hessian of
    the mean loss over ``batches``; Lanczos by default (``method="power"`` for power iteration).
    ``max_basis``: the most vectors Lanczos' basis holds before it restarts (default: what the
    operator's memory budget holds, :func:`~curvcal.curvature.memory.lanczos_basis`, as in
    ``curvcal hessian``).

    >>> import torch; from torch import nn; import curvcal
    >>> model = nn.Linear(4, 3).double()
    >>> x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    >>> spectrum = curvcal.hessian_eigenvalues(model, [(x[:7], y[:7]), (x[7:], y[7:])], k=2)
    >>> spectrum.values[0].converged
    True
    """
    operator = _operator(
        "hessian_eigenvalues", model, batches, loss, options, all_reduce, operator_keywords
    )
    spectrum = eigenvalues(
        operator,
        k,
        method=method,
        which=which,
        tol=tol,
        max_iter=max_iter,
        max_basis=lanczos_basis(k, operator.shape[0], operator.budget, max_basis),
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
    loss: Loss | None = None,
    options: OperatorOptions | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> TraceResult:
    """tr(H) by Hutch++ (the default) or XTrace with ``n_probes`` products, or Hutchinson (fixed
    ``n_probes``, or adaptive with ``rtol``), with standard error and 95% interval; or by
    ``"gauss-newton+hutch++"`` / ``"gauss-newton+xtrace"``: the Gauss–Newton part exactly and
    the rest by that estimator, within ``n_probes`` products
    (:func:`~curvcal.curvature.residual.split_trace`). A Hutch++ sketch is bounded by the
    operator's memory budget as ``curvcal hessian`` bounds it
    (:func:`~curvcal.curvature.memory.sketch_limit`)."""
    if method not in (*TRACE_METHODS, *SPLIT_METHODS):
        raise InputError(
            "method",
            f"unknown trace method {method!r}",
            f"choose one of {', '.join((*TRACE_METHODS, *SPLIT_METHODS))}",
        )
    operator = _operator(
        "hessian_trace", model, batches, loss, options, all_reduce, operator_keywords
    )
    max_sketch = sketch_limit(
        estimator_of(method),
        operator.shape[0],
        operator.dtype,
        operator.budget,
        free_memory(operator.device),
    )
    if method in SPLIT_METHODS:
        if rtol is not None:
            raise InputError(
                "rtol",
                f"the adaptive stop is only available with method 'hutchinson', not {method!r}",
            )
        return split_trace(
            operator,
            method,
            n_probes,
            distribution=distribution,
            seed=seed,
            probe_batch=operator.probe_batch,
            max_sketch=max_sketch,
            on_step=on_step,
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
        probe_batch=operator.probe_batch,
        max_sketch=max_sketch,
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
    max_basis: int | None = None,
    loss: Loss | None = None,
    options: OperatorOptions | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> DensityResult:
    """The Hessian's eigenvalue density by stochastic Lanczos quadrature. Each run keeps its
    Lanczos basis (full reorthogonalisation) when ``max_basis`` vectors, or else the memory
    budget, hold ``steps`` of them; otherwise it runs the three-term recurrence alone
    (:func:`~curvcal.curvature.memory.density_keeps_basis`; ``result.reorthogonalised``)."""
    if max_basis is not None and (
        isinstance(max_basis, bool) or not isinstance(max_basis, int) or max_basis < 1
    ):
        raise InputError("max_basis", f"must be a positive integer, got {max_basis!r}")
    operator = _operator(
        "hessian_density", model, batches, loss, options, all_reduce, operator_keywords
    )
    result = spectral_density(
        operator,
        runs=runs,
        steps=steps,
        n_grid=n_grid,
        bandwidth=bandwidth,
        seed=seed,
        reorthogonalise=density_keeps_basis(
            steps, operator.shape[0], operator.budget, max_basis, operator.dtype
        ),
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
    loss: Loss | None = None,
    options: OperatorOptions | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> list[LayerCurvature]:
    """λmax and trace of each module's diagonal Hessian block (see :mod:`curvcal.curvature.layers`)."""
    operator = _operator(
        "hessian_layers", model, batches, loss, options, all_reduce, operator_keywords
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
