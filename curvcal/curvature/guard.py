"""NaN/Inf guard for the Hessian operator: which batches are at fault, and how many.

:class:`GuardedHessianOperator` is a :class:`~curvcal.curvature.hvp.HessianOperator` whose mean
loss and products are checked for finiteness (a cheap min/max of the result, which NaN
propagates through). When one is not finite the pass that produced it is run again batch by
batch, each batch as a one-batch operator with the same model, loss, parameters and engine, and
the run stops with a :class:`~curvcal.errors.NumericalError` that gives the count of offending
batches and the first of them with its sample range::

    loss: the mean ce loss over the 40 samples is nan: non-finite in 3 of 5 batches, the first
    being batch 1 (samples 8..15)

Nothing is spent on the search unless a check fails. Under ``torch.distributed`` each process
searches its own shard (no collective is called) and reports batches of that shard.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.curvature.hvp import Batch, BatchSource, HessianOperator
from curvcal.errors import NumericalError

_PRODUCT = "a Hessian-vector product is not finite (NaN or Inf)"
_HINT = "check the model's weights and the data for NaN or Inf, or use float64"


def _finite(values: Tensor) -> bool:
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def _fresh(source: BatchSource) -> Iterator[Batch]:
    if callable(source) and not isinstance(source, Iterable):
        return iter(source())
    return iter(source)


class GuardedHessianOperator(HessianOperator):
    """A :class:`HessianOperator` (same arguments) that names the batches behind a NaN/Inf.

    :meth:`mean_loss` and every product raise :class:`NumericalError` with the number of
    batches whose own loss (or product with the same vectors) is not finite and the index and
    sample range of the first; blocks made by :meth:`restrict` are guarded too.
    """

    def __init__(self, model: nn.Module, batches: BatchSource, **options: Any) -> None:
        super().__init__(model, batches, **options)
        self._guard_source = batches
        self._guard_sharded = options.get("all_reduce") is not None
        self._guard_options = {
            key: value for key, value in options.items() if key not in ("all_reduce", "cache")
        }

    def mean_loss(self) -> float:
        try:
            value = super().mean_loss()
        except NumericalError as error:
            raise self._located(error.what, error.why, None) from None
        return value

    def matmat(self, vectors: Tensor) -> Tensor:
        try:
            result = super().matmat(vectors)
        except NumericalError as error:
            raise self._located(error.what, error.why, vectors) from None
        if not _finite(result):
            raise self._located("hessian", _PRODUCT, vectors)
        return result

    def _single(self, batch: Batch) -> HessianOperator:
        """The same Hessian over one batch (no cache, no cross-process sum)."""
        return HessianOperator(
            self.model,
            [batch],
            **{
                **self._guard_options,
                "params": [glob.escape(name) for name in self.param_names],
                "engine": self.requested_engine,
                "cache": "none",
            },
        )

    def _located(self, what: str, why: str, vectors: Tensor | None) -> NumericalError:
        """``why`` (the failed check) with the offending batches, found by running the failed
        pass again batch by batch: the loss when ``vectors`` is ``None``, else their product."""
        check: Callable[[HessianOperator], object]
        if vectors is None:
            check = HessianOperator.mean_loss
        else:
            block = vectors.detach()

            def check(single: HessianOperator) -> object:
                result = single.matmat(block)
                if not _finite(result):
                    raise NumericalError(what, _PRODUCT)
                return result

        bad: list[tuple[int, int, int]] = []
        n_batches = 0
        start = 0
        for index, batch in enumerate(_fresh(self._guard_source)):
            size = int(batch[1].shape[0])
            n_batches += 1
            try:
                check(self._single(batch))
            except NumericalError:
                bad.append((index, start, start + size - 1))
            start += size
        if not bad:
            where = " of this process" if self._guard_sharded else ""
            found = f"no single batch{where} is at fault (the sum over batches overflows)"
        else:
            index, first, last = bad[0]
            found = (
                f"non-finite in {len(bad)} of {n_batches} batches, the first being batch {index} "
                f"(samples {first}..{last})"
            )
        return NumericalError(what, f"{why}: {found}", _HINT)
