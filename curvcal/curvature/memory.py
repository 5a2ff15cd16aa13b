"""How much memory a pass of Hessian-vector products may use, and the pass that fits in it.

A product pass over one batch of r rows holds the autograd graph of a double backward — the
tensors the forward saves for the backward, plus those the first backward saves when it builds
the graph of the gradient (``create_graph=True``) — and, per vector in flight, its pieces: the
tangent, the batch product and the running total, 3·P values. So, in bytes, for m vectors::

    double backward (autograd):          G(r) + P·s·(1 + 3m)
    forward-over-reverse (func, vmap):   m·G(r) + P·s·(1 + 3m)

with G(r) = G₀ + g·r the graph's size, s the bytes of one value and P·s for the gradient itself.
:func:`measure_graph` measures G₀ and g — and the same for a plain gradient pass, F(r) = F₀ + f·r
— by adding up the tensors autograd saves (``saved_tensors_hooks``) on two slices of the first
batch (at most 8 rows): one exact count of the activations, on any device, in a few
milliseconds. :func:`plan_pass` then takes the largest batch chunk r (micro-batching inside a
data batch when one batch alone does not fit) and, at that r, the most vectors m that fit in the
budget. The budget (:func:`default_budget`) is a share of what the device has free when the plan
is made — half of ``torch.cuda.mem_get_info``'s free bytes and the caching allocator's unused
ones on CUDA, of ``MemAvailable`` of ``/proc/meminfo`` on the CPU (the model, its cached batches
and anything else already held are not free) — so a pass that fits is never split: the rows per chunk follow from the measured
per-row cost g alone. Only when the free memory cannot be read does a fixed rule stand in: the
larger of twice a plain gradient pass at the same batch size and 256 MiB. ``memory_budget``
overrides it with bytes or a share of the free memory (:func:`parse_memory_budget`);
:func:`budget_source` says in words where the budget came from.

Splitting a batch is exact (products are sums over samples); only the time changes.

Lanczos' Krylov basis is held beside the products, one vector of P values per step (float32
for float32 products, with three float64 vectors: the work vector and the two latest rows
widened; float64 otherwise):
:func:`lanczos_basis` bounds it by the same budget (it restarts within the bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from curvcal import rows as rows_of
from curvcal.curvature.krylov import WIDE_VECTORS, basis_storage
from curvcal.rows import Inputs
from curvcal.settings.sizes import MemoryBudget, host_memory

Returned = TypeVar("Returned")

#: the share of the free memory the default budget takes (the rest is room for what the
#: algorithms hold beside the products, and for the allocator's slack)
FREE_FRACTION = 0.5
#: without a free-memory reading: the floor of the default budget, and its multiple of a plain
#: gradient pass at the same batch size
MIN_DEFAULT_BUDGET = 256 * 2**20
GRADIENT_MULTIPLE = 2.0
#: rows of the first batch the measurement runs on (its larger slice)
MEASURE_ROWS = 8

#: Lanczos' basis is never bounded below 2k + this many vectors (see :func:`lanczos_basis`)
BASIS_FLOOR = 6


def free_memory_name(device: torch.device) -> str:
    """What :func:`free_memory` reads on ``device``, in words."""
    if device.type == "cuda":
        return "free CUDA memory (torch.cuda.mem_get_info and the allocator's unused cache)"
    return "available host memory (MemAvailable)"


def free_memory(device: torch.device) -> int | None:
    """Bytes the process may still take: on CUDA the device's free memory plus what torch's
    caching allocator holds reserved but unused (free to this process, not to the driver's
    count); ``MemAvailable`` on a Linux host (the free pages by ``os.sysconf`` elsewhere);
    ``None`` when neither can be read."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free) + max(0, int(cached))
    return host_memory("SC_AVPHYS_PAGES")


@dataclass(frozen=True)
class GraphSize:
    """Bytes autograd saves over a batch of r rows: ``fixed + per_row·r``."""

    fixed: float
    per_row: float

    def at(self, rows: int) -> float:
        return self.fixed + self.per_row * rows


