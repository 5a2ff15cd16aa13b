"""How long a Hessian analysis will take, forecast from its first products, and what to do about it.

The forecast is (products planned) × (seconds per product), the second measured from the
first progress report of the run until five products are done (so it excludes loading, the memory measurement and the
loss pass; a warm start's products, over a sample of the data, are not timed). Products planned, for :class:`~curvcal.curvature.analysis.HessianSettings`:

* warm start (``warm_start``): as many as the eigenvalues' Lanczos, on a sample of the data;
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
of hours could be a run of minutes with other options. The progress count follows the run
(:class:`StagePlan`): a stage that ended replaces its planned count by the products it made,
and while an eigenvalue stage is still to finish its count is said to be typical, so the time
left is a range (:class:`curvcal.pace.Pace`).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable

from torch import nn

from curvcal.curvature.plan import selected_parameter_count
from curvcal.curvature.progress import WARM_STAGE
from curvcal.pace import duration_text
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


def planned_by_stage(settings: HessianSettings, n_params: int, n_blocks: int = 0) -> dict[str, int]:
    """The products a run of ``settings`` typically makes in each stage (``warm start``,
    ``eigenvalues``, ``smallest``, ``trace``, ``density``, ``layers``; stages that run no
    product left out) on a
    Hessian of ``n_params`` rows with ``n_blocks`` module blocks (the counts of this module's
    docstring)."""
    method = settings.method or "lanczos"
    stages = {}
    if settings.warm_start is not None:  # Lanczos on a sample, before the full run
        stages[WARM_STAGE] = _eigen_products(settings.top_k, "lanczos", settings.max_iter, n_params)
    stages["eigenvalues"] = _eigen_products(settings.top_k, method, settings.max_iter, n_params)
    if settings.smallest:
        stages["smallest"] = _eigen_products(1, "lanczos", settings.max_iter, n_params)
    if settings.trace and settings.trace_method != "gauss-newton":  # it makes no product
        stages["trace"] = settings.probes  # auto: the most, when it falls back to Hutch++
    if settings.density:
        stages["density"] = settings.density_runs * settings.density_steps
    if settings.per_layer:
        stages["layers"] = n_blocks * (_TYPICAL_POWER_ITERATIONS + settings.probes)
    return stages


#: the stages whose planned count is typical, not known (they run first, in this order)
TYPICAL_STAGES = (WARM_STAGE, "eigenvalues", "smallest")


def _stage_of(progress_stage: str) -> str:
    """The plan's stage of a progress report's stage name (the Gauss–Newton trace names its
    batches: ``Gauss–Newton trace, batch 3``)."""
    return "trace" if progress_stage.startswith("Gauss–Newton") else progress_stage


class StagePlan:
    """The products planned for a run (:func:`planned_by_stage`), revised as it goes: a stage
    that has ended counts the products it made. Fed the progress reports (stage, products so
    far) in order."""

    def __init__(self, plan: dict[str, int], method: str) -> None:
        self.plan = plan
        self.method = method
        self.made: dict[str, int] = {}  # stages ended: products made
        self._stage: str | None = None
        self._start = 0
        self._last = 0

    def replan(self, plan: dict[str, int], method: str) -> None:
        self.plan, self.method = plan, method

    def seen(self, stage: str, products: int) -> None:
        key = _stage_of(stage)
        if key != self._stage:
            if self._stage is not None:
                self.made[self._stage] = self._last - self._start
            self._stage, self._start = key, self._last
        self._last = products

    def total(self) -> int:
        """Products made in the stages that ended and planned for the others."""
        return sum(self.made.values()) + sum(
            count for stage, count in self.plan.items() if stage not in self.made
        )

    def typical(self) -> tuple[int, bool, int]:
        """How many of :meth:`total`'s products, counted from the first, are up to a stage
        whose count is typical that has not ended, whether that count is bounded (not for
        power iteration, whose rate |λ2/λ1| is unknown), and the products up to the end of
        the stage running (those after it are of stages not yet begun)."""
        ended = sum(self.made.values())
        current = self._stage if self._stage is not None else next(iter(self.plan), None)
        stage_end = ended + self.plan.get(current, 0) if current is not None else ended
        open_stages = [s for s in TYPICAL_STAGES if s in self.plan and s not in self.made]
        if not open_stages:
            return 0, True, stage_end
        bounded = not ("eigenvalues" in open_stages and self.method == "power")
        return ended + sum(self.plan[s] for s in open_stages), bounded, stage_end


def planned_products(settings: HessianSettings, n_params: int, n_blocks: int = 0) -> int:
    """The products a run of ``settings`` typically makes: the sum of
    :func:`planned_by_stage`."""
    return sum(planned_by_stage(settings, n_params, n_blocks).values())


def _hints(
    plan: dict[str, int], settings: HessianSettings | None, given: frozenset[str], device: str
) -> list[str]:
    """What would shorten the run, the stages that cost most first; nothing already given."""
    total = max(sum(plan.values()), 1)
    hints: list[tuple[int, str]] = []
    if "layers" in plan:
        hints.append(
            (
                plan["layers"],
                f"--per-layer costs {plan['layers']} products (leave it out, or narrow it with --params)",
            )
        )
    if "density" in plan and settings is not None:
        hints.append(
            (
                plan["density"],
                f"--density costs {plan['density']} products ({settings.density_runs} runs × {settings.density_steps} steps: fewer with --density-runs, --density-steps)",
            )
        )
    if "trace" in plan and (settings is None or settings.probes > 20):
        hints.append(
            (
                plan["trace"],
                f"the trace costs {plan['trace']} products (--probes 20 for a rougher one, or --no-trace)",
            )
        )
    if "smallest" in plan:
        hints.append((plan["smallest"], f"--smallest costs {plan['smallest']} products"))
    if settings is not None and settings.top_k > 1:
        hints.append(
            (
                plan.get("eigenvalues", 0),
                f"--top-k {settings.top_k} costs {plan.get('eigenvalues', 0)} products (--top-k 1 for λmax alone)",
            )
        )
    named = [text for cost, text in sorted(hints, key=lambda pair: -pair[0]) if cost * 10 >= total]
    general = []
    if settings is None or not settings.params:
        general.append("--params 'PATTERN' (the block of some layers)")
    if "--max-samples" not in given:
        general.append("--max-samples N (fewer samples)")
    if settings is None or settings.tol < 1e-3:
        general.append("--tol 1e-3 (looser eigenvalues)")
    if settings is None and "--probes" not in given:
        general.append("--probes 20 (a rougher trace)")
    if device == "cpu":
        general.append("a GPU (--device cuda)")
    if general:
        named.append("to trade accuracy for time: " + ", ".join(general))
    return named


def slow_run_advice(
    seconds_per_product: float,
    planned: int | dict[str, int],
    threshold: float = SLOW_RUN_SECONDS,
    *,
    settings: HessianSettings | None = None,
    given: frozenset[str] = frozenset(),
    device: str = "cpu",
) -> str | None:
    """The note for a run forecast at ``planned`` × ``seconds_per_product`` seconds, or None
    when that is at most ``threshold`` seconds. ``planned`` by stage (:func:`planned_by_stage`)
    lets the note name the stages that cost most, the options behind them first; options
    already in ``settings`` or ``given`` (``--max-samples``) and a GPU already used are not
    suggested again."""
    plan = planned if isinstance(planned, dict) else {"products": planned}
    count = sum(plan.values())
    total = count * seconds_per_product
    if not total > threshold:
        return None
    hints = _hints(plan, settings, given, device)
    return (
        f"this run will take about {duration_text(total)} (about {count} Hessian-vector products "
        f"of {seconds_per_product:.3g} s each)" + "".join(f"; {hint}" for hint in hints)
    )


#: products timed before the note is said (the first product, which warms caches and
#: kernels, is not counted: the pace is measured over the next ones)
FORECAST_PRODUCTS = 5


def forecast_hook(
    planned: int | Callable[[], int | dict[str, int]],
    notify: Callable[[str], None],
    *,
    threshold: float = SLOW_RUN_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
    advise: Callable[[float, int | dict[str, int]], str | None] | None = None,
) -> Callable[[str, int], None]:
    """A progress hook (stage, products so far) that times the products from its first call
    outside the warm stage (whose products are over a sample of the data) until
    :data:`FORECAST_PRODUCTS` more are done and, when :func:`slow_run_advice` (or ``advise``)
    has something to say, passes it to ``notify`` once. ``planned`` may be a callable, read at
    that moment (the plan can change once the run has chosen its trace method)."""
    first: list[tuple[float, int]] = []
    done = [False]
    untimed = [0]  # the warm stage's products: each over a sample, a fraction of a full one

    def on_step(stage: str, matvecs: int) -> None:
        if stage == WARM_STAGE:
            untimed[0] = matvecs
        if done[0] or stage == WARM_STAGE:
            return
        now = clock()
        if not first:
            first.append((now, matvecs))
            return
        then, before = first[0]
        if matvecs <= before or matvecs - untimed[0] < FORECAST_PRODUCTS:
            return
        done[0] = True
        count = planned() if callable(planned) else planned
        per_product = (now - then) / (matvecs - before)
        if advise is not None:
            advice = advise(per_product, count)
        else:
            advice = slow_run_advice(per_product, count, threshold)
        if advice is not None:
            notify(advice)

    return on_step


def forecast_for(
    model: nn.Module,
    settings: HessianSettings,
    notify: Callable[[str], None],
    given: frozenset[str] = frozenset(),
) -> tuple[
    Callable[[str, int], None],
    Callable[[HessianSettings], None],
    Callable[[], int],
    Callable[[], tuple[int, bool, int]],
]:
    """:func:`forecast_hook` for ``settings`` on ``model`` (P and the module blocks counted
    from its trainable parameters selected by ``settings.params``), a function that plans
    again from the settings the run resolved (``--trace-method auto`` become ``gauss-newton``,
    which makes no product, or ``hutchpp``): the analysis's ``on_plan``, the products
    planned now (the progress total, revised as stages end: :class:`StagePlan`), and the
    typical part of that total (:meth:`StagePlan.typical`). ``given``: options the user gave
    that the advice must not suggest again (``--max-samples``)."""
    n_params = selected_parameter_count(model, settings.params)
    owners = {
        name.rpartition(".")[0]
        for name, p in model.named_parameters()
        if p.requires_grad
        and (not settings.params or any(fnmatch.fnmatchcase(name, g) for g in settings.params))
    }
    device = next((p.device.type for p in model.parameters()), "cpu")
    plan = [planned_by_stage(settings, n_params, len(owners))]
    resolved = [settings]
    stages = StagePlan(plan[0], settings.method or "lanczos")

    def replan(new: HessianSettings) -> None:
        resolved[0] = new
        plan[0] = planned_by_stage(new, n_params, len(owners))
        stages.replan(plan[0], new.method or "lanczos")

    def advise(per_product: float, count: int | dict[str, int]) -> str | None:
        return slow_run_advice(
            per_product, count, SLOW_RUN_SECONDS, settings=resolved[0], given=given, device=device
        )

    advice = forecast_hook(lambda: plan[0], notify, advise=advise)

    def hook(stage: str, products: int) -> None:
        stages.seen(stage, products)
        advice(stage, products)

    return hook, replan, stages.total, stages.typical
