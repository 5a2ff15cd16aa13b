"""One process or many: the device a run uses, the process group under torchrun, and the
pass that predicts every sample of a dataset (each rank its shard, gathered on rank 0)."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from curvcal.errors import InputError

if TYPE_CHECKING:
    import torch

    from curvcal.console import StepCallback
    from curvcal.distributed import DistContext
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData


@contextmanager
def distributed_run(device_option: str) -> Iterator[tuple[torch.device, DistContext]]:
    """The device named by ``--device`` and this process's place among torchrun's ranks.

    ``auto`` and ``cuda`` become ``cuda:LOCAL_RANK`` under torchrun (one GPU per process on a
    machine), which is made the current CUDA device before the process group (NCCL on CUDA,
    gloo otherwise) is joined; in one process the context is rank 0 of 1. The group is left
    when the block ends, after every rank gets there; when the block fails on one rank, that
    rank's error (naming it) is announced to the others, which stop at once
    (:func:`curvcal.distributed.announce_failure`), and raised here.
    """
    import torch

    from curvcal import distributed
    from curvcal.load.checkpoints.device import resolve_device

    device = resolve_device(device_option)
    if device_option.strip().lower() in ("auto", "cuda"):
        device = distributed.local_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    context = None
    try:
        context = distributed.init_from_env(device)
        yield device, context
    except Exception as exc:
        if context is None or not context.active:
            distributed.leave()
            raise
        # every rank learns of it and stops; this one says which rank it is
        if "--debug" in sys.argv or os.environ.get("CURVCAL_DEBUG"):
            traceback.print_exc()
        error = distributed.rank_error(exc, context.rank)
        distributed.announce_failure(error)
        distributed.leave()
        raise error from exc
    distributed.shutdown()


def shard(data: LoadedData, context: DistContext, option: str = "--data") -> list[int] | None:
    """This rank's sample indices (``None``, all of them, in one process); refuses a dataset
    smaller than the number of processes, since every rank needs a sample."""
    from curvcal.distributed import shard_indices

    if not context.active:
        return None
    if data.n_samples < context.world_size:
        raise InputError(
            f"{option} {data.spec}",
            f"{data.n_samples} samples cannot be shared among {context.world_size} processes",
            "run fewer processes",
        )
    return shard_indices(data.n_samples, context.rank, context.world_size)


def predict(
    loaded: LoadedModel,
    data: LoadedData,
    batch_size: int,
    on_step: StepCallback | None = None,
    option: str = "--data",
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Logits and labels of every sample of ``data``, in dataset order.

    Under torchrun each rank predicts its shard and rank 0 gets them all (``None`` on the other
    ranks); in one process, one pass over all samples. ``on_step`` gets each batch's size.
    """
    from curvcal.distributed import current, gather_rows
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.pipeline.inference import predict_logits
    from curvcal.sharding import is_sharded

    context = current()
    indices = shard(data, context, option)
    # a sharded model's forwards are collectives: as many on every rank, agreed before any
    missing = missing_batches(data, batch_size, indices) if is_sharded(loaded.module) else 0
    logits, labels = predict_logits(
        loaded.module, iter_batches(data.dataset, batch_size, indices), loaded.device, on_step
    )
    pad_predictions(loaded, data, batch_size, indices, missing)
    all_logits = gather_rows(logits, data.n_samples)
    all_labels = gather_rows(labels, data.n_samples)
    if all_logits is None or all_labels is None:
        return None
    return all_logits, all_labels


def missing_batches(data: LoadedData, batch_size: int, indices: list[int] | None) -> int:
    """How many batches fewer than the busiest rank this rank has (agreed by an all-reduce,
    which every rank must reach before its first forward)."""
    from curvcal.sharding import agreed_count

    count = len(indices) if indices is not None else data.n_samples
    mine = -(-count // batch_size)
    return agreed_count(mine) - mine


def pad_predictions(
    loaded: LoadedModel,
    data: LoadedData,
    batch_size: int,
    indices: list[int] | None,
    missing: int,
) -> None:
    """The ``missing`` forwards of a sharded model this rank owes the others (each forward
    gathers the parameters from every rank), run on this rank's first batch and dropped."""
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.pipeline.inference import predict_logits

    if not missing:
        return
    # the first batch is at most the data (never a list of --batch-size numbers: a batch size
    # of 10**9 on 797 samples made one of a billion)
    first = indices[:batch_size] if indices is not None else range(min(batch_size, data.n_samples))
    for _ in range(missing):
        predict_logits(loaded.module, iter_batches(data.dataset, batch_size, first), loaded.device)
