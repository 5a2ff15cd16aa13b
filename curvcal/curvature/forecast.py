"""How long a Hessian analysis will take, forecast from its first products, and what to do about it.

The forecast is (products planned) × (seconds per product), the second measured between the
first two progress reports of the run (so it excludes loading, the memory measurement and the
loss pass). Products planned, for :class:`~curvcal.curvature.analysis.HessianSettings`:

* eigenvalues, Lanczos (the default): 10 + 3k steps and k residual checks, at most the step
  budget (``max_iter``, or P); power iteration: 20 iterations per value, at most ``max_iter``;
  ``smallest`` adds one Lanczos run for k = 1;
* trace: ``probes`` products (the most an adaptive run draws, and what ``auto`` spends when it
  falls back to Hutch++; the split trace spends C − 1 fewer); none for the Gauss–Newton trace,
  which makes no product;
* density: ``density_runs`` × ``density_steps``;
* per layer: for each of ``n_blocks`` module blocks, 20 power iterations and ``probes`` probes.

The eigenvalue counts are typical, not bounds (a Krylov method on a decaying spectrum needs
10–20 steps for λ1 to 1e-4), so the forecast is an order of magnitude: enough to say that a run
of hours could be a run of minutes with other options.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable

from torch import nn

from curvcal.curvature.plan import selected_parameter_count
from curvcal.settings.hessian import HessianSettings

#: forecasts above this many seconds get the advice
SLOW_RUN_SECONDS = 60.0
_TYPICAL_POWER_ITERATIONS = 20
_TYPICAL_LANCZOS_BASE = 10


def _eigen_products(k: int, method: str, max_iter: int | None, n_params: int) -> int:
    if method == "power":
        per_value = _TYPICAL_POWER_ITERATIONS
        if max_iter is not None:
            per_value = min(per_value, max_iter)
        return k * per_value
    steps = _TYPICAL_LANCZOS_BASE + 3 * k
    allowed = n_params if max_iter is None else min(n_params, max(max_iter, k))
    return min(steps, allowed) + k


def planned_products(settings: HessianSettings, n_params: int, n_blocks: int = 0) -> int:
    """The products a run of ``settings`` typically makes on a Hessian of ``n_params`` rows,
    ``n_blocks`` module blocks with ``per_layer`` (the counts of this module's docstring)."""
    method = settings.method or "lanczos"
    total = _eigen_products(settings.top_k, method, settings.max_iter, n_params)
    if settings.smallest:
        total += _eigen_products(1, settings.method or "lanczos", settings.max_iter, n_params)
    if settings.trace and settings.trace_method != "gauss-newton":  # it makes no product
        total += settings.probes  # auto: the most, when it falls back to Hutch++
    if settings.density:
        total += settings.density_runs * settings.density_steps
    if settings.per_layer:
        total += n_blocks * (_TYPICAL_POWER_ITERATIONS + settings.probes)
    return total


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def slow_run_advice(
    seconds_per_product: float, planned: int, threshold: float = SLOW_RUN_SECONDS
) -> str | None:
    """The note for a run forecast at ``planned`` × ``seconds_per_product`` seconds, or None
    when that is at most ``threshold`` seconds."""
    total = planned * seconds_per_product
    if not total > threshold:
        return None
    return (
        f"this run will take about {_duration(total)} (about {planned} Hessian-vector products "
        f"of {seconds_per_product:.3g} s each); to trade accuracy for time: --params 'PATTERN' "
        "(the block of some layers), --max-samples N (fewer samples), --tol 1e-3 (looser "
        "eigenvalues), --probes 20 (a rougher trace), or a GPU (--device cuda)"
    )


def forecast_hook(
    planned: int | Callable[[], int],
    notify: Callable[[str], None],
    *,
    threshold: float = SLOW_RUN_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[str, int], None]:
    """A progress hook (stage, products so far) that times the products between its first two
    calls and, when :func:`slow_run_advice` has something to say, passes it to ``notify`` once.
    ``planned`` may be a callable, read at that moment (the plan can change once the run has
    chosen its trace method)."""
    first: list[tuple[float, int]] = []
    done = [False]

    def on_step(_stage: str, matvecs: int) -> None:
        if done[0]:
            return
        now = clock()
        if not first:
            first.append((now, matvecs))
            return
        then, before = first[0]
        if matvecs <= before:
            return
        done[0] = True
        count = planned() if callable(planned) else planned
        advice = slow_run_advice((now - then) / (matvecs - before), count, threshold)
        if advice is not None:
            notify(advice)

    return on_step


def forecast_for(
    model: nn.Module, settings: HessianSettings, notify: Callable[[str], None]
) -> tuple[Callable[[str, int], None], Callable[[HessianSettings], None]]:
    """:func:`forecast_hook` for ``settings`` on ``model`` (P and the module blocks counted
    from its trainable parameters selected by ``settings.params``), and a function that plans
    again from the settings the run resolved (``--trace-method auto`` become ``gauss-newton``,
    which makes no product, or ``hutchpp``): the analysis's ``on_plan``."""
    n_params = selected_parameter_count(model, settings.params)
    owners = {
        name.rpartition(".")[0]
        for name, p in model.named_parameters()
        if p.requires_grad
        and (not settings.params or any(fnmatch.fnmatchcase(name, g) for g in settings.params))
    }
    planned = [planned_products(settings, n_params, len(owners))]

    def replan(resolved: HessianSettings) -> None:
        planned[0] = planned_products(resolved, n_params, len(owners))

    return forecast_hook(lambda: planned[0], notify, threshold=SLOW_RUN_SECONDS), replan