@dataclass(frozen=True)
class GraphSizes:
    """The graphs of a plain gradient pass (``gradient``) and of a double backward (``double``)."""

    gradient: GraphSize
    double: GraphSize


def _saved_bytes(
    forward: Callable[[], Tensor], backward: Callable[[Tensor], Returned], excluded: set[int]
) -> tuple[int, int, Returned]:
    """Bytes of the distinct tensors autograd saves while ``forward`` runs, and while it and
    then ``backward`` of its result run, leaving out those that share storage with ``excluded``
    (the parameters and the input batch, which exist anyway); and what ``backward`` returned."""
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    total = 0

    def pack(tensor: Tensor) -> Tensor:
        nonlocal total
        try:
            pointer = tensor.untyped_storage().data_ptr()
            key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        except (RuntimeError, NotImplementedError):  # tensors without storage: nothing to count
            return tensor
        if pointer not in excluded and key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpacked):
        result = forward()
        after_forward = total
        returned = backward(result)
    return after_forward, total, returned


def _unpacked(tensor: Tensor) -> Tensor:
    """The saved tensor as it was saved (the pack hook only counts it): a graph built under the
    measurement may be kept and differentiated again (:class:`GraphProbe`)."""
    return tensor


@dataclass(frozen=True)
class GraphProbe:
    """What :func:`probe_graph` measured: the graph sizes, the rows of its larger slice, and —
    when asked for and that slice is the whole batch — the slice's gradient with its graph
    (``create_graph=True``: the first backward of a double backward, one piece per parameter,
    ``None`` where the loss does not depend on it), which the kept graphs take over as their
    first batch's (:mod:`curvcal.curvature.kept`) rather than build it again."""

    sizes: GraphSizes
    rows: int
    gradient: tuple[Tensor | None, ...] | None


def measure_graph(
    batch_loss: Callable[[Inputs, Tensor], Tensor],
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
) -> GraphSizes:
    """The graph sizes of a gradient pass and of a double backward of ``batch_loss(x, y)``:
    :func:`probe_graph`'s, its graphs freed."""
    return probe_graph(batch_loss, params, x, y).sizes


def probe_graph(
    batch_loss: Callable[[Inputs, Tensor], Tensor],
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
    *,
    keep_whole: bool = False,
) -> GraphProbe:
    """The graph sizes of a gradient pass and of a double backward of ``batch_loss(x, y)`` (Σ
    over the rows), fitted as fixed + per-row bytes from slices of 4 and 8 rows of the batch
    (fewer when it has fewer; one slice of 1 row gives per-row bytes only). Run it inside the
    model's prepared state: it calls the model on those rows. ``x`` is a tensor or a mapping
    of tensors (text: token ids and masks), sliced by rows alike; the inputs themselves are
    not counted as graph memory.

    One double backward per slice measures both: a gradient pass's graph is what the forward
    saves (its backward, without ``create_graph``, saves nothing), and the double backward's is
    that plus what the first backward saves as it builds the gradient's graph. (Two passes per
    slice, a gradient and a double backward, once cost 3.1 s of a 40 s λmax run on the 13.5 M
    Llama-style benchmark model.) The smaller slice runs first, so at most one slice's graph is
    alive at a time; with ``keep_whole``, when the larger slice is the whole batch (a batch of
    at most 8 rows), its gradient and graph are returned rather than freed (on that
    benchmark model the whole first batch: 0.3–0.5 s of forward and first backward that a kept
    graph would otherwise build again)."""
    rows = int(y.shape[0])
    large = min(rows, MEASURE_ROWS)
    small = max(1, large // 2)
    excluded = {p.untyped_storage().data_ptr() for p in params}
    excluded.update(t.untyped_storage().data_ptr() for t in rows_of.tensors(x))

    def sizes(r: int) -> tuple[int, int, tuple[Tensor | None, ...]]:
        xs, ys = rows_of.take_rows(x, slice(0, r)), y[:r]

        def forward() -> Tensor:
            with torch.enable_grad():
                return batch_loss(xs, ys)

        def backward(loss: Tensor) -> tuple[Tensor | None, ...]:
            with torch.enable_grad():
                return torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)

        return _saved_bytes(forward, backward, excluded)

    little = sizes(small)[:2] if small != large else None
    measured = sizes(large)
    big = measured[:2]
    kept = measured[2] if keep_whole and large == rows else None
    del measured
    if little is None:
        graphs = GraphSizes(GraphSize(0.0, big[0] / large), GraphSize(0.0, big[1] / large))
        return GraphProbe(graphs, large, kept)

    def fit(index: int) -> GraphSize:
        per_row = max(0.0, (big[index] - little[index]) / (large - small))
        return GraphSize(max(0.0, big[index] - per_row * large), per_row)

    return GraphProbe(GraphSizes(fit(0), fit(1)), large, kept)


