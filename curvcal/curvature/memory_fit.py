"""An operator's passes fitted in its memory budget, from the graphs measured on its first batch.

Two decisions, in this order, both from the graph sizes of :func:`~curvcal.curvature.memory.measure_graph`:

1. the pass (:func:`~curvcal.curvature.memory.plan_pass`): the most rows per chunk (batches split
   when one alone does not fit) and, at that size, the most vectors per pass, at most the
   requested ``width``, in the budget (``memory_budget`` resolved against the free memory, or
   :func:`~curvcal.curvature.memory.default_budget`);
2. the kept gradient graphs (:mod:`curvcal.curvature.kept`): with ``keep_graphs="always"`` kept
   whatever they cost; with ``"auto"`` those of as many leading chunks as fit beside a pass of
   products through them (:func:`~curvcal.curvature.kept.kept_prefix`), the vectors per pass then
   coming from that fit.

Under a sharded run (``sharded=True``) every process must run the same passes: one vector per
pass is planned and kept, and graphs are kept for all chunks or none. Nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from curvcal.curvature.kept import chunk_rows, kept_bytes, kept_pass_bytes, kept_prefix
from curvcal.curvature.memory import (
    GraphSizes,
    PassPlan,
    budget_source,
    default_budget,
    pass_bytes,
    plan_pass,
    size_text,
)
from curvcal.settings.sizes import MemoryBudget


@dataclass(frozen=True)
class MemoryChoice:
    """What the plan chose and why, in the units a reader checks it in (the JSON's
    ``results.operator.memory_plan``): the budget in bytes and where it came from, the measured
    cost per sample (bytes autograd saves per row for a double backward and for a gradient
    pass, on the first batch), the rows per chunk and whether batches are split, the vectors
    per pass, and the gradient graphs: ``kept``, ``partly kept`` or ``rebuilt``, and why."""

    budget_bytes: int
    budget_source: str
    free_bytes: int | None
    sample_bytes: float
    gradient_sample_bytes: float
    pass_rows: int
    micro_batched: bool
    rows_why: str
    vectors_per_pass: int
    graphs: str
    graphs_why: str
    kept_bytes: int | None

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MemoryFit:
    """What the budget decided: ``plan`` the pass (``plan.budget`` the bytes), ``width`` the
    vectors per pass, ``limit`` the rows per chunk when batches are split (else None);
    ``keep`` whether gradient graphs are kept, ``kept_chunks`` how many leading chunks they
    cover (None: all), ``kept_estimate`` and ``kept_need`` the predicted bytes of the kept
    graphs and of those with a one-vector product through them (None when never kept);
    ``choice`` the same in words, with the reasons."""

    plan: PassPlan
    width: int
    limit: int | None
    keep: bool = False
    kept_chunks: int | None = None
    kept_estimate: int | None = None
    kept_need: int | None = None
    choice: MemoryChoice | None = None


def fit_memory(
    graphs: GraphSizes,
    *,
    param_bytes: int,
    batch_sizes: Sequence[int],
    rows: int,
    width: int,
    requested: MemoryBudget | None,
    free: int | None,
    vmapped: bool,
    sharded: bool,
    keep_graphs: str,
    input_row_bytes: float,
    device: torch.device | None = None,
    unkeepable: str = "",
) -> MemoryFit:
    """The pass, then the kept graphs, for batches of ``batch_sizes`` rows (``rows`` the most
    one holds now) and parameters of ``param_bytes``, at most ``width`` vectors per pass.

    ``requested`` is the ``memory_budget`` option (None: the default budget), ``free`` the free
    bytes of the device (``device``, named in the record; default the CPU); ``vmapped`` says
    the pass runs forward-over-reverse; ``keep_graphs`` is ``"never"``, ``"auto"`` or
    ``"always"`` (the caller says ``"never"`` where graphs cannot be kept, and why in
    ``unkeepable``); ``input_row_bytes`` is what one input row costs the kept graphs (0 when
    batches are cached, since the cache holds them anyway)."""
    budget = requested.resolve(free) if requested is not None else None
    if budget is None:
        budget = default_budget(graphs, param_bytes, rows, free)
    plan = plan_pass(
        graphs,
        param_bytes=param_bytes,
        rows=rows,
        width=1 if sharded else width,
        budget=budget,
        vmapped=vmapped,
    )
    limit = plan.rows if plan.rows < rows else None
    fit = MemoryFit(plan=plan, width=width if sharded else plan.width, limit=limit)
    if keep_graphs != "never":
        chunks = chunk_rows(batch_sizes, limit)
        fit = _kept_graphs(fit, graphs, param_bytes, chunks, input_row_bytes, sharded, keep_graphs)
    return replace(
        fit,
        choice=_choice(
            fit,
            graphs,
            param_bytes=param_bytes,
            rows=rows,
            n_rows=sum(batch_sizes),
            source=budget_source(requested, free, device or torch.device("cpu")),
            free=free,
            keep_graphs=keep_graphs,
            unkeepable=unkeepable,
            vmapped=vmapped,
            sharded=sharded,
        ),
    )


def _kept_graphs(
    fit: MemoryFit,
    graphs: GraphSizes,
    param_bytes: int,
    chunks: list[int],
    input_row_bytes: float,
    sharded: bool,
    keep_graphs: str,
) -> MemoryFit:
    """``fit`` with the gradient graphs of ``chunks`` kept (``keep_graphs`` ``"always"``, or
    ``"auto"``: the leading chunks whose graphs fit the budget with the pass), the predicted
    bytes recorded either way."""
    width, budget = fit.width, fit.plan.budget
    held = kept_bytes(graphs, param_bytes, chunks, input_row_bytes)
    fit = replace(
        fit,
        kept_estimate=math.ceil(held),
        kept_need=math.ceil(held + kept_pass_bytes(graphs, param_bytes, max(chunks), 1)),
    )
    if keep_graphs == "always":
        return replace(fit, keep=True)
    kept, kept_width = kept_prefix(
        graphs,
        param_bytes=param_bytes,
        chunks=chunks,
        input_row_bytes=input_row_bytes,
        width=width,
        budget=budget,
        # ranks hold different chunk counts: each would keep a different share (exact all the
        # same, but not the same passes), so sharded runs keep all or nothing
        partial=not sharded,
    )
    if kept == 0:
        return fit
    return replace(
        fit,
        keep=True,
        kept_chunks=None if kept == len(chunks) else kept,
        width=width if sharded else kept_width,
    )


def _choice(
    fit: MemoryFit,
    graphs: GraphSizes,
    *,
    param_bytes: int,
    rows: int,
    n_rows: int,
    source: str,
    free: int | None,
    keep_graphs: str,
    unkeepable: str,
    vmapped: bool,
    sharded: bool,
) -> MemoryChoice:
    """:class:`MemoryChoice` of ``fit``: the numbers it was made from and the reasons."""
    plan = fit.plan
    budget = size_text(plan.budget)
    whole = pass_bytes(graphs, param_bytes, rows, 1, vmapped)
    per_row = size_text(graphs.double.per_row)
    if fit.limit is None:
        rows_why = (
            f"a pass over a whole batch of {rows} rows ({size_text(whole)} at "
            f"{per_row} a row) fits the budget of {budget}"
        )
    elif plan.fits:
        rows_why = (
            f"a pass over a whole batch of {rows} rows needs {size_text(whole)} at {per_row} a "
            f"row, more than the budget of {budget}: chunks of {plan.rows} rows"
        )
    else:
        rows_why = (
            f"not even one row fits the budget of {budget} ({size_text(plan.estimate)} needed): "
            "one row at a time, and the device may run out of memory"
        )
    need = size_text(fit.kept_need or 0)
    if keep_graphs == "never":
        graphs_state = "rebuilt"
        graphs_why = unkeepable or "keep_graphs never"
    elif keep_graphs == "always":
        graphs_state, graphs_why = "kept", "keep_graphs always, whatever the budget"
    elif not fit.keep:
        graphs_state = "rebuilt"
        held = (
            "not all of them (a sharded run keeps all or none)"
            if sharded
            else "not even the first chunk's beside a pass"
        )
        graphs_why = (
            f"the graphs of all {n_rows} samples with a product through them need {need}; "
            f"the budget of {budget} holds {held}"
        )
    elif fit.kept_chunks is None:
        graphs_state = "kept"
        graphs_why = (
            f"the graphs of all {n_rows} samples with a product through them ({need}) fit "
            f"the budget of {budget}"
        )
    else:
        graphs_state = "partly kept"
        graphs_why = (
            f"the graphs of all {n_rows} samples need {need}, more than the budget of "
            f"{budget}: those of the first {fit.kept_chunks} chunks are kept and the others "
            "rebuilt for every product"
        )
    return MemoryChoice(
        budget_bytes=plan.budget,
        budget_source=source,
        free_bytes=free,
        sample_bytes=graphs.double.per_row,
        gradient_sample_bytes=graphs.gradient.per_row,
        pass_rows=plan.rows,
        micro_batched=fit.limit is not None,
        rows_why=rows_why,
        vectors_per_pass=fit.width,
        graphs=graphs_state,
        graphs_why=graphs_why,
        kept_bytes=fit.kept_estimate if fit.keep else None,
    )
