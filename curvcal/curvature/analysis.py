"""One Hessian, every requested measurement: the library behind ``curvcal hessian``.

:func:`analyse_hessian` builds a single operator (:func:`~curvcal.curvature.operator.build_operator`) — the
Hessian of the mean loss over the whole dataset, L(θ) = (1/N) Σ_i ℓ(f_θ(x_i), y_i) — so the data
is counted and cached once, then runs on it, in this order: the mean loss (one pass, checked for
NaN/Inf before any product), the top-k eigenvalues, λmin when asked, the trace, the spectral
density and the per-module blocks. Every algorithm starts from the same ``seed``, so each result
equals what the corresponding function of :mod:`curvcal.curvature.api` returns on its own.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from curvcal.curvature.batches import AllReduce, BatchSource
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.engines import engines_between
from curvcal.curvature.gauss_newton import (
    n_classes,
    require_exact,
    tensor_traces,
    trace_result,
)
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.memory import (
    FREE_FRACTION,
    density_keeps_basis,
    free_memory,
    lanczos_basis,
    sketch_limit,
)
from curvcal.curvature.operator import HessianOperator, build_operator
from curvcal.curvature.options import OperatorOptions
from curvcal.curvature.residual import METHODS as SPLIT_METHODS
from curvcal.curvature.residual import (
    auto_method,
    estimator_of,
    residual_products,
    split_problem,
    split_trace,
)
from curvcal.curvature.results import ConvergenceWarning, EigenSpectrum, HessianAnalysis
from curvcal.curvature.trace import sketch_bytes, sketch_columns, trace_estimate
from curvcal.errors import InputError
from curvcal.losses import Loss, loss_from_name
from curvcal.progress import OnStageStep, OnStep
from curvcal.settings.hessian import HessianSettings

# Trace method names as the settings (and the CLI) spell them -> the kernels' names.
TRACE_METHODS = {
    "auto": "auto",
    "gauss-newton": "gauss-newton",
    "hutchinson": "hutchinson",
    "hutchpp": "hutch++",
    "xtrace": "xtrace",
    "gauss-newton+hutchpp": "gauss-newton+hutch++",
    "gauss-newton+xtrace": "gauss-newton+xtrace",
}
MIN_ADAPTIVE_PROBES = 10


def selected_parameter_count(model: nn.Module, params: tuple[str, ...] = ()) -> int:
    """P, the dimension of the Hessian: elements of the trainable parameters (``requires_grad``)
    whose names match one of the glob patterns ``params`` (all of them when empty)."""
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.requires_grad and (not params or any(fnmatch.fnmatchcase(name, g) for g in params))
    )


def _size(n_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} bytes"


def kept_graphs_note(
    settings: HessianSettings,
    need: int | None,
    kept_rows: int | None,
    n_samples: int,
    free: int | None,
) -> str | None:
    """A note when ``keep_graphs="auto"`` rebuilt the gradient graphs of some or all of the
    ``n_samples`` samples for every product (``kept_rows`` kept, None for none) only because the
    default memory budget was too small for them (``need`` bytes: the kept graphs and a product
    through them) while half the ``free`` memory would hold them: the ``--memory-budget`` that
    keeps them. None when all are kept, when the user chose the budget or ``never``, when they
    cannot be kept (``func``, train mode), or when memory is short."""
    if kept_rows == n_samples or need is None:
        return None
    if settings.keep_graphs != "auto" or settings.memory_budget:
        return None
    if settings.hvp == "func" or settings.mode == "train":
        return None
    if free is not None and need > FREE_FRACTION * free:
        return None
    rebuilt = (
        "every Hessian-vector product builds the gradient graphs again"
        if kept_rows is None
        else f"every Hessian-vector product builds the gradient graphs of {n_samples - kept_rows} "
        f"of the {n_samples} samples again"
    )
    return (
        f"{rebuilt}: keeping them all needs "
        f"about {_size(need)}, more than the default memory budget; --memory-budget "
        f"{math.ceil(need / 2**20)}MiB keeps them, and each product then skips the forward and "
        "first backward (--keep-graphs never: no note)"
    )


def choose_trace_method(operator: HessianOperator, settings: HessianSettings) -> tuple[str, str]:
    """The trace method ``settings`` resolve to on ``operator``, and why (for ``auto``).

    ``auto``: ``gauss-newton`` where it is exact and costs at most ``probes`` gradient norms per
    sample; else ``gauss-newton+hutchpp`` (:mod:`~curvcal.curvature.residual`: tr(G) exact,
    Hutch++ on the rest) where that can run; else ``hutchpp``. An explicit ``gauss-newton`` that
    would not be exact, or a split method that cannot run, raises :class:`InputError` naming
    why. The reason is '' for a method that was asked for by name."""
    method = TRACE_METHODS[settings.trace_method]
    if method == "gauss-newton":
        require_exact(operator, "--trace-method")
        return settings.trace_method, ""
    if method in SPLIT_METHODS:
        problem = split_problem(operator.mode, settings.probes, n_classes(operator), operator.loss)
        if problem:
            raise InputError(
                "--trace-method",
                f"the split trace {settings.trace_method} cannot run here: {problem}",
                "ask for hutchpp or xtrace, or more --probes",
            )
        return settings.trace_method, ""
    if method != "auto":
        return settings.trace_method, ""
    chosen, why = auto_method(operator, settings.probes)
    return _SETTING_NAMES[chosen], why


#: the kernels' method names -> the settings' (and the CLI's)
_SETTING_NAMES = {
    "gauss-newton": "gauss-newton",
    "gauss-newton+hutch++": "gauss-newton+hutchpp",
    "hutch++": "hutchpp",
}


#: the trace methods whose ``probes`` are all products of the P × P Hessian
_PURE_ESTIMATORS = ("hutchinson", "hutchpp", "xtrace")


def _refuse_needless_probes(settings: HessianSettings, n_params: int) -> None:
    """Refuse ``--probes`` above 3P for an estimator whose every probe is a Hessian product.

    P products with the unit vectors give tr(H) exactly, and Hutch++ with 3P products has a
    sketch of P columns that spans the space (exact up to rounding); a plan of more products
    cannot be closer to the trace than one that is already exact, only longer (10^12 probes
    would run for ever)."""
    most = 3 * n_params
    if settings.trace_method in _PURE_ESTIMATORS and settings.probes > most:
        raise InputError(
            "--probes",
            f"{settings.probes} trace probes asked of a Hessian with {n_params} parameters: "
            f"{most} (3P) products are enough for the exact trace (Hutch++ or XTrace)",
            f"use --probes {most} or fewer",
        )


def _estimator_products(operator: HessianOperator, settings: HessianSettings) -> int:
    """The products the trace's estimator gets: ``--probes``, less the C − 1 gradient norms per
    sample a split trace's exact part takes."""
    if settings.trace and TRACE_METHODS[settings.trace_method] in SPLIT_METHODS:
        return residual_products(settings.probes, n_classes(operator))
    return settings.probes


