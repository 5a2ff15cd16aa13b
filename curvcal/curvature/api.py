"""The Python API: the Hessian of a model's mean loss over a dataset, and one algorithm on it.

Each function takes either a model and its data, or an operator already built by
:func:`hessian_operator` (so that λmax, the trace and the density of one model share one
operator, its cached batches and its counts)::

    H = curvcal.hessian_operator(model, loader)
    lambda_max = curvcal.hessian_eigenvalues(H).eigenvalues[0]
    trace = curvcal.hessian_trace(H).estimate

The data: a DataLoader, any re-iterable of ``(x, y)`` batches, a function returning a fresh
iterator of them, or one ``(x, y)`` pair of tensors. The loss (``loss``): a name (``"ce"``,
default; ``"focal"`` with ``gamma``; ``"flsd53"``), a loss object of :mod:`curvcal.losses`, a
torch loss module or a callable ``loss(logits, labels) -> scalar``
(:func:`~curvcal.losses.as_loss`). The Hessian is always that of the mean over the dataset of
the per-sample loss, L(θ) = (1/N) Σ_i ℓ(f_θ(x_i), y_i): a module or callable is called once per
batch and its value taken as the batch's mean (weighted by batch size / N) unless it declares
``reduction="sum"`` (taken as the batch's sum, divided by N); ``reduction="none"`` is refused.
How the operator runs (``settings``: a :class:`~curvcal.settings.hessian.HessianSettings`, of
which the operator reads the fields marked ``operator``; those fields as keywords on top:
``params``, ``hvp``, ``mode``, ``cache``, ``probe_batch``, ``memory_budget``, ``keep_graphs``,
``curvature``), plus ``device``, ``allow_tf32``, and ``all_reduce`` for sharded data. The former
names ``engine`` (``hvp``) and ``options`` (``settings``) are taken with a
:class:`DeprecationWarning`. The operator comes from :func:`~curvcal.curvature.central_difference.build_operator` (NaN/Inf
reported with the batches at fault), and each function returns the algorithm's result with
``engine`` set to the Hessian-vector-product engine that ran. :func:`scipy_operator
<curvcal.curvature.linear_operator.scipy_operator>` hands the operator to scipy.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from torch import Tensor, nn

from curvcal import rows
from curvcal.curvature.analysis import analyse_batches, analyse_operator
from curvcal.curvature.batches import AllReduce
from curvcal.curvature.central_difference import build_operator
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import DEFAULT_TOL, check_k, eigenvalues
from curvcal.curvature.gauss_newton import gauss_newton_trace
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.memory import (
    density_keeps_basis,
    free_memory,
    lanczos_basis,
    sketch_limit,
)
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.options import OPERATOR_FIELDS
from curvcal.curvature.plan import choose_trace_method
from curvcal.curvature.progress import OnStageStep, OnStep
from curvcal.curvature.residual import METHODS as SPLIT_METHODS
from curvcal.curvature.residual import MIN_PRODUCTS, estimator_of, split_trace
from curvcal.curvature.results import (
    DensityResult,
    EigenSpectrum,
    HessianAnalysis,
    LayerCurvature,
    TraceMethodWarning,
    TraceResult,
)
from curvcal.curvature.trace import trace_estimate
from curvcal.errors import InputError, SettingsError
from curvcal.losses import as_loss
from curvcal.settings.fields import former_keywords, renamed
from curvcal.settings.hessian import TRACE_METHODS, HessianSettings, trace_method_now

#: keywords of the API functions that describe the operator besides the settings fields
_OPERATOR_KEYWORDS = frozenset({"device", "allow_tf32", "engine", "criterion"})

#: what the functions take as their first argument: a model, or an operator built before
ModelOrOperator = nn.Module | HessianOperator


def hessian_operator(
    model: nn.Module,
    data: Any,
    loss: Any = None,
    *,
    gamma: float | None = None,
    settings: HessianSettings | None = None,
    all_reduce: AllReduce | None = None,
    **operator_keywords: Any,
) -> HessianOperator:
    """The Hessian of the mean ``loss`` of ``model`` over ``data`` as an operator of shape
    (P, P) with ``matvec``, ``matmat`` and ``@``, to hand to every function of this module (one
    operator, its batches counted and cached once) or to scipy
    (:func:`~curvcal.curvature.linear_operator.scipy_operator`).

    ``data``, ``loss`` (default ``"ce"``), ``gamma``, ``settings`` and the operator keywords as
    the module's docstring says. The caller's model is never altered.

    >>> import torch; from torch import nn; import curvcal
    >>> model = nn.Linear(4, 3).double()
    >>> x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    >>> H = curvcal.hessian_operator(model, (x, y), loss=nn.CrossEntropyLoss())
    >>> H.shape
    (15, 15)
    """
    return _operator(
        "hessian_operator", model, data, loss, gamma, settings, all_reduce, operator_keywords
    )


def _operator(
    function: str,
    model: ModelOrOperator,
    data: Any,
    loss: Any,
    gamma: float | None,
    settings: HessianSettings | None,
    all_reduce: AllReduce | None,
    keywords: dict[str, Any],
) -> HessianOperator:
    """The operator of an API call: ``model`` itself when it is an operator (then nothing else
    may describe one), else one built from ``model``, ``data``, the loss, ``settings`` and the
    operator fields given as ``keywords`` on top (with ``device`` and ``allow_tf32``)."""
    keywords = dict(keywords)
    if "options" in keywords:  # the former name of ``settings``
        warnings.warn(
            f"{function}: 'options' is now called 'settings' (a HessianSettings)",
            DeprecationWarning,
            stacklevel=3,
        )
        if settings is not None:
            raise InputError("settings", "given twice, as 'settings' and as 'options'")
        settings = keywords.pop("options")
    unknown = sorted(set(keywords) - set(OPERATOR_FIELDS) - _OPERATOR_KEYWORDS)
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(model, HessianOperator):
        given = [
            name
            for name, value in (
                ("data", data),
                ("loss", loss),
                ("gamma", gamma),
                ("settings", settings),
                ("all_reduce", all_reduce),
            )
            if value is not None
        ]
        if given or keywords:
            raise InputError(
                (given or sorted(keywords))[0],
                "the operator already holds its data, loss and settings",
                "pass the operator alone, or the model and its data",
            )
        return model
    if data is None:
        raise InputError(
            "data", f"{function}() needs the data the loss is averaged over, besides the model"
        )
    return build_operator(  # a model sharded with fully_shard gets central differences
        model,
        as_loss("ce" if loss is None else loss, gamma),
        rows.as_batches(data),
        settings,
        all_reduce=all_reduce,
        **keywords,
    )


def hessian_eigenvalues(
    model: ModelOrOperator,
    data: Any = None,
    k: int = 1,
    *,
    method: str | None = None,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    max_basis: int | None = None,
    seed: int = 0,
    loss: Any = None,
    gamma: float | None = None,
    settings: HessianSettings | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    start: Tensor | None = None,
    **operator_keywords: Any,
) -> EigenSpectrum:
    """The k largest (``which="smallest"``: smallest) algebraic eigenvalues of the Hessian of
    the mean loss of ``model`` over ``data`` (or of the operator ``model``); Lanczos by default
    (``method="power"`` for power iteration). ``max_basis``: the most vectors Lanczos' basis
    holds before it restarts (default: what the operator's memory budget holds,
    :func:`~curvcal.curvature.memory.lanczos_basis`, as in ``curvcal hessian``). ``start``:
    Lanczos' first vector instead of a random one (a warm start,
    :func:`~curvcal.curvature.warm_start.warm_start`).

    >>> import torch; from torch import nn; import curvcal
    >>> model = nn.Linear(4, 3).double()
    >>> x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    >>> spectrum = curvcal.hessian_eigenvalues(model, [(x[:7], y[:7]), (x[7:], y[7:])], k=2)
    >>> spectrum.values[0].converged
    True
    """
    operator = _operator(
        "hessian_eigenvalues", model, data, loss, gamma, settings, all_reduce, operator_keywords
    )
    check_k(k, operator.shape[0])  # before the basis is sized from it
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
        start=start,
    )
    return dataclasses.replace(spectrum, engine=operator.engine)


def _trace_method(method: str) -> str:
    """A trace method as the settings spell it (``trace_method``); the former spellings
    (``hutch++``, ``gauss-newton+hutch++``) are read as today's with a
    :class:`~curvcal.errors.FormerSpellingWarning`."""
    name = trace_method_now(method, "trace_method", stacklevel=5)
    if name not in TRACE_METHODS:
        raise SettingsError(
            "trace_method",
            f"unknown trace method {method!r}",
            f"choose one of {', '.join(TRACE_METHODS)}",
        )
    return str(name)


#: :func:`hessian_trace`'s and :func:`hessian_layers`' former argument names -> today's (the
#: settings fields')
_FORMER_TRACE_ARGUMENTS = {
    "n_probes": "probes",
    "method": "trace_method",
    "rtol": "trace_rtol",
    "distribution": "probe_dist",
}


@former_keywords(**_FORMER_TRACE_ARGUMENTS)
def hessian_trace(
    model: ModelOrOperator,
    data: Any = None,
    probes: int = 100,
    *,
    trace_method: str = "auto",
    trace_rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    probe_dist: str = "rademacher",
    seed: int = 0,
    loss: Any = None,
    gamma: float | None = None,
    settings: HessianSettings | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> TraceResult:
    """tr(H) of the Hessian of the mean loss of ``model`` over ``data`` (or of the operator
    ``model``), by any ``trace_method`` of ``curvcal hessian`` within ``probes`` products:

    - ``"auto"`` (default): chosen by :func:`~curvcal.curvature.plan.choose_trace_method`,
      as the command chooses: ``"gauss-newton"`` where it is exact, else
      ``"gauss-newton+hutchpp"`` where that can run, else ``"hutchpp"``; when it falls back to
      Hutch++ alone (a loss whose Hessian in the logits is not known in closed form, such as a
      user's module or callable; train mode; too few products) a
      :class:`~curvcal.curvature.results.TraceMethodWarning` says why;
    - ``"gauss-newton"``: the exact trace of the Gauss–Newton part, refused (naming why) unless
      the logits are linear in each parameter tensor and the loss is ce, focal or FLSD-53;
    - ``"gauss-newton+hutchpp"`` / ``"gauss-newton+xtrace"``: that part exactly and the rest by
      the estimator (:func:`~curvcal.curvature.residual.split_trace`);
    - ``"hutchpp"``, ``"xtrace"`` (``probes`` products), or ``"hutchinson"`` (fixed
      ``probes``, or adaptive with ``trace_rtol`` up to ``max_probes``, at least
      ``min_probes``), each with its standard error and 95% interval; probes drawn from
      ``probe_dist``.

    The arguments are named as the settings and the command line name them (``probes`` is
    ``--probes``); the former names ``n_probes``, ``method``, ``rtol`` and ``distribution`` are
    taken with a :class:`DeprecationWarning`, the former spellings of the methods
    (``"hutch++"``, ``"gauss-newton+hutch++"``) with a
    :class:`~curvcal.errors.FormerSpellingWarning`. A Hutch++ sketch is bounded by
    the operator's memory budget as ``curvcal hessian`` bounds it
    (:func:`~curvcal.curvature.memory.sketch_limit`)."""
    name = _trace_method(trace_method)
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise SettingsError("probes", f"must be a positive integer, got {probes!r}")
    if trace_rtol is not None and name != "hutchinson":
        raise SettingsError(
            "trace_rtol",
            f"the adaptive stop is only available with trace_method 'hutchinson', not "
            f"{trace_method!r}",
            "add trace_method='hutchinson'",
        )
    operator = _operator(
        "hessian_trace", model, data, loss, gamma, settings, all_reduce, operator_keywords
    )
    if name == "auto" or name.startswith("gauss-newton"):
        if probes < MIN_PRODUCTS:
            raise SettingsError(
                "probes",
                f"trace_method {trace_method!r} needs at least {MIN_PRODUCTS} products, got "
                f"{probes}",
            )
        name, why = choose_trace_method(operator, HessianSettings(trace_method=name, probes=probes))
        if trace_method == "auto" and name == "hutchpp":
            warnings.warn(
                f"trace method auto fell back to hutchpp: {why}", TraceMethodWarning, stacklevel=2
            )
    if name == "gauss-newton":  # shown exact by choose_trace_method
        return gauss_newton_trace(operator, on_step=on_step, checked=True)
    max_sketch = sketch_limit(
        estimator_of(name),
        operator.shape[0],
        operator.dtype,
        operator.budget,
        free_memory(operator.device),
    )
    if name in SPLIT_METHODS:
        return split_trace(
            operator,
            name,
            probes,
            probe_dist=probe_dist,
            seed=seed,
            probe_batch=operator.probe_batch,
            max_sketch=max_sketch,
            on_step=on_step,
        )
    result = trace_estimate(
        operator,
        probes,
        trace_method=name,
        trace_rtol=trace_rtol,
        max_probes=max_probes,
        min_probes=min_probes,
        probe_dist=probe_dist,
        seed=seed,
        probe_batch=operator.probe_batch,
        max_sketch=max_sketch,
        on_step=on_step,
    )
    return dataclasses.replace(result, engine=operator.engine)


def hessian_density(
    model: ModelOrOperator,
    data: Any = None,
    *,
    runs: int = 5,
    steps: int = 40,
    n_grid: int = 200,
    bandwidth: float | None = None,
    seed: int = 0,
    max_basis: int | None = None,
    loss: Any = None,
    gamma: float | None = None,
    settings: HessianSettings | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> DensityResult:
    """The eigenvalue density of the Hessian of the mean loss of ``model`` over ``data`` (or of
    the operator ``model``) by stochastic Lanczos quadrature. Each run keeps its Lanczos basis
    (full reorthogonalisation) when ``max_basis`` vectors, or else the memory budget, hold
    ``steps`` of them; otherwise it runs the three-term recurrence alone
    (:func:`~curvcal.curvature.memory.density_keeps_basis`; ``result.reorthogonalised``)."""
    if max_basis is not None and (
        isinstance(max_basis, bool) or not isinstance(max_basis, int) or max_basis < 1
    ):
        raise InputError("max_basis", f"must be a positive integer, got {max_basis!r}")
    operator = _operator(
        "hessian_density", model, data, loss, gamma, settings, all_reduce, operator_keywords
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


@former_keywords(n_probes="probes", distribution="probe_dist")
def hessian_layers(
    model: ModelOrOperator,
    data: Any = None,
    *,
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    probes: int = 100,
    probe_dist: str = "rademacher",
    seed: int = 0,
    loss: Any = None,
    gamma: float | None = None,
    settings: HessianSettings | None = None,
    all_reduce: AllReduce | None = None,
    on_step: OnStep = None,
    **operator_keywords: Any,
) -> list[LayerCurvature]:
    """λmax and trace of each module's diagonal Hessian block (see :mod:`curvcal.curvature.layers`),
    each trace within ``probes`` products drawn from ``probe_dist`` (formerly ``n_probes`` and
    ``distribution``, taken with a :class:`DeprecationWarning`)."""
    operator = _operator(
        "hessian_layers", model, data, loss, gamma, settings, all_reduce, operator_keywords
    )
    return layer_curvature(
        operator,
        tol=tol,
        max_iter=max_iter,
        probes=probes,
        probe_dist=probe_dist,
        seed=seed,
        on_step=on_step,
    )


def analyse_hessian(
    model: ModelOrOperator,
    data: Any = None,
    settings: HessianSettings | None = None,
    *,
    all_reduce: AllReduce | None = None,
    on_step: OnStageStep = None,
    on_note: Any = None,
    **overrides: Any,
) -> HessianAnalysis:
    """Everything ``curvcal hessian`` measures, of ``model`` over ``data`` (or of the operator
    ``model``), on one operator: the mean loss, the top-k eigenvalues, λmin when asked, the
    trace, the density and the per-module blocks
    (:func:`~curvcal.curvature.analysis.analyse_batches`).

    ``settings``: a :class:`~curvcal.settings.hessian.HessianSettings` (default: the command's
    defaults), and any of its fields as keywords on top (``top_k=3``, ``density=True``,
    ``trace_method="hutchpp"``), checked as the command checks them. ``loss`` may also be a loss
    object, a torch loss module or a callable, as for :func:`hessian_operator`. With an
    operator, the fields the operator fixed when it was built (loss, ``params``, ``hvp``,
    ``mode``, ``cache``, ``probe_batch``, ``memory_budget``, ``keep_graphs``) cannot be given.
    ``on_note`` receives the notes of the plan (memory, kept graphs) at once.

    >>> import torch; from torch import nn; import curvcal
    >>> model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    >>> x, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    >>> analysis = curvcal.analyse_hessian(model, (x, y), top_k=2)
    >>> len(analysis.spectrum.values), analysis.trace.method
    (2, 'gauss-newton')
    """
    settings = HessianSettings() if settings is None else settings
    overrides = renamed(HessianSettings, overrides, "analyse_hessian")
    loss = overrides.pop("loss", None)
    known = {field.name for field in dataclasses.fields(HessianSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"analyse_hessian() got an unexpected keyword argument {unknown[0]!r}")
    loss_object = None
    if isinstance(loss, str):
        overrides["loss"] = loss
    elif loss is not None:
        if overrides.get("gamma", settings.gamma) is not None:
            raise InputError(
                "gamma", "goes with a loss name ('focal')", "leave gamma unset when passing a loss"
            )
        loss_object = as_loss(loss)
    if overrides:
        settings = dataclasses.replace(settings, **overrides)
    if isinstance(model, HessianOperator):
        defaults = HessianSettings()
        fixed = [
            name for name in OPERATOR_FIELDS if getattr(settings, name) != getattr(defaults, name)
        ]
        if loss_object is not None:
            fixed.insert(0, "loss")
        if fixed or data is not None or all_reduce is not None:
            raise InputError(
                (fixed or ["data" if data is not None else "all_reduce"])[0],
                "the operator already holds its data, loss and options",
                "pass it to hessian_operator, or pass the model and its data",
            )
        return analyse_operator(model, settings, on_step=on_step, on_note=on_note)
    if data is None:
        raise InputError(
            "data", "analyse_hessian() needs the data the loss is averaged over, besides the model"
        )
    return analyse_batches(
        model,
        rows.as_batches(data),
        settings,
        all_reduce=all_reduce,
        on_step=on_step,
        on_note=on_note,
        loss=loss_object,
    )
