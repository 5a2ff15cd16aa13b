"""Where the P-long vectors of the algorithms live: whole on this process, or a slice per rank.

The eigenvalue, trace and density kernels hold vectors of P values (Lanczos' basis, probes,
sketches). On one process, or when every rank holds the whole model, those vectors are whole:
:class:`VectorSpace`. On a model sharded over W ranks (``--shard-model``), each rank holds only
its *local slice* of every vector — the concatenation, in parameter order, of the rows of each
selected parameter the rank keeps (FSDP2's ``torch.chunk`` split along dimension 0) — and the
product H·v comes back as the local slice of H·v: :class:`SlicedSpace`. The kernels never call
torch.distributed; they ask the space of their operator (:func:`space_of`) how to

* reduce: a sum over the ranks of per-rank partial sums (``reduce``); an inner product
  uᵀv = Σ_r u_rᵀv_r, a norm ‖v‖ = (Σ_r ‖v_r‖²)^½ and a projection Qᵀv = Σ_r Q_rᵀv_r of a basis
  held in slices are the local ones summed over the ranks (one all-reduce of a scalar, or of a
  k-vector or k × b matrix);
* draw random vectors (:meth:`VectorSpace.normal`, :meth:`VectorSpace.probes`) that do not
  depend on W: whole, a vector is drawn as one P-long draw; sliced, each parameter's full block
  is drawn from the shared generator in parameter order and the rank keeps its rows (transient
  memory: one parameter). Rademacher probes are the same values either way (a draw of ±1 of
  n_1 + n_2 values equals the draws of n_1 and n_2 in turn); Gaussian vectors are not (torch
  transforms normal draws 16 at a time), so a sharded run's Gaussian start and probes are drawn
  per parameter on every W, and differ from a whole-vector run's.

Everything that is not an inner product — an update v ← v − Qc, a combination Q C, a scaling —
is local: each rank updates its own rows.

The whole space performs exactly the operations the kernels performed before it existed
(``torch.dot``, ``Tensor.norm``, one draw of P values per column), so a run on one process is
bit for bit what it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

#: a sum over the ranks of a tensor of partial sums (a new tensor)
Reduce = Callable[[Tensor], Tensor]


def draw_column(n_values: int, distribution: str, generator: torch.Generator) -> Tensor:
    """One random vector of ``n_values`` on the CPU from ``generator``: ±1 as int64
    (``rademacher``) or standard normal float64 (``gaussian``)."""
    if distribution == "rademacher":
        column = torch.randint(0, 2, (n_values,), generator=generator, dtype=torch.int64)
        return column.mul_(2).sub_(1)
    return torch.randn(n_values, generator=generator, dtype=torch.float64)


class VectorSpace:
    """Whole vectors of ``size`` values: every inner product is the local one."""

    def __init__(self, size: int) -> None:
        self.size = size

    @property
    def sliced(self) -> bool:
        """Whether each process holds only a slice of every vector."""
        return False

    def reduce(self, partial: Tensor) -> Tensor:
        """The sum over the ranks of ``partial`` (per-rank partial sums): itself here."""
        return partial

    def dot(self, a: Tensor, b: Tensor) -> Tensor:
        """aᵀb (a 0-d tensor)."""
        return torch.dot(a, b)

    def norm(self, vector: Tensor) -> Tensor:
        """‖v‖₂ (a 0-d tensor)."""
        return vector.norm()

    def column_norms(self, block: Tensor) -> Tensor:
        """‖b_j‖₂ of each column of ``block`` (size × m): a length-m tensor."""
        return block.norm(dim=0)

    def project(self, rows: Tensor, block: Tensor) -> Tensor:
        """Rows·block, the inner products of the k rows of ``rows`` (k × size) with the columns
        (or the vector) ``block``: k × m (or k)."""
        return rows @ block

    def _draw_into(self, out: Tensor, draw: Callable[[int], Tensor]) -> Tensor:
        """``out`` (length ``size``) holding this space's part of a vector that ``draw(n)``
        makes n values at a time: here one draw of all P values."""
        out[:] = draw(self.size)
        return out

    def normal(self, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Tensor:
        """A standard normal vector on the CPU, this space's part of it (:meth:`_draw_into`):
        float64 draws rounded to ``dtype``."""
        if not self.sliced and dtype == torch.float64:  # the draw itself: no copy of P values
            return torch.randn(self.size, generator=generator, dtype=torch.float64)
        return self._draw_into(
            torch.empty(self.size, dtype=dtype),
            lambda n: torch.randn(n, generator=generator, dtype=torch.float64),
        )

    def normal_into(self, out: Tensor, generator: torch.Generator) -> Tensor:
        """``out`` (float64, length ``size``, on any device) holding the vector :meth:`normal`
        returns in float64: drawn in place when it is a whole vector on the CPU
        (``Tensor.normal_`` draws the values ``torch.randn`` draws, into memory already held:
        0.20 s against 0.23 s at P = 13.5 M, one thread), else drawn on the CPU and copied."""
        if not self.sliced and out.device.type == "cpu":
            return out.normal_(generator=generator)
        return out.copy_(self.normal(generator))

    def probes(
        self,
        count: int,
        distribution: str,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float64,
    ) -> Tensor:
        """``count`` probe vectors as columns of a (size, count) CPU tensor of ``dtype``, drawn
        one by one (:func:`draw_column`), this space's part of each (:meth:`_draw_into`)."""
        probes = torch.empty((self.size, count), dtype=dtype)
        for j in range(count):
            self._draw_into(probes[:, j], lambda n: draw_column(n, distribution, generator))
        return probes

    def whole(self, block: Tensor) -> Tensor:
        """The whole P-long columns of ``block`` (itself here)."""
        return block

    def parameter_rows(self, block: Tensor, sizes: Sequence[int]) -> Iterator[Tensor | None]:
        """Each parameter's rows of the whole columns of ``block`` (size × m), in parameter
        order (``sizes``: each parameter's number of values): views of ``block`` here."""
        yield from torch.split(block, list(sizes))