def check_sketch_memory(
    settings: HessianSettings,
    n_params: int,
    dtype: torch.dtype,
    budget: int,
    *,
    explicit: bool,
    free: int | None,
    products: int | None = None,
) -> str | None:
    """Whether the trace's sketch (Hutch++, XTrace: s × P values of ``dtype`` held besides the
    products, :func:`~curvcal.curvature.trace.sketch_bytes`) fits the memory ``budget``.
    ``products``: those the estimator gets (default ``settings.probes``; fewer for a split
    trace, whose exact part takes C − 1 of them).

    A Hutch++ sketch that does not fit is bounded to what fits
    (:func:`~curvcal.curvature.memory.sketch_limit`, at least one column; the products it does
    not take go to Hutchinson probes of the deflated rest): the returned note says so. An XTrace
    sketch cannot be bounded (every product is in it): it raises
    :class:`~curvcal.errors.InputError` (before any product is spent) when it exceeds a budget
    the user gave (``explicit``), or the ``free`` memory when that is known (it could only end in
    an out-of-memory error), and returns a warning when it exceeds the default budget (the
    budget then bounds the products only, and the run goes on). None when the sketch fits. The
    message says how much the sketch holds and what to change.
    """
    if not settings.trace:
        return None
    method = estimator_of(TRACE_METHODS[settings.trace_method])
    products = settings.probes if products is None else products
    held = sketch_bytes(method, products, n_params, dtype)
    over_budget = held > budget
    over_free = free is not None and held > free
    if held == 0 or not (over_budget or over_free):
        return None
    columns = sketch_columns(method, products, n_params)
    name = "Hutch++" if method == "hutch++" else "XTrace"
    held_text = (
        f"the {name} sketch of {products} products holds {columns:,} × {n_params:,} values "
        f"({_size(held)} in {str(dtype).replace('torch.', '')}) besides the products"
    )
    if method == "hutch++":
        kept = sketch_limit(method, n_params, dtype, budget, free) or 1
        element = torch.empty((), dtype=dtype).element_size()
        limit = (
            f"the free memory ({_size(free or 0)})"
            if over_free and (free or 0) < budget
            else f"the {'' if explicit else 'default '}memory budget of {_size(budget)}"
        )
        return (
            f"{held_text.replace(' holds ', ' would hold ')}, more than {limit}: it holds "
            f"{kept:,} column{'s' if kept > 1 else ''} ({_size(kept * n_params * element)}) and "
            "the products it does not take are Hutchinson probes of the deflated rest (a larger "
            "--memory-budget gives the sketch more columns and the trace a smaller error)"
        )
    limit_bytes = min(budget, free) if free is not None and over_free else budget
    most = limit_bytes // (n_params * torch.empty((), dtype=dtype).element_size())
    spare = settings.probes - products  # taken by a split trace's exact part
    fewer = (
        f"--probes {2 * most + 1 + spare} or fewer" if most >= 2 else "fewer parameters (--params)"
    )
    advice = f"use {fewer}, --trace-method hutchpp or hutchinson, or a larger --memory-budget"
    if over_free:
        raise InputError(
            "--probes",
            f"{held_text}, more than the free memory ({_size(free or 0)})",
            advice,
        )
    if explicit:
        raise InputError(
            "--memory-budget",
            f"{held_text}, more than the memory budget of {_size(budget)}",
            advice,
        )
    return (
        f"{held_text}, more than the default memory budget of {_size(budget)} (which bounds "
        f"the products); to stay within it, {advice}"
    )


