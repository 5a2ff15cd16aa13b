"""The NaN/Inf guard's search: which batches made a loss or a product non-finite.

A Hessian operator checks its mean loss and every product for finiteness (a cheap check of the
result, which NaN propagates through). When one is not finite, :func:`located` runs the pass
that produced it again batch by batch, each batch through ``operator.with_batches([batch])``
(the same model, loss, parameters and engine), and returns a
:class:`~curvcal.errors.NumericalError` that gives the count of offending batches and the first
of them with its sample range::

    loss: the mean ce loss over the 40 samples is nan: non-finite in 3 of 5 batches, the first
    being batch 1 (samples 8..15)

Nothing is spent on the search unless a check fails. Under ``torch.distributed`` each process
searches its own shard (no collective is called) and reports batches of that shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor

from curvcal.errors import NumericalError
from curvcal.rows import Inputs

#: why a product failed its check, and what to do about it
PRODUCT = "a Hessian-vector product is not finite (NaN or Inf)"
HINT = "check the model's weights and the data for NaN or Inf, or use float64"

Batch = tuple[Inputs, Tensor]


class Searchable(Protocol):
    """What the search needs of an operator: its batches, and the operator of one of them."""

    def with_batches(self, batches: list[Batch]) -> Any: ...

    def source_batches(self) -> Iterator[Batch]: ...


def is_finite(values: Tensor) -> bool:
    """Whether every entry of ``values`` is finite (a min/max read, which NaN propagates)."""
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def located(
    operator: Searchable, what: str, why: str, vectors: Tensor | None, *, sharded: bool
) -> NumericalError:
    """``why`` (the failed check) with the offending batches, found by running the failed pass
    of ``operator`` again batch by batch: the mean loss when ``vectors`` is ``None``, else their
    product. ``sharded``: the data is one process's shard (said when no batch is at fault)."""
    check: Callable[[Any], object]
    if vectors is None:

        def check(single: Any) -> object:
            return single.mean_loss()

    else:
        block = vectors.detach()

        def check(single: Any) -> object:
            result = single.matmat(block)
            if not is_finite(result):
                raise NumericalError(what, PRODUCT)
            return result

    bad: list[tuple[int, int, int]] = []
    n_batches = 0
    start = 0
    for index, batch in enumerate(operator.source_batches()):
        size = int(batch[1].shape[0])
        n_batches += 1
        try:
            check(operator.with_batches([batch]))
        except NumericalError:
            bad.append((index, start, start + size - 1))
        start += size
    if not bad:
        where = " of this process" if sharded else ""
        found = f"no single batch{where} is at fault (the sum over batches overflows)"
    else:
        index, first, last = bad[0]
        found = (
            f"non-finite in {len(bad)} of {n_batches} batches, the first being batch {index} "
            f"(samples {first}..{last})"
        )
    return NumericalError(what, f"{why}: {found}", HINT)
