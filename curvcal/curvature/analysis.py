"""One Hessian, every requested measurement: the library behind ``curvcal hessian``.

:func:`analyse_batches` builds a single operator (:func:`~curvcal.curvature.central_difference.build_operator`) — the
Hessian of the mean loss over the whole dataset, L(θ) = (1/N) Σ_i ℓ(f_θ(x_i), y_i) — so the data
is counted and cached once, then runs on it, in this order: the mean loss (one pass, checked for
NaN/Inf before any product), the top-k eigenvalues, λmin when asked, the trace, the spectral
density and the per-module blocks; with ``warm_start``, the top eigenvalues start from the top
eigenvectors of the Hessian over that fraction of the data
(:mod:`curvcal.curvature.warm_start`, its products on an operator of their own, recorded as
``warm_start``). Every algorithm starts from the same ``seed``, so each result
equals what the corresponding function of :mod:`curvcal.curvature.api` returns on its own.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from torch import Tensor, nn

from curvcal.curvature.batches import AllReduce, BatchSource
from curvcal.curvature.central_difference import build_operator, eigenvalue_products
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.eigenvectors import TopEigenvectors
from curvcal.curvature.engines import engines_between
from curvcal.curvature.gauss_newton import tensor_traces, trace_result
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.memory import density_keeps_basis, free_memory, lanczos_basis, sketch_limit
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.plan import (
    MIN_ADAPTIVE_PROBES,
    SPLIT_METHODS,
    check_sketch_memory,
    choose_trace_method,
    estimator_products,
    refuse_needless_probes,
)
from curvcal.curvature.precision import significant_digits
from curvcal.curvature.progress import WARM_STAGE, OnStageStep, OnStep, Stopped
from curvcal.curvature.residual import estimator_of, split_trace
from curvcal.curvature.results import (
    ConvergenceWarning,
    DensityResult,
    EigenSpectrum,
    HessianAnalysis,
    TraceResult,
)
from curvcal.curvature.trace import trace_estimate
from curvcal.curvature.vectors import space_of
from curvcal.curvature.warm_start import warm_start
from curvcal.errors import SettingsError, setting_name
from curvcal.losses import Loss, loss_from_name
from curvcal.settings.hessian import HessianSettings

#: Receives the top-k eigenvectors with their values, as the operator's vector space holds them.
OnEigenvectors = Callable[[TopEigenvectors], None]

#: a stage's result, which records the engines that made its products
Measured = TypeVar("Measured", EigenSpectrum, TraceResult, DensityResult)
#: the arguments of an analysis (:func:`analyse_batches`)
P = ParamSpec("P")

__all__ = [
    "HessianSettings",
    "analyse_batches",
    "analyse_hessian_with_messages",
    "analyse_operator",
    "check_sketch_memory",
    "choose_trace_method",
]


def analyse_batches(
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
    on_vectors: OnEigenvectors | None = None,
) -> HessianAnalysis:
    """Measure the Hessian of the mean loss of ``model`` over ``batches`` as ``settings`` ask.

    ``loss``: a loss object (:func:`~curvcal.losses.as_loss`) that takes the place of
    ``settings.loss`` and ``settings.gamma``.

    ``on_plan`` receives the settings as they will run, before any product: ``trace_method``
    resolved from ``auto`` (:func:`choose_trace_method`). ``on_operator`` receives the operator
    once it is built, before any pass over the data (``study`` counts FLSD-53's γ groups on it).
    ``on_vectors`` receives the top-k eigenvectors and their values
    (:class:`~curvcal.curvature.eigenvectors.TopEigenvectors`) once the eigenvalue stage ends.

    One operator serves every stage (``all_reduce`` sums the sample count and every product
    across processes when the data is sharded). Raises :class:`~curvcal.errors.SettingsError` for
    impossible settings (``top_k`` above the parameter count) before any product, and
    :class:`~curvcal.errors.NumericalError` when the loss or a product is NaN/Inf, with the
    number of offending batches and the first of them (:mod:`curvcal.curvature.guard`). Estimates
    that miss their tolerance are returned with ``converged=False`` and a
    :class:`~curvcal.curvature.results.ConvergenceWarning`; the caller decides whether to fail.
    The trace's sketch is checked against the memory budget before any product
    (:func:`check_sketch_memory`): a refusal raises, a warning goes to ``on_note`` at once.
    """
    operator, timings = _built(model, batches, settings, all_reduce, loss, on_operator)
    return analyse_operator(
        operator,
        settings,
        on_step=on_step,
        on_note=on_note,
        on_plan=on_plan,
        timings=timings,
        on_vectors=on_vectors,
    )


def _built(
    model: nn.Module,
    batches: BatchSource,
    settings: HessianSettings,
    all_reduce: AllReduce | None,
    loss: Loss | None,
    on_operator: Callable[[HessianOperator], None] | None,
) -> tuple[HessianOperator, dict[str, float]]:
    """The one operator of an analysis (handed to ``on_operator``), and the seconds spent
    building it (``setup``)."""
    began = time.perf_counter()
    operator = build_operator(
        model,
        loss_from_name(settings.loss, settings.focal_gamma) if loss is None else loss,
        batches,
        settings,
        all_reduce=all_reduce,
    )
    if on_operator is not None:
        on_operator(operator)
    return operator, {"setup": time.perf_counter() - began}


def analyse_operator(
    operator: HessianOperator,
    settings: HessianSettings,
    *,
    on_step: OnStageStep = None,
    on_note: Callable[[str], None] | None = None,
    on_plan: Callable[[HessianSettings], None] | None = None,
    timings: dict[str, float] | None = None,
    on_vectors: OnEigenvectors | None = None,
) -> HessianAnalysis:
    """:func:`analyse_batches` on an operator already built (its loss, parameters and how it
    runs are the operator's: the operator fields of ``settings`` are not read again).
    ``timings`` holds the seconds already spent (``setup``); the stages' are added to it.
    ``on_step`` gets the stage and the products made so far in every stage, the warm stage's
    (:data:`~curvcal.curvature.progress.WARM_STAGE`, on its sample's operator) included; it is
    also called at the end of each stage (its last products come after its last step). When ``on_step`` raises
    :class:`~curvcal.curvature.progress.Stopped` once a value has converged, it is raised again
    carrying the analysis of what finished: in the eigenvalue stage the values that converged
    (the spectrum's ``stopped_by`` is ``"interrupted"``) and no later stage, in the per-layer
    stage the modules finished, in another stage the stages before it (the others ``None``);
    stopped before any value converged, it is raised again with ``finished=None``."""
    timings = {} if timings is None else dict(timings)
    n_params = operator.shape[0]
    if settings.top_k > n_params:
        raise SettingsError(
            "top_k",
            f"asked for {settings.top_k} eigenvalues of a Hessian with {n_params} parameters",
            f"use at most {n_params}",
        )
    density_note = None
    if settings.density and settings.density_steps > n_params:
        # Lanczos on a P-row matrix ends within P steps: more would plan products never made
        density_note = (
            f"{setting_name('density_steps')} {settings.density_steps} capped at {n_params}, the parameter "
            "count: Lanczos on a Hessian of P rows ends within P steps"
        )
        settings = dataclasses.replace(settings, density_steps=n_params)
    trace_choice = ""
    if settings.trace:
        method, trace_choice = choose_trace_method(operator, settings)
        settings = dataclasses.replace(settings, trace_method=method)
        refuse_needless_probes(settings, n_params)
    if on_plan is not None:
        on_plan(settings)
    budget = operator.budget
    free = free_memory(operator.device)
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
                products=estimator_products(operator, settings),
            )
        )
    notes.append(density_note)
    for note in notes:
        if note is not None and on_note is not None:
            on_note(note)

    # products made on operators of their own (the warm stage's sample), counted before the
    # full operator's in every report: the count is of every product the analysis made
    apart = [0]

    def made() -> int:
        return apart[0] + operator.total_matvecs

    def hook(stage: str) -> OnStep:
        if on_step is None:
            return None
        report = on_step
        return lambda _done: report(stage, made())

    def timed(stage: str, label: str | None = None) -> Callable[[], None]:
        start = time.perf_counter()

        def stop() -> None:
            timings[stage] = time.perf_counter() - start
            # the stage's last products (Lanczos's residual checks, a final block) come
            # after its last step report: the count at its end is the one the table shows
            if on_step is not None and stage != "loss":
                on_step(label or stage, made())

        return stop

    stop = timed("loss")
    mean_loss = operator.mean_loss()
    stop()

    warm = None
    if settings.warm_start is not None:
        stop = timed("warm_start", WARM_STAGE)
        report = on_step
        try:
            warm = warm_start(
                operator,
                settings.warm_start,
                settings.top_k,
                seed=settings.seed,
                max_basis=lanczos_basis(settings.top_k, n_params, budget, settings.max_basis),
                # its products are on the sample's own operator: counted as they are made
                on_step=None
                if report is None
                else lambda products: report(WARM_STAGE, made() + products),
            )
        except Stopped as signal:  # nothing of the full data's spectrum is known yet
            raise Stopped(None, signal.stage) from None
        apart[0] += warm.n_matvecs
        stop()

    stop = timed("eigenvalues")
    kept: list[Tensor] = []
    stopped: Stopped | None = None
    try:
        spectrum = _eigen(
            operator,
            settings,
            settings.top_k,
            "largest",
            budget,
            hook("eigenvalues"),
            None if on_vectors is None else kept.append,
            start=None if warm is None else warm.vector,
        )
    except Stopped as signal:
        if not isinstance(signal.finished, EigenSpectrum):
            raise Stopped(None, signal.stage) from None
        spectrum, stopped = signal.finished, signal
    try:
        stop()
    except Stopped as signal:  # asked for at the stage's very end: every value is kept
        stopped = stopped or signal
    if on_vectors is not None and kept:
        on_vectors(
            TopEigenvectors(
                spectrum.eigenvalues,
                tuple(operator.param_names),
                tuple(p.shape for p in operator.parameters),
                space_of(operator),
                kept[0],
            )
        )
        kept.clear()  # not held through the later stages

    smallest = None
    trace, shares = None, None
    density = None
    layers = None
    try:  # the stages after λmax: a hook that stops the run keeps what they finished
        if stopped is not None:  # stopped in the eigenvalues: no later stage runs
            raise stopped
        smallest = None
        if settings.smallest:
            stop = timed("smallest")
            smallest = _eigen(operator, settings, 1, "smallest", budget, hook("smallest"))
            stop()

        trace, shares = None, None
        if settings.trace:
            stop = timed("trace")
            before = dict(operator.engine_products)
            method = settings.trace_method
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
                    probe_dist=settings.probe_dist,
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
                trace = _with_engines(
                    operator,
                    before,
                    trace_estimate(
                        operator,
                        settings.probes,
                        trace_method=settings.trace_method,
                        trace_rtol=settings.trace_rtol,
                        max_probes=settings.probes,
                        min_probes=min(MIN_ADAPTIVE_PROBES, settings.probes),
                        probe_dist=settings.probe_dist,
                        seed=settings.seed,
                        probe_batch=operator.probe_batch,
                        max_sketch=max_sketch,
                        on_step=hook("trace"),
                    ),
                )
            stop()

        density = None
        if settings.density:
            stop = timed("density")
            before = dict(operator.engine_products)
            density = _with_engines(
                operator,
                before,
                spectral_density(
                    operator,
                    runs=settings.density_runs,
                    steps=settings.density_steps,
                    seed=settings.seed,
                    reorthogonalise=density_keeps_basis(
                        settings.density_steps, n_params, budget, settings.max_basis, operator.dtype
                    ),
                    on_step=hook("density"),
                ),
            )
            stop()

        layers = None
        if settings.per_layer:
            stop = timed("layers")
            layers = layer_curvature(
                operator,
                tol=settings.tol,
                max_iter=settings.max_iter,
                probes=settings.probes,
                probe_dist=settings.probe_dist,
                seed=settings.seed,
                on_step=hook("layers"),
                gauss_newton=shares,
            )
            stop()

    except Stopped as signal:
        stopped = signal
        if isinstance(signal.finished, list) and signal.finished:  # the modules finished
            layers = signal.finished

    description = {
        "curvature": operator.curvature,
        "loss": operator.loss.name,
        "gamma": operator.gamma,
        "mean_loss": mean_loss,
        "mode": operator.mode,
        "engine": operator.engine,
        "engine_requested": operator.requested_engine,
        "engine_fallback": operator.engine_fallback,
        "cache_mode": operator.cache_mode,
        "n_params": n_params,
        "n_samples": operator.n_samples,
        "model_dtype": str(operator.model_dtype).removeprefix("torch."),
        "precision_floor": operator.precision_floor or None,
        "accuracy_bound": operator.accuracy_bound or None,
        "significant_digits": significant_digits(
            max(operator.precision_floor, operator.accuracy_bound)
        ),
        "params": list(operator.param_names),
        "probe_batch": operator.probe_batch,
        "micro_batch": operator.micro_batch,
        "graphs_kept": operator.graphs_kept,
        "kept_rows": operator.kept_rows,
        "graphs_dropped": operator.graphs_dropped,
        "memory_plan": None if operator.memory_choice is None else operator.memory_choice.as_dict(),
        "lanczos_basis": lanczos_basis(settings.top_k, n_params, budget, settings.max_basis),
        "n_matvecs": operator.total_matvecs,
        "n_data_passes": operator.total_data_passes,
        "trace_choice": trace_choice,
        **({} if warm is None else {"warm_start": warm.as_dict()}),
    }
    analysis = HessianAnalysis(
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
    if stopped is not None:
        raise Stopped(analysis, stopped.stage) from None
    return analysis


def _with_messages(
    analyse: Callable[P, HessianAnalysis],
) -> Callable[P, tuple[HessianAnalysis, list[str]]]:
    """``analyse`` returning, with its analysis, the warnings a report shows (unconverged
    estimates, an engine fallback to double backward) as messages; other warnings are passed
    on untouched."""

    def with_messages(*args: P.args, **kwargs: P.kwargs) -> tuple[HessianAnalysis, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            # torch.func's first use imports torch internals that warn about their own
            # deprecations.
            warnings.filterwarnings("ignore", r"`torch\.jit\.script` is deprecated", FutureWarning)
            analysis = analyse(*args, **kwargs)
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

    return with_messages


#: :func:`analyse_batches` (the same arguments, operator and stages), returning the warnings a
#: report shows as messages (:func:`_with_messages`); ``on_note`` receives the notes that
#: cannot wait for the end (the sketch's memory, the budget that would keep the gradient graphs)
analyse_hessian_with_messages = _with_messages(analyse_batches)


def _with_engines(operator: HessianOperator, before: dict[str, int], result: Measured) -> Measured:
    """``result`` with the engines that made its products, those ``operator`` ran since
    ``before`` (a copy of its ``engine_products``)."""
    return dataclasses.replace(result, engine=engines_between(operator.engine_products, before))


def _eigen(
    operator: HessianOperator,
    settings: HessianSettings,
    k: int,
    which: str,
    budget: int | None,
    on_step: OnStep,
    on_vectors: Callable[[Tensor], None] | None = None,
    start: Tensor | None = None,
) -> EigenSpectrum:
    # λmin of a Hessian sits among many eigenvalues near zero, where power iteration (even
    # shifted) converges at a crawl; Lanczos reaches both ends of the spectrum directly.
    method = settings.method or ("lanczos" if which == "smallest" else None)
    before = dict(operator.engine_products)
    try:
        with eigenvalue_products(operator):  # central differences: b·‖H‖‖v‖ is enough
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
                on_vectors=on_vectors,
                start=start,
            )
    except Stopped as signal:  # the values kept say which engine made them too
        if isinstance(signal.finished, EigenSpectrum):
            signal.finished = _with_engines(operator, before, signal.finished)
        raise
    return _with_engines(operator, before, spectrum)


def __getattr__(name: str) -> Any:
    """``analyse_hessian``, this module's former name of :func:`analyse_batches` (the public
    :func:`curvcal.analyse_hessian` takes a model or an operator and any data), with a
    :class:`DeprecationWarning`."""
    if name == "analyse_hessian":
        warnings.warn(
            "curvcal.curvature.analysis.analyse_hessian is now analyse_batches "
            "(curvcal.analyse_hessian is the public one); the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return analyse_batches
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