def analyse_hessian(
    model: nn.Module,
    batches: BatchSource,
    settings: HessianSettings,
    *,
    all_reduce: AllReduce | None = None,
    on_step: OnStageStep = None,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[HessianSettings], None] | None = None,
    loss: Loss | None = None,
    on_operator: Callable[[HessianOperator], None] | None = None,
) -> HessianAnalysis:
    """Measure the Hessian of the mean loss of ``model`` over ``batches`` as ``settings`` ask.

    ``loss``: a loss object (:func:`~curvcal.losses.as_loss`) that takes the place of
    ``settings.loss`` and ``settings.gamma``.

    ``on_plan`` receives the settings as they will run, before any product: ``trace_method``
    resolved from ``auto`` (:func:`choose_trace_method`). ``on_operator`` receives the operator
    once it is built, before any pass over the data (``study`` counts FLSD-53's γ groups on it).

    One operator serves every stage (``all_reduce`` sums the sample count and every product
    across processes when the data is sharded). Raises :class:`~curvcal.errors.InputError` for
    impossible settings (``top_k`` above the parameter count) before any product, and
    :class:`~curvcal.errors.NumericalError` when the loss or a product is NaN/Inf, with the
    number of offending batches and the first of them (:mod:`curvcal.curvature.guard`). Estimates
    that miss their tolerance are returned with ``converged=False`` and a
    :class:`~curvcal.curvature.results.ConvergenceWarning`; the caller decides whether to fail.
    The trace's sketch is checked against the memory budget before any product
    (:func:`check_sketch_memory`): a refusal raises, a warning goes to ``on_note`` at once.
    """
    began = time.perf_counter()
    operator = build_operator(
        model,
        loss_from_name(settings.loss, settings.focal_gamma) if loss is None else loss,
        batches,
        operator_options(settings),
        all_reduce=all_reduce,
    )
    if on_operator is not None:
        on_operator(operator)
    return analyse_operator(
        operator,
        settings,
        on_step=on_step,
        on_note=on_note,
        on_plan=on_plan,
        timings={"setup": time.perf_counter() - began},
    )


def operator_options(settings: HessianSettings) -> OperatorOptions:
    """How the operator of ``settings`` runs: the fields ``params``, ``hvp``, ``mode``,
    ``cache``, ``probe_batch``, ``memory_budget`` and ``keep_graphs``."""
    return OperatorOptions(
        params=settings.params or None,
        engine=settings.hvp,
        mode=settings.mode,
        cache=settings.cache,
        probe_batch=settings.probe_batch,
        memory_budget=settings.memory_budget,
        keep_graphs=settings.keep_graphs,
    )


