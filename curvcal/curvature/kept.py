"""Gradient graphs kept between products: the forward and the first backward run once.

A double-backward product over the data is, for every batch B, a forward, a first backward
that builds the gradient g_B = ∇_θ ℓ_B with its graph (``create_graph=True``), and a second
backward, the vector-Jacobian product J_{g_B}(θ)ᵀ v = H_B·v. The first two do not depend on v.
When the graphs of every batch fit in memory they are built once, the batch gradients are
summed into g = Σ_B g_B (the sum keeps the graph: addition saves no tensors), and every product
is then one backward through that graph
(:func:`~curvcal.curvature.operator.kept_hvp`, beside the operator's loop)::

    H·v = J_g(θ)ᵀ v = Σ_B H_B·v        (retain_graph=True, so the graph serves the next product)

On one CPU thread a product then costs the second backward alone: 1.69× a gradient pass on
torchvision's ResNet-18 (32 images of 3×32×32; 2.90× with the forward and first backward
rebuilt) and 2.17× on a two-layer ViT (3.76× rebuilt). The first product still pays for the
forward and first backward, once.

The memory plan measures its graph sizes on a slice of the first batch (at most 8 rows) by a
double backward; when that slice is the whole first batch and the plan keeps the graphs, the
measurement's gradient, graph included, is the first batch's part of g (:meth:`KeptState.adopt`)
and the build runs the other batches only: on a model whose first batch has at most 8 rows the
first batch's forward and first backward run once, not twice.

Memory: the graphs of every batch, Σ_B G(r_B) in the notation of
:mod:`curvcal.curvature.memory`, the summed gradient (P values), and — when batches are streamed
rather than cached — the inputs the graphs save. :func:`kept_bytes` predicts it from the graph
sizes measured on the first batch; with ``keep_graphs="auto"`` the operator keeps the graphs of
as many leading chunks as fit in its memory budget beside a pass of products
(:func:`kept_prefix`), all of them when they all fit, and rebuilds the others' for every product.

A kept graph is valid for the parameter and buffer values it was built from: each tensor's
in-place version counter is recorded, and :meth:`KeptGraph.is_current` is false once any of
them changed (an optimiser step, ``load_state_dict``), so the operator builds it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from curvcal.curvature.memory import GraphSizes, pass_bytes, widest
from curvcal.rows import Inputs


def versions_of(watched: Iterable[Tensor]) -> tuple[int, ...]:
    """The in-place version counters of ``watched`` now (what :meth:`KeptGraph.is_current`
    compares against)."""
    return tuple(int(tensor._version) for tensor in watched)


@dataclass
class KeptGraph:
    """The summed gradient g = Σ_B ∇_θ ℓ_B over every batch, with its graph.

    ``gradient[i]`` is g's piece for ``params[i]`` (``None`` where the gradient does not depend
    on the parameters, whose products are zero); ``watched`` are the parameters and buffers
    whose values the graph was built from, and ``versions`` their version counters then.
    """

    params: tuple[Tensor, ...]
    gradient: tuple[Tensor | None, ...]
    watched: tuple[Tensor, ...]
    versions: tuple[int, ...]

    def is_current(self) -> bool:
        """False once a parameter or buffer the graph read has been changed in place."""
        return versions_of(self.watched) == self.versions


class KeptState:
    """The kept graph of an operator, shared with the blocks it restricts to some parameters:
    built over the first operator's parameters (``names``, ``params``), used by any block whose
    parameters are among them. ``enabled``: whether products go through it; ``chunks``: how
    many leading chunks of the data it covers (``None``: all; the others are rebuilt for every
    product); ``dropped``: why it was given up, if it was."""

    def __init__(self, names: tuple[str, ...], params: tuple[Tensor, ...]) -> None:
        self.names = names
        self.params = params
        self._position = {name: i for i, name in enumerate(names)}
        self.enabled = False
        self.chunks: int | None = None
        self.kept: KeptGraph | None = None
        self.dropped: str | None = None
        #: the first batch's graph, built by the memory plan's measurement and handed over
        #: (:meth:`adopt`), until the kept graph is built from it; and the rows it covers
        self.start: KeptGraph | None = None
        self.start_rows = 0

    def drop(self, reason: str) -> None:
        """Give the graph up for good (it is freed), saying why."""
        self.enabled = False
        self.kept = None
        self.start = None
        self.dropped = reason

    def adopt(self, start: KeptGraph, rows: int) -> None:
        """Take ``start``, the graph of the first chunk of the data (its ``rows`` rows, over all
        of :attr:`params`), as the beginning of the kept graph: its build then runs the other
        chunks only."""
        self.start, self.start_rows = start, rows

    def take_start(self, first_rows: int) -> KeptGraph | None:
        """The adopted first chunk's graph, if still current and the first chunk still holds its
        ``first_rows`` rows (batches split after an out-of-memory error would make it two
        chunks); released either way: it is summed into the kept graph now, or stale."""
        start, self.start = self.start, None
        if start is None or first_rows != self.start_rows or not start.is_current():
            return None
        return start

    def indices(self, names: Sequence[str]) -> list[int] | None:
        """Positions of the parameters ``names`` among the graph's; None when one is not there
        (a block outside the first operator's parameters rebuilds its graphs)."""
        if not all(name in self._position for name in names):
            return None
        return [self._position[name] for name in names]


def build_kept_graph(
    batch_loss: Callable[[Inputs, Tensor], Tensor],
    params: Sequence[Tensor],
    batches: Iterable[tuple[Inputs, Tensor]],
    watched: Sequence[Tensor],
    start: KeptGraph | None = None,
) -> KeptGraph:
    """Forward and first backward of every batch, once: g = Σ_B ∇_θ ``batch_loss(x_B, y_B)``
    with ``create_graph=True``, the pieces summed as they arrive (each batch's own gradient is
    freed once added). ``watched``: the tensors whose later in-place change makes it stale.
    ``start``: the graph of the batches before ``batches``, already built (the first batch's,
    from the memory plan's measurement: :meth:`KeptState.adopt`), summed first and its
    versions kept (the older record: a change since it was built makes the whole stale)."""
    versions = versions_of(watched) if start is None else start.versions
    total: list[Tensor | None] = [None] * len(params) if start is None else list(start.gradient)
    with torch.enable_grad():
        for x, y in batches:
            grads = torch.autograd.grad(
                batch_loss(x, y), params, create_graph=True, allow_unused=True
            )
            _add(total, grads)
    return KeptGraph(tuple(params), tuple(total), tuple(watched), versions)


def _add(total: list[Tensor | None], grads: Sequence[Tensor | None]) -> None:
    """Add a batch's gradient pieces with their graphs into ``total``, in place (a piece that
    does not depend on the parameters is left out: its products are zero)."""
    for i, piece in enumerate(grads):
        if piece is None or not piece.requires_grad:
            continue
        current = total[i]
        total[i] = piece if current is None else current + piece


def first_graph(
    gradient: Sequence[Tensor | None],
    params: Sequence[Tensor],
    watched: Sequence[Tensor],
    versions: tuple[int, ...],
) -> KeptGraph:
    """The kept graph of the first batch alone from its ``gradient`` (built with
    ``create_graph=True`` elsewhere: the memory plan's measurement), ``versions`` the version
    counters of ``watched`` recorded before it was built."""
    total: list[Tensor | None] = [None] * len(params)
    _add(total, gradient)
    return KeptGraph(tuple(params), tuple(total), tuple(watched), versions)


def kept_bytes(
    graphs: GraphSizes,
    param_bytes: int,
    chunk_rows: Sequence[int],
    input_row_bytes: float,
) -> float:
    """Predicted bytes of the kept graphs: Σ over the chunks of a double-backward graph
    G(r) = G₀ + g·r, the summed gradient (``param_bytes``), and ``input_row_bytes`` per row for
    inputs the graphs hold that would otherwise be freed (streamed batches; 0 when cached)."""
    rows = sum(chunk_rows)
    return (
        len(chunk_rows) * graphs.double.fixed
        + rows * (graphs.double.per_row + input_row_bytes)
        + param_bytes
    )


def kept_pass_bytes(graphs: GraphSizes, param_bytes: int, rows: int, width: int) -> float:
    """Bytes a product through kept graphs adds, for ``width`` vectors: the second backward's
    intermediate tensors (taken as the double-backward graph of ``rows`` rows, the largest
    chunk: what the first backward saved for it), the product in flight (P·s), and per vector
    its result and its tangent (2·P·s; one vector's tangent is a view of the caller's column,
    counted all the same). Against the resident-set growth of a first kept product (128 images
    of 3×32×32 in two batches, one thread): ResNet-18 predicted 323 MiB, measured 256 MiB; a
    two-layer ViT 280 MiB against 248 MiB."""
    return graphs.double.at(rows) + param_bytes * (1 + 2 * width)


def chunk_rows(batch_rows: Iterable[int], limit: int | None) -> list[int]:
    """Rows of every chunk a pass hands out, for batches of ``batch_rows`` rows split into
    chunks of at most ``limit`` (``None``: unsplit)."""
    chunks: list[int] = []
    for rows in batch_rows:
        if limit is None or rows <= limit:
            chunks.append(rows)
            continue
        full, rest = divmod(rows, limit)
        chunks.extend([limit] * full + ([rest] if rest else []))
    return chunks


def kept_prefix(
    graphs: GraphSizes,
    *,
    param_bytes: int,
    chunks: Sequence[int],
    input_row_bytes: float,
    width: int,
    budget: float,
    partial: bool = True,
) -> tuple[int, int]:
    """How many leading ``chunks`` to keep the graphs of, k, and the vectors per product, m ≤
    ``width``: the most chunks, then the most vectors, for which the graphs of the first k
    chunks fit in ``budget`` with, in turn, a product through them and a rebuilt pass over the
    largest of the other chunks (by double backward: :func:`~curvcal.curvature.memory.pass_bytes`).
    Without ``partial``, k is ``len(chunks)`` or 0; (0, 0) when not even the first chunk fits
    with one vector."""
    count = len(chunks)
    if count == 0:
        return 0, 0
    # the largest rebuilt chunk once the first k are kept: the maximum over chunks[k:]
    rest = [0] * (count + 1)
    for k in range(count - 1, -1, -1):
        rest[k] = max(rest[k + 1], chunks[k])

    def need(k: int, m: int, held: float, largest: int) -> float:
        kept = held + kept_pass_bytes(graphs, param_bytes, largest, m)
        if rest[k] == 0:
            return kept
        return max(kept, held + pass_bytes(graphs, param_bytes, rest[k], m, False))

    def partial_fits(k: int, held: float, largest: int) -> Callable[[int], bool]:
        return lambda m: need(k, m, held, largest) <= budget

    best = (0, 0)
    held = float(param_bytes)  # the summed gradient, then each kept chunk's graph and inputs
    largest = 0
    for k in range(1, count + 1):
        rows = chunks[k - 1]
        held += graphs.double.at(rows) + rows * input_row_bytes
        largest = max(largest, rows)
        if not partial and k < count:
            continue
        fitting = widest(partial_fits(k, held, largest), width)
        if fitting:
            best = (k, fitting)
        elif held > budget:
            break  # more kept chunks only hold more
    return best
