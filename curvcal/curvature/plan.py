"""What a Hessian analysis will do, decided before any product: the plan and its notes.

From the settings and the operator, before the first pass over the data: the trace method that
``auto`` resolves to (:func:`choose_trace_method`), requests refused because they cannot run or
cannot gain anything (too many probes, an XTrace sketch beyond the memory), and the notes a run
shows at once (a Hutch++ sketch bounded by the memory budget). :func:`~curvcal.curvature.analysis.analyse_hessian` runs the plan.
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from curvcal.curvature.gauss_newton import n_classes, require_exact
from curvcal.curvature.memory import size_text, sketch_limit
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.residual import METHODS as SPLIT_METHODS
from curvcal.curvature.residual import auto_method, estimator_of, residual_products, split_problem
from curvcal.curvature.trace import sketch_bytes, sketch_columns
from curvcal.errors import SettingsError, setting_name
from curvcal.settings.hessian import HessianSettings

MIN_ADAPTIVE_PROBES = 10


def selected_parameter_count(model: nn.Module, params: tuple[str, ...] = ()) -> int:
    """P, the dimension of the Hessian: elements of the trainable parameters (``requires_grad``)
    whose names match one of the glob patterns ``params`` (all of them when empty)."""
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.requires_grad and (not params or any(fnmatch.fnmatchcase(name, g) for g in params))
    )


def choose_trace_method(operator: HessianOperator, settings: HessianSettings) -> tuple[str, str]:
    """The trace method ``settings`` resolve to on ``operator``, and why (for ``auto``).

    ``auto``: ``gauss-newton`` where it is exact and costs at most ``probes`` gradient norms per
    sample; else ``gauss-newton+hutchpp`` (:mod:`~curvcal.curvature.residual`: tr(G) exact,
    Hutch++ on the rest) where that can run; else ``hutchpp``. An explicit ``gauss-newton`` that
    would not be exact, or a split method that cannot run, raises :class:`InputError` naming
    why. The reason is '' for a method that was asked for by name."""
    method = settings.trace_method
    if operator.curvature != "hessian":
        return _kind_trace_method(operator, settings)
    if method == "gauss-newton":
        require_exact(operator)
        return settings.trace_method, ""
    if method in SPLIT_METHODS:
        problem = split_problem(operator.mode, settings.probes, n_classes(operator), operator.loss)
        if problem:
            raise SettingsError(
                "trace_method",
                f"the split trace {settings.trace_method} cannot run here: {problem}",
                f"ask for hutchpp or xtrace, or more {setting_name('probes')}",
            )
        return settings.trace_method, ""
    if method != "auto":
        return settings.trace_method, ""
    chosen, why = auto_method(operator, settings.probes)
    return chosen, why


def _kind_trace_method(operator: HessianOperator, settings: HessianSettings) -> tuple[str, str]:
    """:func:`choose_trace_method` for a curvature other than the Hessian.

    The Gauss–Newton trace tr(G) = (1/N) Σ_n Σ_k λ_{n,k} ‖J_nᵀ u_{n,k}‖² (no product) *is* the
    GGN's trace, exact on any network (no linearity needed), and the Fisher's for cross-entropy,
    whose Fisher is its GGN. ``auto``: that trace where its C − 1 gradient norms per sample fit
    in ``probes``, else Hutch++. The split traces (Gauss–Newton part + an estimate of H − G)
    are the Hessian's only, and refused."""
    method = settings.trace_method
    kind = operator.curvature
    exact = kind == "ggn" or (kind == "fisher" and operator.loss.name == "ce")
    if method in SPLIT_METHODS:
        raise SettingsError(
            "trace_method",
            f"{settings.trace_method} splits the Hessian into its Gauss–Newton part and the rest; "
            f"it has no meaning for {setting_name('curvature')} {kind}",
            "ask for auto, gauss-newton, hutchpp, xtrace or hutchinson",
        )
    if method == "gauss-newton":
        if not exact:
            raise SettingsError(
                "trace_method",
                f"gauss-newton is the trace of the GGN, not of the {kind} of the "
                f"{operator.loss.name} loss (for cross-entropy only the Fisher equals the GGN)",
                "ask for auto, hutchpp, xtrace or hutchinson",
            )
        return settings.trace_method, ""
    if method != "auto":
        return settings.trace_method, ""
    if not exact:
        return "hutchpp", f"Hutch++: the {kind} of this loss has no product-free exact trace here"
    classes = n_classes(operator)
    if classes - 1 > settings.probes:
        return "hutchpp", (
            f"Hutch++: the exact Gauss–Newton trace would take up to {classes - 1} gradient norms "
            f"per sample, more than {setting_name('probes')} {settings.probes}"
        )
    return "gauss-newton", f"the exact trace of the {kind} (its Gauss–Newton form, no product)"


