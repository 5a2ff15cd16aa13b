"""The NaN/Inf guard: a wrapper around any Hessian operator that names the batches at fault.

:class:`NaNGuard` has the operator interface of what it wraps (``shape``, ``dtype``,
``device``, ``matmat``, ``matvec``, ``@``, ``mean_loss``, ``restrict``, ``with_loss`` and every other
attribute, passed through). Its mean loss and products are checked for finiteness (a cheap
min/max of the result, which NaN propagates through; products of an operator that checks them
itself, ``checks_finite``, are not checked twice). When one is not finite the pass that
produced it is run again batch by batch, each batch through ``operator.with_batches([batch])``
(the same model, loss, parameters and engine), and the run stops with a
:class:`~curvcal.errors.NumericalError` that gives the count of offending batches and the first
of them with its sample range::

    loss: the mean ce loss over the 40 samples is nan: non-finite in 3 of 5 batches, the first
    being batch 1 (samples 8..15)

Nothing is spent on the search unless a check fails. Under ``torch.distributed`` each process
searches its own shard (no collective is called) and reports batches of that shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from curvcal.curvature.operators import LinearOperator, matvec_into
from curvcal.errors import NumericalError
from curvcal.losses import Loss
from curvcal.rows import Inputs

_PRODUCT = "a Hessian-vector product is not finite (NaN or Inf)"
_HINT = "check the model's weights and the data for NaN or Inf, or use float64"

Batch = tuple[Inputs, Tensor]


class Guardable(LinearOperator, Protocol):
    """What the guard needs of an operator: products (a :class:`LinearOperator`) and the loss."""

    def mean_loss(self) -> float: ...

    def restrict(self, params: Sequence[str]) -> Any: ...

    def with_batches(self, batches: list[Batch]) -> Any: ...

    def with_loss(self, loss: Loss) -> Any: ...

    def source_batches(self) -> Iterator[Batch]: ...


def _finite(values: Tensor) -> bool:
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


class NaNGuard:
    """``operator`` with every non-finite loss or product reported with the batches behind it.

    :meth:`mean_loss` and every product raise :class:`NumericalError` with the number of
    batches whose own loss (or product with the same vectors) is not finite and the index and
    sample range of the first; blocks made by :meth:`restrict` are guarded too. ``sharded``
    says the data is one process's shard (the message says so when no batch is at fault).
    Finite results are those of ``operator``, unchanged.
    """

    def __init__(self, operator: Guardable, *, sharded: bool = False) -> None:
        self.operator = operator
        self.sharded = sharded

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("operator", "sharded"):
            raise AttributeError(name)
        return getattr(self.operator, name)

    @property
    def shape(self) -> tuple[int, int]:
        return self.operator.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.operator.dtype

    @property
    def device(self) -> torch.device:
        return self.operator.device

    def mean_loss(self) -> float:
        """The wrapped operator's mean loss; a non-finite one names the batches at fault."""
        try:
            value = self.operator.mean_loss()
        except NumericalError as error:
            raise self._located(error.what, error.why, None) from None
        return value

    def matmat(self, vectors: Tensor) -> Tensor:
        """H·V for V of shape (P, m); a non-finite product names the batches at fault."""
        try:
            result = self.operator.matmat(vectors)
        except NumericalError as error:
            raise self._located(error.what, error.why, vectors) from None
        # an operator that checks its own products (``checks_finite``) has raised already
        if not getattr(self.operator, "checks_finite", False) and not _finite(result):
            raise self._located("hessian", _PRODUCT, vectors)
        return result

    def matvec(self, vector: Tensor) -> Tensor:
        """H·v for v of shape (P,)."""
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)

    def matvec_into(self, vector: Tensor, out: Tensor) -> Tensor:
        """H·v written into ``out`` (see :func:`~curvcal.curvature.operators.matvec_into`); a
        non-finite product names the batches at fault."""
        try:
            matvec_into(self.operator, vector, out)
        except NumericalError as error:
            raise self._located(error.what, error.why, vector.reshape(-1, 1)) from None
        if not getattr(self.operator, "checks_finite", False) and not _finite(out):
            raise self._located("hessian", _PRODUCT, vector.reshape(-1, 1))
        return out

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def restrict(self, params: Sequence[str]) -> NaNGuard:
        """The guarded diagonal block of the parameters matching the glob patterns ``params``."""
        return NaNGuard(self.operator.restrict(params), sharded=self.sharded)

    def with_loss(self, loss: Loss) -> NaNGuard:
        """The guarded Hessian of another ``loss`` of the same model and data."""
        return NaNGuard(self.operator.with_loss(loss), sharded=self.sharded)

    def _located(self, what: str, why: str, vectors: Tensor | None) -> NumericalError:
        """``why`` (the failed check) with the offending batches, found by running the failed
        pass again batch by batch: the loss when ``vectors`` is ``None``, else their product."""
        check: Callable[[Any], object]
        if vectors is None:

            def check(single: Any) -> object:
                return single.mean_loss()

        else:
            block = vectors.detach()

            def check(single: Any) -> object:
                result = single.matmat(block)
                if not _finite(result):
                    raise NumericalError(what, _PRODUCT)
                return result

        bad: list[tuple[int, int, int]] = []
        n_batches = 0
        start = 0
        for index, batch in enumerate(self.operator.source_batches()):
            size = int(batch[1].shape[0])
            n_batches += 1
            try:
                check(self.operator.with_batches([batch]))
            except NumericalError:
                bad.append((index, start, start + size - 1))
            start += size
        if not bad:
            where = " of this process" if self.sharded else ""
            found = f"no single batch{where} is at fault (the sum over batches overflows)"
        else:
            index, first, last = bad[0]
            found = (
                f"non-finite in {len(bad)} of {n_batches} batches, the first being batch {index} "
                f"(samples {first}..{last})"
            )
        return NumericalError(what, f"{why}: {found}", _HINT)
