"""W simulated ranks in one process, one thread each, for the sliced-vector kernels' tests.

:class:`ThreadRanks` sums and gathers across the threads with a barrier (the sums in rank
order, so every rank gets the same bits); :class:`SlicedDense` is a dense symmetric matrix whose
vectors are each rank's slice of a set of "parameters" split along dimension 0 as FSDP2 splits
them (``torch.chunk``), the product the rank's rows of A·v. No torch.distributed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from curvcal.curvature.operators import DenseOperator
from curvcal.curvature.vectors import SlicedSpace


class ThreadRanks:
    """An all-reduce and an all-gather among ``world`` threads."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._barrier = threading.Barrier(world, timeout=60)
        self._slots: list[Any] = [None] * world

    def reduce(self, rank: int, value: Tensor) -> Tensor:
        """Σ over the ranks of ``value`` (in rank order), on every rank."""
        parts = self._exchange(rank, value.clone())
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return total

    def gather(self, rank: int, value: Tensor) -> list[Tensor]:
        """Every rank's ``value``, in rank order."""
        return self._exchange(rank, value.clone())

    def _exchange(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        parts = list(self._slots)
        self._barrier.wait()  # nobody writes the next round before all have read this one
        return parts

    def run(self, job: Callable[[int], Any]) -> list[Any]:
        """``job(rank)`` on every rank at once; their results in rank order."""
        results: list[Any] = [None] * self.world
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = job(rank)
            except BaseException as error:
                errors.append(error)
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def local_ranges(
    shapes: Sequence[tuple[int, ...]], rank: int, world: int
) -> list[tuple[int, int, int]]:
    """(numel, start, stop) of rank ``rank``'s rows of each shape (``torch.chunk`` along dim 0)."""
    pieces = []
    for shape in shapes:
        per_row = math.prod(shape[1:])
        rows = -(-shape[0] // world)
        start = min(shape[0], rank * rows) * per_row
        stop = min(shape[0], (rank + 1) * rows) * per_row
        pieces.append((math.prod(shape), start, stop))
    return pieces


def global_indices(pieces: Sequence[tuple[int, int, int]]) -> Tensor:
    """The positions in the whole vector of a rank's slice."""
    offset, indices = 0, []
    for numel, start, stop in pieces:
        indices.append(torch.arange(offset + start, offset + stop))
        offset += numel
    return torch.cat(indices)


class SlicedDense(DenseOperator):
    """A dense symmetric ``matrix`` seen by rank ``rank`` of ``ranks`` through sliced vectors
    (shape, dtype, device and ``matvec`` those of the whole :class:`DenseOperator`)."""

    def __init__(
        self, matrix: Tensor, shapes: Sequence[tuple[int, ...]], ranks: ThreadRanks, rank: int
    ) -> None:
        super().__init__(matrix)
        self.rank = rank
        self.ranks = ranks
        self.pieces = local_ranges(shapes, rank, ranks.world)
        self.indices = global_indices(self.pieces)
        self.everyone = [
            global_indices(local_ranges(shapes, r, ranks.world)) for r in range(ranks.world)
        ]
        self.vector_space = SlicedSpace(
            self.pieces, lambda value: ranks.reduce(rank, value), self._whole, self._collect
        )
        self.longest_collected = 0

    def _whole(self, block: Tensor) -> Tensor:
        whole = block.new_zeros((self.shape[0], block.shape[1]))
        for indices, part in zip(self.everyone, self.ranks.gather(self.rank, block), strict=True):
            whole[indices] = part
        return whole

    def _collect(self, piece: Tensor, numel: int) -> Tensor | None:
        """One parameter's whole rows on rank 0 from every rank's run of them (None elsewhere)."""
        parts = self.ranks.gather(self.rank, piece)
        if self.rank != 0:
            return None
        rows = torch.cat(parts)
        assert rows.shape[0] == numel
        self.longest_collected = max(self.longest_collected, numel)
        return rows

    def matmat(self, vectors: Tensor) -> Tensor:
        assert vectors.shape[0] == self.vector_space.size  # a slice, never a whole vector
        self.n_matvecs += int(vectors.shape[1])
        whole = self._whole(vectors.to(self.dtype))
        return self.matrix[self.indices] @ whole
