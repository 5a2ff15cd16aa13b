"""Model inputs as rows: one tensor, or a mapping of named tensors that share their first dimension.

An image batch is one tensor ``x`` of shape ``(B, ...)``. A text batch is a mapping of keyword
tensors (``input_ids``, ``attention_mask``, ``token_type_ids``), each ``(B, L)``, that the
model takes as keyword arguments. Everything that counts, moves, pins, slices or splits a batch
goes through the functions here, so that both forms are handled in one place and kernels stay
free of loaders.

Conventions: row ``i`` of a mapping is row ``i`` of every one of its tensors; moving to a
device casts only floating tensors to the compute dtype (token ids and masks keep their integer
dtype); a mapping keeps its keys and their order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

import torch
from torch import Tensor

Inputs: TypeAlias = Tensor | Mapping[str, Tensor]


def tensors(x: Inputs) -> Iterator[Tensor]:
    """Every tensor of ``x`` (itself, or the mapping's values in order)."""
    if isinstance(x, Tensor):
        yield x
    else:
        yield from x.values()


def _apply(x: Inputs, func: Callable[[Tensor], Tensor]) -> Inputs:
    if isinstance(x, Tensor):
        return func(x)
    return {key: func(value) for key, value in x.items()}


def tensor_problem(t: Tensor) -> str | None:
    """Why the tensor ``t`` holds no values curvcal can read (``None`` when it can): a meta
    tensor (a shape without data) or a sparse/quantised layout (the kernels index, slice and
    multiply dense, strided tensors)."""
    if t.device.type == "meta":
        return "is a meta tensor, which holds a shape but no values"
    if t.layout != torch.strided:
        return f"has layout {t.layout} (give a dense tensor, e.g. .to_dense())"
    return None


def input_problem(x: Any) -> str | None:
    """Why ``x`` is not a batch of inputs (``None`` when it is): not a tensor nor a mapping of
    tensors, a scalar, a tensor without values (:func:`tensor_problem`), an empty mapping, or
    tensors whose first dimensions differ."""
    if isinstance(x, Tensor):
        if x.ndim < 1:
            return "inputs are a 0-d tensor, without a row dimension"
        problem = tensor_problem(x)
        return None if problem is None else f"the inputs tensor {problem}"
    if not isinstance(x, Mapping):
        hint = " (convert it with torch.from_numpy)" if type(x).__module__ == "numpy" else ""
        return f"inputs must be a tensor or a mapping of tensors, got {type(x).__name__}{hint}"
    if not x:
        return "inputs are an empty mapping"
    rows: set[int] = set()
    for key, value in x.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            return "a mapping of inputs must map names to tensors"
        if value.ndim < 1:
            return f"input {key!r} is a 0-d tensor, without a row dimension"
        problem = tensor_problem(value)
        if problem is not None:
            return f"input {key!r} {problem}"
        rows.add(int(value.shape[0]))
    if len(rows) > 1:
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in x.items())
        return f"the inputs' first dimensions differ ({shapes})"
    return None


def n_rows(x: Inputs) -> int:
    """The number of samples in ``x`` (the first dimension; a mapping's first tensor's)."""
    first = next(tensors(x))
    return int(first.shape[0])


def nbytes(x: Inputs) -> int:
    """Bytes held by the tensors of ``x``."""
    return sum(t.numel() * t.element_size() for t in tensors(x))


def is_floating(x: Inputs) -> bool:
    """True when every tensor of ``x`` is floating point."""
    return all(t.is_floating_point() for t in tensors(x))


def is_pinned(x: Inputs) -> bool:
    """True when every tensor of ``x`` is in pinned host memory."""
    return all(t.is_pinned() for t in tensors(x))


def pin(x: Inputs) -> Inputs:
    """``x`` in pinned host memory (a copy)."""
    return _apply(x, lambda t: t.pin_memory())


def to_device(
    x: Inputs,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    non_blocking: bool = False,
) -> Inputs:
    """``x`` on ``device``; floating tensors cast to ``dtype`` when given, others unchanged."""

    def move(t: Tensor) -> Tensor:
        t = t.to(device, non_blocking=non_blocking)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    return _apply(x, move)


def take_rows(x: Inputs, index: Tensor | slice) -> Inputs:
    """Rows ``index`` of ``x``: an index tensor, a boolean mask over rows, or a slice."""
    return _apply(x, lambda t: t[index])


def split_rows(x: Inputs, size: int) -> list[Inputs]:
    """``x`` in consecutive chunks of at most ``size`` rows (the last may be shorter)."""
    if isinstance(x, Tensor):
        return list(x.split(size))
    parts = {key: value.split(size) for key, value in x.items()}
    count = len(next(iter(parts.values())))
    return [{key: chunks[i] for key, chunks in parts.items()} for i in range(count)]


def as_batch_of_one(x: Inputs) -> Inputs:
    """One row without its batch dimension (as ``torch.func.vmap`` hands it) as a batch of one."""
    return _apply(x, lambda t: t.unsqueeze(0))


def device_of(x: Inputs) -> torch.device:
    """The device of ``x`` (its first tensor's)."""
    return next(tensors(x)).device


def detached(x: Inputs) -> Inputs:
    """``x`` detached from any autograd graph."""
    return _apply(x, lambda t: t.detach())


def describe_shape(x: Inputs) -> str:
    """``x``'s shape for a message: ``(B, C, H, W)`` or ``input_ids (B, L), ...``."""
    if isinstance(x, Tensor):
        return str(tuple(x.shape))
    return ", ".join(f"{key} {tuple(value.shape)}" for key, value in x.items())


def batch_problem(batch: Any) -> str | None:
    """Why one item of a dataset is not an ``(inputs, labels)`` batch (``None`` when it is a
    pair whose inputs are inputs (:func:`input_problem`) and whose labels are a tensor with
    values, one per row); the labels' dtype and range are the reader's to check."""
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        got = (
            f"a {type(batch).__name__} of {len(batch)}"
            if isinstance(batch, tuple | list)
            else (f"a {type(batch).__name__}")
        )
        return f"each batch must be a pair (inputs, labels tensor), got {got}"
    x, y = batch
    problem = input_problem(x)
    if problem is not None:
        return problem
    if not isinstance(y, Tensor):
        hint = " (convert it with torch.from_numpy)" if type(y).__module__ == "numpy" else ""
        return f"the labels must be a tensor, got {type(y).__name__}{hint}"
    problem = tensor_problem(y)
    if problem is not None:
        return f"the labels tensor {problem}"
    return None


def as_batches(data: Any) -> Any:
    """``data`` as a source of ``(x, y)`` batches: an ``(inputs, labels)`` pair of tensors (the
    inputs a tensor or a mapping of them) is one batch, ``[(x, y)]``; anything else (a
    DataLoader, a list of pairs, a function returning an iterator) is returned as it is."""
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and isinstance(data[1], Tensor)
        and (isinstance(data[0], Tensor) or (isinstance(data[0], Mapping) and data[0]))
        and all(isinstance(value, Tensor) for value in tensors(data[0]))
    ):
        return [data]
    return data
