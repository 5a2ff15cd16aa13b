"""One rank of the two-process Hessian check (run by tests/scale/test_distributed.py).

Under ``python -m torch.distributed.run --nproc-per-node W dist_worker.py OUT``: join a gloo
group, take the samples ``rank, rank + W, …`` of a 51-sample dataset, and write what the
all-reduced operator gives (one product, λmax, the Hutchinson trace) to ``OUT/rank{r}.pt``.
Imported without torchrun, :func:`measure` gives the one-process figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import Tensor, nn

from curvcal.curvature import eigenvalues, hutchinson_trace
from curvcal.curvature.batches import AllReduce
from curvcal.curvature.operator import HessianOperator
from curvcal.distributed import all_reduce_sum, init_from_env, shard_indices, shutdown

N_SAMPLES = 51  # odd: the two shards differ in size
BATCH = 7  # shards of 26 and 25 samples split unevenly


def make_problem() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 4)).double()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 6, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 4, (N_SAMPLES,), generator=generator)
    return model, x, y


def operator_on(indices: list[int], all_reduce: AllReduce | None) -> HessianOperator:
    """The Hessian operator on the samples ``indices``, in batches of ``BATCH``."""
    model, x, y = make_problem()
    xs, ys = x[indices], y[indices]
    batches = [(xs[i : i + BATCH], ys[i : i + BATCH]) for i in range(0, len(indices), BATCH)]
    return HessianOperator(model, batches, all_reduce=all_reduce)


def measure(indices: list[int], all_reduce: AllReduce | None) -> dict[str, Tensor]:
    operator = operator_on(indices, all_reduce)
    vector = torch.randn(
        operator.shape[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64
    )
    spectrum = eigenvalues(operator, 1, tol=1e-10, seed=3)
    trace = hutchinson_trace(operator, 24, seed=4)
    return {
        "n_samples": torch.tensor(operator.n_samples),
        "product": operator.matvec(vector),
        "lambda_max": torch.tensor(spectrum.eigenvalues[0], dtype=torch.float64),
        "trace": torch.tensor(trace.estimate, dtype=torch.float64),
    }


def main(out: Path) -> None:
    torch.set_num_threads(1)
    context = init_from_env()
    try:
        indices = shard_indices(N_SAMPLES, context.rank, context.world_size)
        figures = measure(indices, all_reduce_sum)
        figures["n_local"] = torch.tensor(len(indices))
        torch.save(figures, out / f"rank{context.rank}.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
