"""A dataset's ``(x, y)`` items as batches in a fixed order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, Subset

from curvcal.errors import InputError
from curvcal.load.datasets.tensor_dataset import TensorPairDataset

if TYPE_CHECKING:
    from curvcal.rows import Inputs


def first_input(dataset: Dataset[Any]) -> Inputs:
    """The inputs of sample 0 as a one-row batch, as :func:`iter_batches` would give them."""
    x, _y = next(iter_batches(dataset, 1, [0]))
    return x


def iter_batches(
    dataset: Dataset[Any], batch_size: int, indices: Sequence[int] | None = None
) -> Iterator[tuple[Inputs, torch.Tensor]]:
    """Yield ``(x, y)`` batches in a fixed order: ``indices`` (or ``0..N-1``) in chunks.

    The last batch may be short. ``x`` is stacked (integer inputs become float32, floating
    inputs keep their dtype), or, for a dataset with its own ``collate`` (text), the mapping of
    padded token tensors it returns; ``y`` is int64.
    """
    if batch_size < 1:
        raise InputError("--batch-size", f"is {batch_size}; it must be >= 1")
    order = list(range(len(dataset))) if indices is None else [int(i) for i in indices]  # type: ignore[arg-type]
    collate = _collate_of(dataset)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        if collate is not None:
            inputs, labels = collate([dataset[i] for i in chunk])
            yield inputs, labels.to(torch.int64)
            continue
        if isinstance(dataset, TensorPairDataset):
            where = torch.tensor(chunk, dtype=torch.int64)
            x, y = dataset.x[where], dataset.y[where]
        else:
            items = [dataset[i] for i in chunk]
            x = _stack(dataset, chunk, [torch.as_tensor(item[0]) for item in items])
            y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
        if not x.is_floating_point():
            x = x.float()
        yield x, y.to(torch.int64)


def _collate_of(dataset: Dataset[Any]) -> Any:
    """The dataset's own ``collate`` (text data: pad per batch), looked up through Subsets."""
    inner = dataset
    while isinstance(inner, Subset):
        inner = inner.dataset
    return getattr(inner, "collate", None)


def _stack(
    dataset: Dataset[Any], chunk: Sequence[int], inputs: Sequence[torch.Tensor]
) -> torch.Tensor:
    """The batch of ``inputs`` (samples ``chunk`` of ``dataset``); samples of different shapes
    are an :class:`InputError` naming the first that differs from the batch's first."""
    shape = inputs[0].shape
    for index, item in zip(chunk, inputs, strict=True):
        if item.shape != shape:
            source = getattr(dataset, "source_of", None)
            which = source(index) if source is not None else f"sample {index}"
            first = source(chunk[0]) if source is not None else f"sample {chunk[0]}"
            raise InputError(
                "--data",
                f"{which} has shape {_dims(item.shape)}, {first} {_dims(shape)}; a batch needs "
                "one shape",
                "give images one size with --resize N (and --crop N)"
                if source is not None
                else "make every sample one shape",
            )
    return torch.stack(list(inputs))


def _dims(shape: torch.Size) -> str:
    return "×".join(str(n) for n in shape) or "scalar"
