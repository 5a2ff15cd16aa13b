"""The top eigenvectors of a run, held as its operator's vector space holds them.

On one process (or a replicated model) the k columns are whole; on a model sharded over ranks
each rank holds its slice of them. :meth:`TopEigenvectors.by_name` makes them whole on every
rank (P × k each: what a caller that moves the parameters along them needs);
:meth:`TopEigenvectors.per_parameter` hands them on one parameter at a time, whole on the first
rank only (what a file writer needs: no rank holds a P-long vector).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from curvcal.curvature.vectors import VectorSpace


@dataclass(frozen=True)
class TopEigenvectors:
    """Unit eigenvectors v_i (‖v_i‖ = 1 over all the selected parameters) with their
    eigenvalues ``values`` (in the order of the run's spectrum), over the parameters ``names``
    of ``shapes`` (in the operator's order); ``block`` holds them as columns, whole or this
    rank's slices as ``space`` says."""

    values: tuple[float, ...]
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    space: VectorSpace
    block: Tensor

    @property
    def sizes(self) -> list[int]:
        return [shape.numel() for shape in self.shapes]

    def by_name(self) -> list[dict[str, Tensor]]:
        """One ``{parameter name: tensor of its shape}`` per eigenvector, whole on every rank
        (an all-gather of the slices on a sharded model)."""
        whole = self.space.whole(self.block)
        pieces = torch.split(whole, self.sizes)
        return [
            {
                name: piece[:, column].reshape(shape)
                for name, piece, shape in zip(self.names, pieces, self.shapes, strict=True)
            }
            for column in range(whole.shape[1])
        ]

    def per_parameter(self) -> Iterator[tuple[str, Tensor | None]]:
        """(name, k × shape tensor: the k eigenvectors restricted to that parameter) for each
        parameter in order, on the first rank; the tensor is None on the other ranks of a
        sharded model. Collective there: every rank iterates to the end."""
        rows = self.space.parameter_rows(self.block, self.sizes)
        for name, shape, part in zip(self.names, self.shapes, rows, strict=True):
            yield name, None if part is None else part.T.reshape(part.shape[1], *shape)


__all__ = ["TopEigenvectors"]