#: the trace methods whose ``probes`` are all products of the P × P Hessian
_PURE_ESTIMATORS = ("hutchinson", "hutchpp", "xtrace")


def refuse_needless_probes(settings: HessianSettings, n_params: int) -> None:
    """Refuse ``--probes`` above 3P for an estimator whose every probe is a Hessian product.

    P products with the unit vectors give tr(H) exactly, and Hutch++ with 3P products has a
    sketch of P columns that spans the space (exact up to rounding); a plan of more products
    cannot be closer to the trace than one that is already exact, only longer (10^12 probes
    would run for ever)."""
    most = 3 * n_params
    if settings.trace_method in _PURE_ESTIMATORS and settings.probes > most:
        raise SettingsError(
            "probes",
            f"{settings.probes} trace probes asked of a Hessian with {n_params} parameters: "
            f"{most} (3P) products are enough for the exact trace (Hutch++ or XTrace)",
            f"use {setting_name('probes')} {most} or fewer",
        )


def estimator_products(operator: HessianOperator, settings: HessianSettings) -> int:
    """The products the trace's estimator gets: ``--probes``, less the C − 1 gradient norms per
    sample a split trace's exact part takes."""
    if settings.trace and settings.trace_method in SPLIT_METHODS:
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
    method = estimator_of(settings.trace_method)
    products = settings.probes if products is None else products
    held = sketch_bytes(method, products, n_params, dtype)
    over_budget = held > budget
    over_free = free is not None and held > free
    if held == 0 or not (over_budget or over_free):
        return None
    columns = sketch_columns(method, products, n_params)
    name = "Hutch++" if method == "hutchpp" else "XTrace"
    held_text = (
        f"the {name} sketch of {products} products holds {columns:,} × {n_params:,} values "
        f"({size_text(held)} in {str(dtype).replace('torch.', '')}) besides the products"
    )
    if method == "hutchpp":
        kept = sketch_limit(method, n_params, dtype, budget, free) or 1
        element = torch.empty((), dtype=dtype).element_size()
        limit = (
            f"the free memory ({size_text(free or 0)})"
            if over_free and (free or 0) < budget
            else f"the {'' if explicit else 'default '}memory budget of {size_text(budget)}"
        )
        return (
            f"{held_text.replace(' holds ', ' would hold ')}, more than {limit}: it holds "
            f"{kept:,} column{'s' if kept > 1 else ''} ({size_text(kept * n_params * element)}) and "
            "the products it does not take are Hutchinson probes of the deflated rest (a larger "
            f"{setting_name('memory_budget')} gives the sketch more columns and the trace a smaller error)"
        )
    limit_bytes = min(budget, free) if free is not None and over_free else budget
    most = limit_bytes // (n_params * torch.empty((), dtype=dtype).element_size())
    spare = settings.probes - products  # taken by a split trace's exact part
    probes, params = setting_name("probes"), setting_name("params")
    fewer = (
        f"{probes} {2 * most + 1 + spare} or fewer" if most >= 2 else f"fewer parameters ({params})"
    )
    advice = (
        f"use {fewer}, {setting_name('trace_method')} hutchpp or hutchinson, or a larger "
        f"{setting_name('memory_budget')}"
    )
    if over_free:
        raise SettingsError(
            "probes",
            f"{held_text}, more than the free memory ({size_text(free or 0)})",
            advice,
        )
    if explicit:
        raise SettingsError(
            "memory_budget",
            f"{held_text}, more than the memory budget of {size_text(budget)}",
            advice,
        )
    return (
        f"{held_text}, more than the default memory budget of {size_text(budget)} (which bounds "
        f"the products); to stay within it, {advice}"
    )
