"""The dataset a Hessian operator multiplies over: counted once, cached when it fits, split on OOM.

A dataset is handed over as ``(x, y)`` batches (``x`` a tensor, or a mapping of named tensors
with the same rows, such as a text model's ``input_ids`` and ``attention_mask``; see
:mod:`curvcal.rows`) — a re-iterable (a list, a DataLoader) or
a callable returning a fresh iterator — and every product reads it again. :class:`Batches`
checks each batch (inputs and a label tensor, 1-D integer labels, as many rows as labels), counts the
samples once (summed across processes by ``all_reduce`` when the data is sharded), and then
either keeps the batches on the compute device (``cache="device"``, or ``"auto"`` when they fit
in a quarter of the free accelerator memory), in pinned host memory (``"host"``), or streams
them from the source for every pass (``"none"``; on CUDA the copy of the next batch overlaps the
current one's computation).

After a CUDA out-of-memory error the operator calls :meth:`Batches.halve`: every batch is then
handed out in chunks of at most ⌈b/2⌉ rows. Products are sums over samples, so the split is
exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from curvcal import rows
from curvcal.errors import InputError
from curvcal.rows import Inputs

Batch = tuple[Inputs, Tensor]
BatchSource = Iterable[Batch] | Callable[[], Iterator[Batch]]
AllReduce = Callable[[Tensor], Tensor]

# Share of free accelerator memory that cache="auto" may fill with batches.
_AUTO_CACHE_FRACTION = 0.25


def is_out_of_memory(error: BaseException) -> bool:
    """True for a CUDA out-of-memory error, which a smaller batch may avoid.

    Never for an illegal memory access (or any other CUDA error): those leave the CUDA context
    unusable, and retrying would hide a bug.
    """
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    if "illegal memory access" in message:
        return False
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in message


class Batches:
    """The dataset as (x, y) batches on the compute device: counted once, cached when it fits.

    ``mode`` after construction is what runs: ``device`` (batches kept on the device and reused),
    ``host`` (kept in host memory, pinned on CUDA, moved per pass) or ``none`` (the source is
    iterated again for every pass and each batch moved with pinned memory).
    """

    def __init__(
        self,
        source: BatchSource,
        cache: str,
        device: torch.device,
        dtype: torch.dtype,
        all_reduce: AllReduce | None,
    ) -> None:
        if callable(source) and not isinstance(source, Iterable):
            self._fresh: Callable[[], Iterator[Batch]] = source
        elif isinstance(source, Iterable):
            if iter(source) is source:
                raise InputError(
                    "batches",
                    "an iterator can be read only once, and every Hessian product reads the data again",
                    "pass a list of (x, y) pairs, a DataLoader, or a function returning a fresh iterator",
                )
            self._fresh = lambda: iter(source)
        else:
            raise InputError(
                "batches",
                f"expected an iterable of (x, y) pairs or a callable, got {type(source).__name__}",
            )
        self.device = device
        self.dtype = dtype
        pinned = device.type == "cuda"
        budget = None
        if cache == "auto":
            if device.type == "cpu":
                budget = None  # the data is already in the memory it would be cached in
            else:
                free, _total = torch.cuda.mem_get_info(device)
                budget = int(free * _AUTO_CACHE_FRACTION)
        stored: list[Batch] | None = [] if cache in ("auto", "device", "host") else None
        used = 0
        n_local = 0
        n_batches = 0
        sizes: list[int] = []
        low: int | None = None
        high: int | None = None
        for batch in self._fresh():
            x, y = self._check(batch, n_batches)
            if y.numel():  # read once here, so that no product reads labels on the host
                low_y, high_y = (int(v) for v in torch.aminmax(y))
                low = low_y if low is None else min(low, low_y)
                high = high_y if high is None else max(high, high_y)
            n_local += int(y.shape[0])
            sizes.append(int(y.shape[0]))
            n_batches += 1
            if stored is None:
                continue
            if cache == "host":
                stored.append((rows.pin(x), y.pin_memory()) if pinned else (x, y))
                continue
            used += rows.nbytes(x) + y.numel() * y.element_size()
            if budget is not None and used > budget:
                stored = None  # does not fit: stream instead
                continue
            stored.append(self._move(x, y))
        if n_batches == 0 or n_local == 0:
            raise InputError(
                "batches", "the dataset is empty", "give at least one (x, y) batch with one sample"
            )
        self.n_local = n_local
        self.n_batches = n_batches
        count = torch.tensor([float(n_local)], dtype=torch.float64, device=device)
        self.n_samples = round(float((all_reduce(count) if all_reduce else count).item()))
        self._stored = stored
        self.sizes = sizes  # rows of each batch of this process's shard, as the source gives them
        self.largest = max(sizes)
        #: the smallest and largest label of this process's shard
        self.label_range = (low, high) if low is not None and high is not None else None
        self.limit: int | None = None  # rows per chunk after out-of-memory splits
        if stored is None:
            self.mode = "none"
        elif cache == "host":
            self.mode = "host"
        else:
            self.mode = "device"

    @staticmethod
    def _check(batch: Any, index: int) -> Batch:
        """``batch`` as ``(x, y)`` when it is one (:func:`curvcal.rows.batch_problem`) with 1-D
        integer labels, one per row; else :class:`InputError` naming the batch."""
        where = f"batches[{index}]"
        problem = rows.batch_problem(batch)
        if problem is not None:
            raise InputError(where, problem)
        x, y = batch
        if y.ndim != 1 or y.is_floating_point() or y.is_complex():
            raise InputError(
                where,
                f"labels must be a 1-D integer tensor, got {y.dtype} of shape {tuple(y.shape)}",
            )
        if rows.n_rows(x) != y.shape[0]:
            raise InputError(
                where, f"inputs have {rows.n_rows(x)} rows but labels have {y.shape[0]}"
            )
        return x, y

    def _move(self, x: Inputs, y: Tensor) -> Batch:
        non_blocking = rows.is_pinned(x)
        moved = rows.to_device(x, self.device, self.dtype, non_blocking=non_blocking)
        return moved, y.to(self.device, non_blocking=non_blocking)

    @property
    def batch_size(self) -> int:
        """The most rows a batch handed to a product has (after out-of-memory splits)."""
        return self.largest if self.limit is None else min(self.largest, self.limit)

    def halve(self) -> bool:
        """Split every batch in two (rows ⌈b/2⌉ at most); False when batches are one row already."""
        current = self.batch_size
        if current <= 1:
            return False
        self.limit = (current + 1) // 2
        return True

    def _chunks(self, x: Inputs, y: Tensor) -> Iterator[Batch]:
        if self.limit is None or y.shape[0] <= self.limit:
            yield x, y
            return
        yield from zip(rows.split_rows(x, self.limit), y.split(self.limit), strict=True)

    def _host_batches(self, skip: int = 0) -> Iterator[Batch]:
        """The batches in host memory, all but the first ``skip`` (a streamed source is still
        read through them; they are neither checked nor pinned)."""
        if self.mode == "host":
            assert self._stored is not None
            yield from self._stored[skip:]
            return
        pin = self.device.type == "cuda"
        for index, batch in enumerate(self._fresh()):
            if index < skip:
                continue
            x, y = self._check(batch, index)
            yield (rows.pin(x), y.pin_memory()) if pin else (x, y)

    def _streamed(self, skip: int = 0) -> Iterator[Batch]:
        """Host batches, all but the first ``skip``, moved to the device; on CUDA the copy of the
        next batch runs on a side stream (pinned memory, non-blocking) while the current batch is
        being computed."""
        if self.device.type != "cuda":
            for x, y in self._host_batches(skip):
                yield self._move(x, y)
            return
        side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)

        def start(batch: Batch) -> Batch:
            with torch.cuda.stream(side):
                return self._move(*batch)

        source = self._host_batches(skip)
        ahead = next(source, None)
        pending = start(ahead) if ahead is not None else None
        while pending is not None:
            main.wait_stream(side)
            # allocated on the side stream, used on the main one
            for tensor in (*rows.tensors(pending[0]), pending[1]):
                tensor.record_stream(main)
            current = pending
            following = next(source, None)
            pending = start(following) if following is not None else None
            yield current

    def __iter__(self) -> Iterator[Batch]:
        return self.chunks_after(0)

    def chunks_after(self, skip: int) -> Iterator[Batch]:
        """The chunks a pass hands out, all but the first ``skip`` (those whose products come
        from kept graphs): batches made only of skipped chunks are passed over before they are
        moved to the device."""
        whole, inside = self._skipped(skip)
        if self.mode == "device":
            assert self._stored is not None
            batches: Iterable[Batch] = self._stored[whole:]
        else:
            batches = self._streamed(whole)
        for index, (x, y) in enumerate(batches):
            pieces = self._chunks(x, y)
            yield from itertools.islice(pieces, inside, None) if index == 0 else pieces

    def _skipped(self, skip: int) -> tuple[int, int]:
        """``skip`` chunks as (whole batches, chunks of the next batch)."""
        for batch, size in enumerate(self.sizes):
            count = 1 if self.limit is None or size <= self.limit else -(-size // self.limit)
            if skip < count:
                return batch, skip
            skip -= count
        return len(self.sizes), 0

    def first(self) -> Batch:
        """The first batch as a product would see it."""
        return next(iter(self))

    def originals(self) -> Iterator[Batch]:
        """The batches as the source gives them (host memory, unsplit), read afresh."""
        for index, batch in enumerate(self._fresh()):
            yield self._check(batch, index)