def analyse_operator(
    operator: HessianOperator,
    settings: HessianSettings,
    *,
    on_step: OnStageStep = None,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[HessianSettings], None] | None = None,
    timings: dict[str, float] | None = None,
) -> HessianAnalysis:
    """:func:`analyse_hessian` on an operator already built (its loss, parameters and how it
    runs are the operator's: the operator fields of ``settings`` are not read again).
    ``timings`` holds the seconds already spent (``setup``); the stages' are added to it."""
    timings = {} if timings is None else dict(timings)
    n_params = operator.shape[0]
    if settings.top_k > n_params:
        raise InputError(
            "top_k",
            f"asked for {settings.top_k} eigenvalues of a Hessian with {n_params} parameters",
            f"use at most {n_params}",
        )
    density_note = None
    if settings.density and settings.density_steps > n_params:
        # Lanczos on a P-row matrix ends within P steps: more would plan products never made
        density_note = (
            f"--density-steps {settings.density_steps} capped at {n_params}, the parameter "
            "count: Lanczos on a Hessian of P rows ends within P steps"
        )
        settings = dataclasses.replace(settings, density_steps=n_params)
    trace_choice = ""
    if settings.trace:
        method, trace_choice = choose_trace_method(operator, settings)
        settings = dataclasses.replace(settings, trace_method=method)
        _refuse_needless_probes(settings, n_params)
    if on_plan is not None:
        on_plan(settings)
    budget = operator.budget
    free = free_memory(operator.device)  # read once for both memory notes
    notes: list[str | None] = []
    if budget is not None:
        notes.append(
            check_sketch_memory(
                settings,
                n_params,
                operator.dtype,
                budget,
                explicit=settings.memory_budget is not None,
                free=free,
                products=_estimator_products(operator, settings),
            )
        )
    notes.append(
        kept_graphs_note(settings, operator.kept_need, operator.kept_rows, operator.n_samples, free)
    )
    notes.append(density_note)
    for note in notes:
        if note is not None and on_note is not None:
            on_note(note)

    def hook(stage: str) -> OnStep:
        if on_step is None:
            return None
        report = on_step
        return lambda _done: report(stage, operator.total_matvecs)

    def timed(stage: str) -> Callable[[], None]:
        start = time.perf_counter()

        def stop() -> None:
            timings[stage] = time.perf_counter() - start

        return stop

    stop = timed("loss")
    mean_loss = operator.mean_loss()
    stop()

    stop = timed("eigenvalues")
    spectrum = _eigen(operator, settings, settings.top_k, "largest", budget, hook("eigenvalues"))
    stop()

    smallest = None
    if settings.smallest:
        stop = timed("smallest")
        smallest = _eigen(operator, settings, 1, "smallest", budget, hook("smallest"))
        stop()

    trace, shares = None, None
    if settings.trace:
        stop = timed("trace")
        before = dict(operator.engine_products)
        method = TRACE_METHODS[settings.trace_method]
        max_sketch = sketch_limit(estimator_of(method), n_params, operator.dtype, budget, free)
        if settings.trace_method == "gauss-newton":  # checked by choose_trace_method
            # no product is made: the stage's name carries the batches done
            shares = tensor_traces(
                operator,
                on_step=None
                if on_step is None
                else lambda done: on_step(
                    f"Gauss–Newton trace, batch {done}", operator.total_matvecs
                ),
            )
            trace = trace_result(shares)
        elif method in SPLIT_METHODS:
            trace = split_trace(
                operator,
                method,
                settings.probes,
                distribution=settings.probe_dist,
                seed=settings.seed,
                probe_batch=operator.probe_batch,
                max_sketch=max_sketch,
                on_exact=None
                if on_step is None
                else lambda done: on_step(
                    f"Gauss–Newton part, batch {done}", operator.total_matvecs
                ),
                on_step=hook("trace"),
            )
        else:
            trace = trace_estimate(
                operator,
                settings.probes,
                method=TRACE_METHODS[settings.trace_method],
                rtol=settings.trace_rtol,
                max_probes=settings.probes,
                min_probes=min(MIN_ADAPTIVE_PROBES, settings.probes),
                distribution=settings.probe_dist,
                seed=settings.seed,
                probe_batch=operator.probe_batch,
                max_sketch=max_sketch,
                on_step=hook("trace"),
            )
            trace = dataclasses.replace(
                trace, engine=engines_between(operator.engine_products, before)
            )
        stop()

    density = None
    if settings.density:
        stop = timed("density")
        before = dict(operator.engine_products)
        density = spectral_density(
            operator,
            runs=settings.density_runs,
            steps=settings.density_steps,
            seed=settings.seed,
            reorthogonalise=density_keeps_basis(
                settings.density_steps, n_params, budget, settings.max_basis, operator.dtype
            ),
            on_step=hook("density"),
        )
        density = dataclasses.replace(
            density, engine=engines_between(operator.engine_products, before)
        )
        stop()

    layers = None
    if settings.per_layer:
        stop = timed("layers")
        layers = layer_curvature(
            operator,
            tol=settings.tol,
            max_iter=settings.max_iter,
            n_probes=settings.probes,
            distribution=settings.probe_dist,
            seed=settings.seed,
            on_step=hook("layers"),
            gauss_newton=shares,
        )
        stop()

    description = {
        "loss": operator.criterion,
        "gamma": operator.gamma,
        "mean_loss": mean_loss,
        "mode": operator.mode,
        "engine": operator.engine,
        "engine_requested": operator.requested_engine,
        "engine_fallback": operator.engine_fallback,
        "cache_mode": operator.cache_mode,
        "n_params": n_params,
        "n_samples": operator.n_samples,
        "params": list(operator.param_names),
        "probe_batch": operator.probe_batch,
        "micro_batch": operator.micro_batch,
        "graphs_kept": operator.graphs_kept,
        "kept_rows": operator.kept_rows,
        "graphs_dropped": operator.graphs_dropped,
        "lanczos_basis": lanczos_basis(settings.top_k, n_params, budget, settings.max_basis),
        "n_matvecs": operator.total_matvecs,
        "n_data_passes": operator.total_data_passes,
        "trace_choice": trace_choice,
    }
    return HessianAnalysis(
        lambda_max=spectrum.values[0].value,
        lambda_min=smallest.values[0].value if smallest is not None else None,
        spectrum=spectrum,
        smallest=smallest,
        trace=trace,
        density=density,
        layers=layers,
        operator=description,
        timings=timings,
    )


