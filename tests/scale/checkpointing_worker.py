"""One rank of the activation-checkpointing check (run by
tests/scale/test_sharded_checkpointing.py).

Under ``python -m torch.distributed.run --nproc-per-node 2 checkpointing_worker.py OUT``: the
small float64 transformer of :mod:`tests.scale.sharded_worker` sharded per block twice, without
and with ``checkpoint_activations``; for each, the figures of
:func:`~tests.scale.sharded_worker.measure`, its parameter names, and the number of values the
autograd graph keeps outside checkpointed units in one forward on this rank's first batch,
written to ``OUT/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from curvcal.distributed import init_from_env, shard_indices, shutdown
from curvcal.sharding import shard_model
from tests.scale.sharded_worker import BATCH, N_SAMPLES, make_problem, measure


def kept_values(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """How many values one forward's graph saves for the backward, outside checkpointed units
    (their own saved-tensor hooks take those); the backward then runs (a collective)."""
    kept = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += tensor.numel()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
    loss.backward()
    model.zero_grad(set_to_none=True)
    return kept


def main(out: Path) -> None:
    torch.set_num_threads(1)
    context = init_from_env()
    try:
        indices = shard_indices(N_SAMPLES, context.rank, context.world_size)
        results = {}
        for checkpointed in (False, True):
            model, x, y = make_problem(torch.float64)
            shard_model(model, "blocks", torch.device("cpu"), checkpoint_activations=checkpointed)
            figures = measure(model, x, y, indices, sharded=True)
            figures["names"] = [name for name, _ in model.named_parameters()]  # type: ignore[assignment]
            figures["kept"] = torch.tensor(
                kept_values(model, x[indices][:BATCH], y[indices][:BATCH])
            )
            results["checkpointed" if checkpointed else "plain"] = figures
        torch.save(results, out / f"rank{context.rank}.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
