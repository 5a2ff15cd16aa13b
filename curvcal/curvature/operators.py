"""The linear-operator interface the curvature algorithms accept, and its dense implementation.

An operator is anything with ``shape`` (P, P), ``dtype``, ``device`` and
``matmat(V: Tensor[P, m]) -> Tensor[P, m]`` (plus ``matvec``). One may also offer
``matvec_into(v, out)``, the product written into a given vector, which :func:`product_into` uses
when it is there (the Hessian operator does: no P-long temporary per product). A dense symmetric
``torch.Tensor`` is accepted everywhere an operator is, through :func:`as_operator`; that is how
the algorithms are tested against exact eigenvalues and traces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from curvcal.errors import InputError


@runtime_checkable
class LinearOperator(Protocol):
    """A symmetric linear map of R^P, applied to blocks of column vectors."""

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def matmat(self, vectors: Tensor) -> Tensor: ...

    def matvec(self, vector: Tensor) -> Tensor: ...


class DenseOperator:
    """A dense symmetric matrix seen as a :class:`LinearOperator` (counts its products)."""

    def __init__(self, matrix: Tensor) -> None:
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise InputError(
                "operator",
                f"a dense operator must be a square matrix, got shape {tuple(matrix.shape)}",
            )
        if not matrix.is_floating_point():
            raise InputError(
                "operator", f"a dense operator must be floating point, got {matrix.dtype}"
            )
        self.matrix = matrix
        self.n_matvecs = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.matrix.shape[0]), int(self.matrix.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.matrix.dtype

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    def matmat(self, vectors: Tensor) -> Tensor:
        """A @ V for V of shape (P, m)."""
        self.n_matvecs += int(vectors.shape[1])
        return self.matrix @ vectors.to(device=self.matrix.device, dtype=self.matrix.dtype)

    def matvec(self, vector: Tensor) -> Tensor:
        """A @ v for v of shape (P,)."""
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)


ProductInto = Callable[[Tensor, Tensor], Tensor]
"""(v, out) -> out holding A·v."""


def product_into(operator: LinearOperator) -> ProductInto:
    """``(v, out) -> out``, A·v written into ``out`` (shape (P,), on the operator's device, any
    floating dtype): the operator's own ``matvec_into`` when it has one (itself, so that a
    product calls it directly), else ``matvec`` and a copy (cast to ``out``'s dtype)."""
    into: ProductInto | None = getattr(operator, "matvec_into", None)
    if into is not None:
        return into

    def copied(vector: Tensor, out: Tensor) -> Tensor:
        return out.copy_(operator.matvec(vector))

    return copied


def matvec_into(operator: LinearOperator, vector: Tensor, out: Tensor) -> Tensor:
    """A·v written into ``out`` and returned (:func:`product_into`, for one product)."""
    product_into(operator)(vector, out)
    return out


def as_operator(operator: LinearOperator | Tensor) -> LinearOperator:
    """Return ``operator`` itself, or a :class:`DenseOperator` around a dense tensor."""
    if isinstance(operator, Tensor):
        return DenseOperator(operator)
    if not isinstance(operator, LinearOperator):
        raise InputError(
            "operator",
            f"expected a tensor or an object with shape, dtype, device, matmat and matvec, got {type(operator).__name__}",
        )
    rows, cols = operator.shape
    if rows != cols or rows < 1:
        raise InputError(
            "operator", f"the operator must be square and non-empty, got shape {(rows, cols)}"
        )
    return operator