def analyse_hessian_with_messages(
    model: nn.Module,
    batches: BatchSource,
    settings: HessianSettings,
    *,
    all_reduce: AllReduce | None = None,
    on_step: OnStageStep = None,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[HessianSettings], None] | None = None,
    on_operator: Callable[[HessianOperator], None] | None = None,
) -> tuple[HessianAnalysis, list[str]]:
    """:func:`analyse_hessian`, returning the warnings a report shows (unconverged estimates, an
    engine fallback to double backward) as messages; other warnings are passed on untouched.
    ``on_note`` receives the notes that cannot wait for the end (the sketch's memory, the
    budget that would keep the gradient graphs)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        # torch.func's first use imports torch internals that warn about their own deprecations.
        warnings.filterwarnings("ignore", r"`torch\.jit\.script` is deprecated", FutureWarning)
        analysis = analyse_hessian(
            model,
            batches,
            settings,
            all_reduce=all_reduce,
            on_step=on_step,
            on_note=on_note,
            on_plan=on_plan,
            on_operator=on_operator,
        )
    messages = []
    for warning in caught:
        if issubclass(warning.category, ConvergenceWarning):
            messages.append(str(warning.message))
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    fallback = analysis.operator.get("engine_fallback")
    if fallback:
        messages.append(
            f"torch.func could not differentiate the model ({fallback}); used double backward"
        )
    return analysis, messages


def _eigen(
    operator: HessianOperator,
    settings: HessianSettings,
    k: int,
    which: str,
    budget: int | None,
    on_step: OnStep,
) -> EigenSpectrum:
    # λmin of a Hessian sits among many eigenvalues near zero, where power iteration (even
    # shifted) converges at a crawl; Lanczos reaches both ends of the spectrum directly.
    method = settings.method or ("lanczos" if which == "smallest" else None)
    before = dict(operator.engine_products)
    spectrum = eigenvalues(
        operator,
        k,
        method=method,
        which=which,
        tol=settings.tol,
        max_iter=settings.max_iter,
        max_basis=lanczos_basis(k, operator.shape[0], budget, settings.max_basis),
        seed=settings.seed,
        on_step=on_step,
    )
    return dataclasses.replace(spectrum, engine=engines_between(operator.engine_products, before))
