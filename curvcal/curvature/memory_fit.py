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

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from curvcal.curvature.kept import chunk_rows, kept_bytes, kept_pass_bytes, kept_prefix
from curvcal.curvature.memory import GraphSizes, PassPlan, default_budget, plan_pass
from curvcal.settings.sizes import MemoryBudget


@dataclass(frozen=True)
class MemoryFit:
    """What the budget decided: ``plan`` the pass (``plan.budget`` the bytes), ``width`` the
    vectors per pass, ``limit`` the rows per chunk when batches are split (else None);
    ``keep`` whether gradient graphs are kept, ``kept_chunks`` how many leading chunks they
    cover (None: all), ``kept_estimate`` and ``kept_need`` the predicted bytes of the kept
    graphs and of those with a one-vector product through them (None when never kept)."""

    plan: PassPlan
    width: int
    limit: int | None
    keep: bool = False
    kept_chunks: int | None = None
    kept_estimate: int | None = None
    kept_need: int | None = None


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
) -> MemoryFit:
    """The pass, then the kept graphs, for batches of ``batch_sizes`` rows (``rows`` the most
    one holds now) and parameters of ``param_bytes``, at most ``width`` vectors per pass.

    ``requested`` is the ``memory_budget`` option (None: the default budget), ``free`` the free
    bytes of the device; ``vmapped`` says the pass runs forward-over-reverse; ``keep_graphs`` is
    ``"never"``, ``"auto"`` or ``"always"`` (the caller says ``"never"`` where graphs cannot be
    kept); ``input_row_bytes`` is what one input row costs the kept graphs (0 when batches are
    cached, since the cache holds them anyway)."""
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
    width = width if sharded else plan.width
    limit = plan.rows if plan.rows < rows else None
    fit = MemoryFit(plan=plan, width=width, limit=limit)
    if keep_graphs == "never":
        return fit
    chunks = chunk_rows(batch_sizes, limit)
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