class SlicedSpace(VectorSpace):
    """Vectors held a slice per rank: this rank's values are the entries
    ``[start, stop)`` of each parameter's flattened full block (``pieces``: (numel of the full
    parameter, start, stop) in parameter order), and ``reduce`` sums over the ranks; ``gather``
    (optional) makes the whole columns of a block of slices on every rank, and ``collect``
    (optional) one parameter's whole rows on the first rank only (for eigenvectors a caller
    asked for). See the module docstring for the formulas."""

    def __init__(
        self,
        pieces: Sequence[tuple[int, int, int]],
        reduce: Reduce,
        gather: Callable[[Tensor], Tensor] | None = None,
        collect: Callable[[Tensor, int], Tensor | None] | None = None,
    ) -> None:
        super().__init__(sum(stop - start for _, start, stop in pieces))
        self.pieces = tuple(pieces)
        self._reduce = reduce
        self._gather = gather
        self._collect = collect

    @property
    def sliced(self) -> bool:
        return True

    def reduce(self, partial: Tensor) -> Tensor:
        return self._reduce(partial)

    def dot(self, a: Tensor, b: Tensor) -> Tensor:
        """Σ_r a_rᵀb_r."""
        return self._reduce(torch.dot(a, b))

    def norm(self, vector: Tensor) -> Tensor:
        """(Σ_r ‖v_r‖²)^½."""
        return self._reduce(vector.norm().square()).sqrt()

    def column_norms(self, block: Tensor) -> Tensor:
        """(Σ_r ‖b_{j,r}‖²)^½ per column."""
        return self._reduce(block.norm(dim=0).square()).sqrt()

    def project(self, rows: Tensor, block: Tensor) -> Tensor:
        """Σ_r Q_r·B_r."""
        return self._reduce(rows @ block)

    def _draw_into(self, out: Tensor, draw: Callable[[int], Tensor]) -> Tensor:
        """``out`` (length ``size``) holding this rank's slice of a vector drawn a full
        parameter at a time, in parameter order (one parameter's draw in memory at a time):
        :meth:`normal` and :meth:`probes` draw the same vectors as on one rank, sliced."""
        offset = 0
        for numel, start, stop in self.pieces:
            out[offset : offset + stop - start] = draw(numel)[start:stop]
            offset += stop - start
        return out

    def whole(self, block: Tensor) -> Tensor:
        """The whole columns of a (size, m) block of slices, gathered from every rank."""
        if self._gather is None:
            raise RuntimeError("this vector space cannot gather whole vectors")
        return self._gather(block)

    def parameter_rows(self, block: Tensor, sizes: Sequence[int]) -> Iterator[Tensor | None]:
        """Each parameter's whole rows (numel × m) of a (size, m) block of slices, made on the
        first rank one parameter at a time from every rank's slice (None on the other ranks):
        no rank holds more than one parameter's m columns beyond its slices, where
        :meth:`whole` puts P × m on every rank. Collective: every rank iterates to the end."""
        if self._collect is None:
            raise RuntimeError("this vector space cannot collect whole parameters")
        if list(sizes) != [numel for numel, _, _ in self.pieces]:
            raise RuntimeError(f"parameter sizes {list(sizes)} are not this space's pieces")
        local = torch.split(block, [stop - start for _, start, stop in self.pieces])
        for (numel, _, _), piece in zip(self.pieces, local, strict=True):
            yield self._collect(piece, numel)


def space_of(operator: object) -> VectorSpace:
    """The vector space of ``operator``: its own ``vector_space`` when it states one, else
    whole vectors of its ``shape[0]``."""
    space = getattr(operator, "vector_space", None)
    if isinstance(space, VectorSpace):
        return space
    shape: tuple[int, int] = operator.shape  # type: ignore[attr-defined]
    return VectorSpace(shape[0])


__all__ = ["Reduce", "SlicedSpace", "VectorSpace", "draw_column", "space_of"]
