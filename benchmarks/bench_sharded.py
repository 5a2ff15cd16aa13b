"""Per-product time and peak memory per rank, the model sharded (FSDP2, central differences)
against replicated (double backward, products all-reduced), on a small transformer classifier.

    python -m torch.distributed.run --standalone --nproc-per-node W benchmarks/bench_sharded.py

prints one line per rank: world size, mode, seconds per product (median of 3 after one warm-up),
peak resident memory (MiB, the process's maximum, so each mode runs in its own launch: pass
``sharded`` or ``replicated`` as the argument). ``sharded-gradient`` and
``replicated-gradient`` run plain gradient passes over the same batches instead of products
(seconds per pass, and the peak a product is compared with: a product's peak should stay within
2× a gradient pass's); ``sharded-idle`` and ``replicated-idle`` build the operator and stop
(the resident set every run starts from). On the sharded model the vectors are each rank's
slice of P/W values (``sharded``); ``sharded-whole`` multiplies whole P-long vectors instead
(the product's gradients all-gathered: the path before slices). ``BENCH_CHECKPOINT=1`` shards
with activation checkpointing (``--checkpoint-activations``).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from curvcal.curvature import build_operator
from curvcal.curvature.vectors import space_of
from curvcal.distributed import all_reduce_sum, leave, shard_indices
from curvcal.losses import loss_from_name
from curvcal.sharding import shard_model

#: ``BENCH_WIDTH`` widens the model (512: P = 12.6 M, where whole P-long vectors show in the peak)
WIDTH = int(os.environ.get("BENCH_WIDTH", "128"))
#: ``BENCH_CHECKPOINT=1``: the sharded model's blocks recompute their activations in the backward
CHECKPOINT = os.environ.get("BENCH_CHECKPOINT", "0") == "1"
#: ``BENCH_TOKENS``: tokens per sample (activations grow with it; the parameters do not)
TOKENS = int(os.environ.get("BENCH_TOKENS", "16"))
LAYERS, SAMPLES, BATCH = 4, 64, 16


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, activation="gelu",
                                       batch_first=True)
            for _ in range(LAYERS)
        )  # fmt: skip
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(dim=1))


def main(mode: str) -> None:
    torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29561")
        dist.init_process_group("gloo", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    measure(mode)
    leave()  # the sharded model's gloo work objects, unreachable now, freed while the group lives


def measure(mode: str) -> None:
    """This rank's line for ``mode`` (see the module docstring)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Classifier().eval()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, TOKENS, 8, generator=generator)
    y = torch.randint(0, 10, (SAMPLES,), generator=generator)
    mine = shard_indices(SAMPLES, rank, world)
    batches = [(x[mine][i : i + BATCH], y[mine][i : i + BATCH]) for i in range(0, len(mine), BATCH)]
    if mode.startswith("sharded"):
        shard_model(model, "blocks", torch.device("cpu"), checkpoint_activations=CHECKPOINT)
    loss = loss_from_name("ce", 0.0)
    vectors = "whole" if mode == "sharded-whole" else "sliced"
    operator = build_operator(model, loss, batches, all_reduce=all_reduce_sum, vectors=vectors)
    space = space_of(operator)  # this rank's slices on the sharded model, else whole vectors
    times: list[float] = []
    vector = (
        None
        if mode.endswith(("idle", "gradient"))
        else space.normal(torch.Generator().manual_seed(2), operator.dtype)
    )
    for _ in range(0 if mode.endswith("idle") else 4):
        began = time.perf_counter()
        if mode.endswith("gradient"):
            for xs, ys in batches:
                loss.sum(model(xs), ys).backward()
            model.zero_grad(set_to_none=True)
        else:
            assert vector is not None
            operator.matvec(vector)
        times.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"world={world} rank={rank} mode={mode} P={operator.shape[0]} "
          f"s_per_pass={statistics.median(times[1:]) if times else 0.0:.3f} peak_rss_MiB={peak:.0f} "
          f"vector={space.size} checkpoint={int(CHECKPOINT)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sharded")
