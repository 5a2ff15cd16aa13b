"""torch.distributed helpers: who am I, which samples are mine, and exact sums across ranks.

Launched by ``torchrun --nproc-per-node N -m curvcal ...``, every rank takes the samples
``r, r + W, r + 2W, ...`` of the dataset (no padding: ``DistributedSampler`` repeats samples to
even out shards, which would make an all-reduced Hessian-vector product wrong) and sums of
per-rank partial results are all-reduced. Without torchrun everything degrades to one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    """Rank and world size of this process (``rank = 0, world_size = 1`` when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """True when torchrun (or ``torch.distributed.run``) set the rendezvous variables."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def init_from_env(device: torch.device | None = None) -> DistContext:
    """Join the process group torchrun describes; one-process context otherwise.

    Backend: NCCL when the device is CUDA, gloo otherwise (CPU, or the tests).
    """
    if not launched_by_torchrun():
        return DistContext()
    if not dist.is_initialized():
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return current()


def local_device(device: torch.device) -> torch.device:
    """Under torchrun, a CUDA device given without an index becomes ``cuda:LOCAL_RANK`` (one GPU
    per process on a machine); anything else is returned unchanged."""
    if not launched_by_torchrun() or device.type != "cuda":
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def current() -> DistContext:
    """The context of an already initialised process group (or the one-process context)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        backend=str(dist.get_backend()),
    )


def shard_indices(n_samples: int, rank: int, world_size: int) -> list[int]:
    """Indices of rank ``rank``: ``rank, rank + W, ...`` below ``n_samples``; shards are disjoint,
    cover every index once, and are never padded (a rank may get one sample fewer, or none)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of size {world_size}")
    return list(range(rank, n_samples, world_size))


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over all ranks (a new tensor; the argument is not modified).

    In one process this is a copy. Pass it as the ``all_reduce`` hook of the curvature operator.
    """
    total = tensor.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def gather_rows(local: torch.Tensor, n_samples: int) -> torch.Tensor | None:
    """Put every rank's shard of rows back together, in dataset order, on rank 0.

    Rank ``r`` holds the rows of the samples :func:`shard_indices` gives it (in that order);
    rank 0 gets the ``(n_samples, ...)`` tensor, the other ranks ``None``. Shards are padded to
    the longest one for one ``all_gather`` and the padding is dropped. Every rank needs at least
    one row (so that the trailing shape and dtype agree). In one process this returns ``local``.
    """
    context = current()
    if not context.active:
        return local
    world = context.world_size
    longest = -(-n_samples // world)
    if local.shape[0] != len(shard_indices(n_samples, context.rank, world)) or n_samples < world:
        raise ValueError(f"rank {context.rank}: {local.shape[0]} rows for a shard of {n_samples}")
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if context.backend == "nccl"
        else torch.device("cpu")
    )
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=device)
    padded[: local.shape[0]] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    if not context.is_main:
        return None
    out = torch.empty((n_samples, *local.shape[1:]), dtype=local.dtype)
    for rank, part in enumerate(parts):
        rows = shard_indices(n_samples, rank, world)
        out[rows] = part[: len(rows)].cpu()
    return out


def shutdown(timeout_s: float = 60.0) -> None:
    """Leave the process group if this process joined one, after the other ranks get here.

    Tearing the group down while another rank is still using it can abort that rank ("terminate
    called without an active exception" from gloo), so every rank first waits at a barrier; under
    gloo it is a monitored barrier with a timeout, so a rank that crashed cannot hang the others.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        else:
            dist.barrier()
    except Exception:  # a rank is gone: leave anyway, the run has already failed
        pass
    finally:
        dist.destroy_process_group()
