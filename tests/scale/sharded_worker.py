"""One rank of the sharded-model check (run by tests/scale/test_sharded.py).

Under ``python -m torch.distributed.run --nproc-per-node W sharded_worker.py OUT DTYPE HOW``:
join a gloo group, shard a small transformer classifier with FSDP2 (``HOW``: blocks or modules),
take the samples ``rank, rank + W, …`` of a 37-sample dataset, and write what the sharded model
gives (λmax and the top 3 by Lanczos, the Hutchinson trace, one product, the calibration
metrics of its predictions, the product's error estimate) to ``OUT/rank{r}.pt``. Imported
without torchrun, :func:`measure` gives the one-process figures by exact double backward.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import Tensor, nn

from curvcal.calibration.metrics import (
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
)
from curvcal.curvature import build_operator, eigenvalues, hutchinson_trace
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.vectors import SlicedSpace, space_of
from curvcal.distributed import all_reduce_sum, gather_rows, init_from_env, shard_indices, shutdown
from curvcal.losses import loss_from_name
from curvcal.sharding import agreed_count, pad_forwards, shard_model

N_SAMPLES = 37  # shards of 19/18 (2 ranks) and 10/9/9/9 (4 ranks)
BATCH = 9  # 3 batches against 2 (2 ranks), 2 against 1 (4 ranks): padding passes are needed
#: the eigenvalues' tolerance per dtype (a float32 product is good to about 1e-5)
TOLERANCE = {torch.float64: 1e-7, torch.float32: 3e-5}
TOKENS, WIDTH, CLASSES = 4, 8, 3


class Classifier(nn.Module):
    """Two transformer encoder blocks (GELU: central differences need a smooth loss), mean-pooled, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(5, WIDTH)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                WIDTH, 2, 12, dropout=0.0, activation="gelu", batch_first=True
            )
            for _ in range(2)
        )
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(dim=1))


def make_problem(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = Classifier().to(dtype).eval()
    with torch.no_grad():
        model.head.weight.mul_(4.0)  # confident enough for curvature and calibration
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, TOKENS, 5, generator=generator, dtype=torch.float64).to(dtype)
    y = torch.randint(0, CLASSES, (N_SAMPLES,), generator=generator)
    return model, x, y


def _product(operator: HessianOperator, vector: Tensor) -> Tensor:
    """H·v for a whole v; on a sharded model each rank multiplies its slice of v (its rows of
    each parameter) and the slices of the product are gathered whole."""
    space = space_of(operator)
    if not space.sliced:
        return operator.matvec(vector)
    assert isinstance(space, SlicedSpace)
    offset, local = 0, []
    for numel, start, stop in space.pieces:
        local.append(vector[offset + start : offset + stop])
        offset += numel
    return space.whole(operator.matvec(torch.cat(local)).reshape(-1, 1)).reshape(-1)


def measure(
    model: nn.Module, x: Tensor, y: Tensor, indices: list[int], sharded: bool
) -> dict[str, Tensor]:
    """The figures of ``model`` on the samples ``indices`` (this rank's), summed over ranks."""
    xs, ys = x[indices], y[indices]
    batches = [(xs[i : i + BATCH], ys[i : i + BATCH]) for i in range(0, len(indices), BATCH)]
    operator = build_operator(
        model, loss_from_name("ce", 0.0), batches, all_reduce=all_reduce_sum if sharded else None
    )
    kept: list[Tensor] = []
    spectrum = eigenvalues(operator, 3, tol=TOLERANCE[x.dtype], seed=3, on_vectors=kept.append)
    trace = hutchinson_trace(operator, 6, seed=4)
    vector = torch.randn(
        operator.shape[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64
    ).to(x.dtype)
    figures = {
        "product": _product(operator, vector).to(torch.float64),
        "eigenvalues": torch.tensor(spectrum.eigenvalues, dtype=torch.float64),
        "trace": torch.tensor(trace.estimate, dtype=torch.float64),
        "n_samples": torch.tensor(operator.n_samples),
    }
    # every rank runs as many forwards as the busiest (agreed before any: each is a gather)
    missing = agreed_count(len(batches)) - len(batches) if sharded else 0
    with torch.no_grad():
        logits = torch.cat([model(bx) for bx, _ in batches])
        pad_forwards(lambda: model(batches[0][0]), missing)
    every = gather_rows(logits, N_SAMPLES) if sharded else logits
    labels = gather_rows(ys, N_SAMPLES) if sharded else ys
    if every is not None and labels is not None:
        scores = every.to(torch.float64)
        figures["logits"] = scores
        for name, metric in (
            ("ece", expected_calibration_error),
            ("nll", negative_log_likelihood),
            ("brier", brier_score),
        ):
            figures[name] = torch.tensor(metric(scores, labels), dtype=torch.float64)
    if sharded:
        estimate = operator.error_estimate(seed=6)  # type: ignore[attr-defined]
        figures["error_bound"] = torch.tensor(estimate.bound, dtype=torch.float64)
        figures["truncation"] = torch.tensor(estimate.truncation, dtype=torch.float64)
        # along the top eigenvector, where the product's error is largest: the estimate, and
        # the vector and the product along it (whole) for the test to measure the true error
        top = kept[0][:, :1]
        along = operator.error_estimate(seed=6, vector=top[:, 0])  # type: ignore[attr-defined]
        figures["top_error_bound"] = torch.tensor(along.bound, dtype=torch.float64)
        figures["top_truncation"] = torch.tensor(along.truncation, dtype=torch.float64)
        whole_top = space_of(operator).whole(top)[:, 0]
        figures["top_vector"] = whole_top.to(torch.float64)
        figures["top_product"] = _product(operator, whole_top).to(torch.float64)
        figures["floor"] = torch.tensor(spectrum.precision_floor, dtype=torch.float64)
        figures["converged"] = torch.tensor(spectrum.converged)
    return figures


def main(out: Path, dtype_name: str, how: str) -> None:
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    context = init_from_env()
    try:
        model, x, y = make_problem(dtype)
        shard_model(model, how, torch.device("cpu"))
        indices = shard_indices(N_SAMPLES, context.rank, context.world_size)
        figures = measure(model, x, y, indices, sharded=True)
        torch.save(figures, out / f"rank{context.rank}.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
