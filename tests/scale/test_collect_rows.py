"""collect_rows on real gloo ranks: rank 0 gets one parameter's whole rows back in order from
the ranks' runs (FSDP2's split along dimension 0), also when there are more ranks than rows
(empty runs) and for 16-bit vectors; the other ranks get None."""

from __future__ import annotations

import math
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from curvcal.sharding import collect_rows

WORLD = 3
#: (parameter shape, dtype): 2 rows over 3 ranks leaves rank 2 an empty run
CASES = [((2, 3), torch.float64), ((7, 2), torch.float32), ((5,), torch.bfloat16)]
M = 2  # eigenvectors: columns of the block


def _whole(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = math.prod(shape)
    return torch.arange(numel * M, dtype=torch.float64).reshape(numel, M).to(dtype)


def _run(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )  # a rank left waiting fails the test instead of hanging it
    try:
        got = []
        for shape, dtype in CASES:
            rows = -(-shape[0] // WORLD)  # torch.chunk's split, as FSDP2's
            per_row = math.prod(shape[1:])
            start = min(shape[0], rank * rows) * per_row
            stop = min(shape[0], (rank + 1) * rows) * per_row
            got.append(collect_rows(_whole(shape, dtype)[start:stop], math.prod(shape)))
        torch.save(got, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rank_zero_gets_the_whole_rows_with_empty_runs(tmp_path: Path) -> None:
    mp.start_processes(_run, args=(_free_port(), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for (shape, dtype), got in zip(CASES, results[0], strict=True):
        assert got.dtype == dtype and torch.equal(got, _whole(shape, dtype))
    assert all(part is None for r in range(1, WORLD) for part in results[r])
