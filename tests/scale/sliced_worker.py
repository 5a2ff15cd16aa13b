"""One rank of the sliced-vector check (run by tests/scale/test_sharded_vectors.py).

Under ``python -m torch.distributed.run --nproc-per-node W sliced_worker.py OUT DTYPE HOW``:
shard the transformer of :mod:`tests.scale.sharded_worker` with FSDP2, and write to
``OUT/rank{r}.pt`` λmax and the top 3 (Lanczos), the Hutchinson, Hutch++ and XTrace traces and
the first three SLQ moments with the vectors held a slice per rank, the top 3 eigenvectors as
rank 0 collects them a parameter at a time (the eigenvector file's path) and the longest
dimension made while collecting them, the top 3 and the Hutch++
trace with whole vectors (the path before slices), the length of this rank's vectors, and the
longest dimension of any tensor made while the sliced figures were computed. Imported without
torchrun, :func:`figures` gives one process's exact (double backward) figures.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from curvcal.curvature import build_operator, eigenvalues, spectral_density, trace_estimate
from curvcal.curvature.eigenvectors import TopEigenvectors
from curvcal.curvature.operator import HessianOperator
from curvcal.distributed import all_reduce_sum, init_from_env, shard_indices, shutdown
from curvcal.losses import loss_from_name
from curvcal.sharding import shard_model

try:  # run as a script by torchrun, or imported by the test
    from sharded_worker import BATCH, N_SAMPLES, TOLERANCE, make_problem  # type: ignore[import-not-found]
except ImportError:
    from .sharded_worker import BATCH, N_SAMPLES, TOLERANCE, make_problem

TRACES = {"hutchinson": 6, "hutchpp": 12, "xtrace": 12}


class LongestDimension(TorchDispatchMode):
    """Records the longest dimension of every tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.longest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, Tensor) and value.ndim:
                self.longest = max(self.longest, max(value.shape))
        return out


def _moments(density: Any) -> Tensor:
    """Σ_j w_j θ_j^k, k = 0, 1, 2, averaged over the runs (SLQ's estimates of tr(A^k)/P)."""
    total = torch.zeros(3, dtype=torch.float64)
    for nodes, weights in zip(density.nodes, density.weights, strict=True):
        theta, w = torch.tensor(nodes), torch.tensor(weights)
        total += torch.stack([(w * theta**k).sum() for k in range(3)])
    return total / len(density.nodes)


def figures(
    operator: HessianOperator, dtype: torch.dtype, vectors: list[Tensor] | None = None
) -> dict[str, Tensor]:
    """The figures of ``operator`` (a whole-vector one or a sliced one); ``vectors`` receives
    the top 3 eigenvectors as the operator's space holds them."""
    spectrum = eigenvalues(
        operator,
        3,
        tol=TOLERANCE[dtype],
        seed=3,
        on_vectors=None if vectors is None else vectors.append,
    )
    out = {"eigenvalues": torch.tensor(spectrum.eigenvalues, dtype=torch.float64)}
    for method, probes in TRACES.items():
        trace = trace_estimate(operator, probes, trace_method=method, seed=4, probe_batch=4)
        out[method] = torch.tensor([trace.estimate, trace.standard_error], dtype=torch.float64)
    density = spectral_density(operator, runs=2, steps=8, seed=5)
    out["moments"] = _moments(density)
    return out


def batches_of(x: Tensor, y: Tensor, indices: list[int]) -> list[tuple[Tensor, Tensor]]:
    xs, ys = x[indices], y[indices]
    return [(xs[i : i + BATCH], ys[i : i + BATCH]) for i in range(0, len(indices), BATCH)]


def main(out: Path, dtype_name: str, how: str) -> None:
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    context = init_from_env()
    try:
        model, x, y = make_problem(dtype)
        shard_model(model, how, torch.device("cpu"))
        indices = shard_indices(N_SAMPLES, context.rank, context.world_size)
        batches = batches_of(x, y, indices)
        loss = loss_from_name("ce", 0.0)
        sliced = build_operator(model, loss, batches, all_reduce=all_reduce_sum)
        space = sliced.vector_space  # type: ignore[attr-defined]
        kept: list[Tensor] = []
        with LongestDimension() as watch:
            result = figures(sliced, dtype, kept)
        top = TopEigenvectors(
            tuple(result["eigenvalues"].tolist()),
            tuple(sliced.param_names),
            tuple(p.shape for p in sliced.parameters),
            space,
            kept[0],
        )
        with LongestDimension() as streaming:  # the eigenvector file's path: a parameter at a time
            parts = list(top.per_parameter())
        if context.rank == 0:  # P × 3, made here only to be saved for the test
            result["streamed"] = torch.cat([part.reshape(3, -1) for _, part in parts], 1).T
        else:
            result["streamed_none"] = torch.tensor(all(part is None for _, part in parts))
        result["longest_streaming"] = torch.tensor(streaming.longest)
        whole = build_operator(model, loss, batches, all_reduce=all_reduce_sum, vectors="whole")
        result["whole_eigenvalues"] = torch.tensor(
            eigenvalues(whole, 3, tol=TOLERANCE[dtype], seed=3).eigenvalues, dtype=torch.float64
        )
        result["whole_hutchpp"] = torch.tensor(
            trace_estimate(whole, TRACES["hutchpp"], seed=4, probe_batch=4).estimate,
            dtype=torch.float64,
        )
        result["length"] = torch.tensor(space.size)
        result["n_params"] = torch.tensor(sliced.shape[0])
        result["longest"] = torch.tensor(watch.longest)
        torch.save(result, out / f"rank{context.rank}.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