@dataclass(frozen=True)
class PassPlan:
    """What a pass does: ``rows`` per chunk of a batch, ``width`` vectors at once, the bytes the
    model predicts (``estimate``) against ``budget``, and whether even 1 row × 1 vector fits."""

    rows: int
    width: int
    estimate: int
    budget: int
    fits: bool


def pass_bytes(graphs: GraphSizes, param_bytes: int, rows: int, width: int, vmapped: bool) -> float:
    """Predicted bytes of a pass of ``width`` vectors over chunks of ``rows`` rows (the formula
    of this module's docstring); ``vmapped`` for forward-over-reverse."""
    copies = width if vmapped else 1
    return copies * graphs.double.at(rows) + param_bytes * (1 + 3 * width)


def gradient_bytes(graphs: GraphSizes, param_bytes: int, rows: int) -> float:
    """Predicted bytes of a plain gradient pass over ``rows`` rows: its graph and the gradient."""
    return graphs.gradient.at(rows) + param_bytes


def default_budget(graphs: GraphSizes, param_bytes: int, rows: int, free: int | None) -> int:
    """:data:`FREE_FRACTION` of the ``free`` bytes; when those are unknown (None),
    max(2 × a gradient pass at ``rows`` rows, 256 MiB)."""
    if free is not None:
        return int(FREE_FRACTION * free)
    return int(
        max(GRADIENT_MULTIPLE * gradient_bytes(graphs, param_bytes, rows), MIN_DEFAULT_BUDGET)
    )


def budget_source(requested: MemoryBudget | None, free: int | None, device: torch.device) -> str:
    """Where the budget of a plan came from, in words: the ``memory_budget`` the user gave
    (``requested``), or the default of :func:`default_budget` on ``device`` with ``free`` bytes
    free."""
    where = free_memory_name(device)
    if requested is not None:
        if requested.bytes is not None:
            return f"memory_budget {size_text(requested.bytes)}, as given"
        share = f"{100 * (requested.fraction or 0.0):g}%"
        if free is None:
            return (
                f"memory_budget {share} asked, but the {where} is unreadable here: twice a "
                "gradient pass at the batch size or 256 MiB, the larger"
            )
        return f"memory_budget {share} of the {size_text(free)} of {where}"
    if free is None:
        return (
            f"default: {where} unreadable here, so twice a gradient pass at the batch size "
            "or 256 MiB, the larger"
        )
    return f"default: {FREE_FRACTION:.0%} of the {size_text(free)} of {where}"


def size_text(n_bytes: float) -> str:
    """``n_bytes`` in the largest binary unit it reaches, three significant digits."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} bytes"


def plan_pass(
    graphs: GraphSizes,
    *,
    param_bytes: int,
    rows: int,
    width: int,
    budget: int,
    vmapped: bool,
) -> PassPlan:
    """The largest chunk of at most ``rows`` rows whose one-vector pass fits in ``budget``, then
    the most vectors (at most ``width``) that fit with it; 1 row and 1 vector when nothing fits
    (``fits`` False)."""

    def cost(r: int, m: int) -> float:
        return pass_bytes(graphs, param_bytes, r, m, vmapped)

    chunk = rows
    if cost(rows, 1) > budget:
        # the cost grows linearly in r: solve for the largest r, then step down past rounding
        slope = graphs.double.per_row
        spare = budget - cost(0, 1)
        chunk = max(1, min(rows, int(spare // slope) if slope > 0 else rows))
        while chunk > 1 and cost(chunk, 1) > budget:
            chunk -= 1
    fits = cost(chunk, 1) <= budget
    chosen = max(1, widest(lambda m: cost(chunk, m) <= budget, width))
    return PassPlan(chunk, chosen, math.ceil(cost(chunk, chosen)), int(budget), fits)


def widest(fits: Callable[[int], bool], width: int) -> int:
    """The largest m in 1..``width`` for which ``fits(m)``, 0 when not even 1 fits.

    ``fits`` must hold up to some m and fail beyond it (a memory cost that grows with the
    vectors per pass), so bisection finds it in about log2(width) calls: a ``--probe-batch`` of
    10**9 is planned as fast as one of 8 (a scan down from it would not end)."""
    if width < 1 or not fits(1):
        return 0
    low, high = 1, width  # fits(low) holds; the answer lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def lanczos_basis(
    k: int, n_params: int, budget: int | None, asked: int | None = None
) -> int | None:
    """The most vectors Lanczos' basis may hold for k eigenvalues of a P = ``n_params`` Hessian:
    ``asked`` when given (at most P), else as many vectors as the memory ``budget`` holds,
    counted at 8 bytes a value (a float32 basis holds half that, and three float64 vectors —
    the work vector and the two latest rows widened — which the other half covers from 6 rows
    on: 4·m·P + 3·8·P ≤ 8·m·P for m ≥ 6), but at least 2k + :data:`BASIS_FLOOR` (fewer restarts the basis so often that the
    products, not the memory, become the cost), and at most P (a basis of P vectors spans the space: no restart); None (no bound) without a
    budget. The basis is held beside the products, as a trace sketch is
    (:func:`~curvcal.curvature.plan.check_sketch_memory`): a λ run holds at most its
    products' budget plus this."""
    if asked is not None:
        return min(asked, n_params)
    if budget is None:
        return None
    return min(n_params, max(2 * k + BASIS_FLOOR, budget // (n_params * 8)))


def density_keeps_basis(
    steps: int,
    n_params: int,
    budget: int | None,
    asked: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> bool:
    """Whether a stochastic-Lanczos-quadrature run of ``steps`` steps on a P = ``n_params``
    Hessian with products in ``dtype`` keeps its basis (full reorthogonalisation,
    :func:`~curvcal.curvature.density.spectral_density`): when ``asked`` (a bound on any Lanczos
    basis, ``--max-basis``) holds min(steps, P) vectors, else when the memory ``budget`` holds
    what the basis allocates: min(steps, P) + 1 rows of P values (float32 for float32 products,
    else float64) and, for float32 rows, :data:`~curvcal.curvature.krylov.WIDE_VECTORS`
    float64 vectors (the work vector and the two latest rows widened); always without either.
    Otherwise the run keeps four vectors and the three-term recurrence alone."""
    rows = min(steps, n_params)
    if asked is not None:
        return rows <= asked
    if budget is None:
        return True
    storage = basis_storage(dtype)
    narrow = storage != torch.float64  # rows narrower than the float64 work vectors
    row = torch.empty((), dtype=storage).element_size()
    held = (rows + 1) * n_params * row + (WIDE_VECTORS * n_params * 8 if narrow else 0)
    return held <= budget


def sketch_limit(
    method: str, n_params: int, dtype: torch.dtype, budget: int | None, free: int | None = None
) -> int | None:
    """The most columns a Hutch++ sketch may hold on a P = ``n_params`` operator of ``dtype``:
    as many vectors of P values as the memory ``budget`` (and the ``free`` memory, when known)
    holds, at least one; held beside the products, as Lanczos' basis is (:func:`lanczos_basis`).
    None (no bound) without a budget, and for any other ``method``: Hutchinson keeps no sketch,
    and XTrace's sketch is every product it makes."""
    if method != "hutchpp" or budget is None:
        return None
    limit = budget if free is None else min(budget, free)
    element = torch.empty((), dtype=dtype).element_size()
    return max(1, limit // (n_params * element))
