"""The central-difference (sharded-model) product against exact double backward: per model and
dtype, every product of a Lanczos run (top 3, tol 1e-4) and of ``--gaussian`` Gaussian vectors
compared with the exact float64 product, the share within the bound the operator states
(b·‖H‖·‖v‖, b = ``product_error``, ‖H‖ the exact λmax; a Gaussian vector's b·‖Hv‖, b =
``own_error``), the worst error in units of that bound, the Gaussian products whose five-point
error, predicted as taken, was over b·‖Hv‖ at their best step, the gradient passes a product
(every pass the operator took, its start included, over its products), λmax's relative error,
and the wall time of a λmax run from a fresh operator (the least of ``--repeats``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_central_steps.py [--gaussian 30] [--repeats 3]

One process: the operator is built on the unsharded model (each rank of a sharded one takes the
same rule, from figures summed over the ranks). The models: a two-block GELU transformer
classifier with LayerNorm, a tanh MLP and a softplus MLP, 37 samples in batches of 9.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.curvature import eigenvalues
from curvcal.curvature.central_difference import CentralDifferenceOperator

try:  # the eigenvalue stage's products, as the pipeline takes them
    from curvcal.curvature.central_difference import eigenvalue_products
except ImportError:  # a checkout before the per-product rule: every product alike

    def eigenvalue_products(operator: object) -> AbstractContextManager[None]:
        return nullcontext()


from curvcal.curvature import build_operator
from curvcal.losses import loss_from_name

N_SAMPLES, BATCH, CLASSES = 37, 9, 3
Problem = Callable[[torch.dtype], tuple[nn.Module, Tensor, Tensor]]


class Transformer(nn.Module):
    """Two encoder blocks (GELU, LayerNorm), mean-pooled, a linear head."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(5, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, 2, 12, dropout=0.0, activation="gelu", batch_first=True
            )
            for _ in range(2)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(dim=1))


def transformer(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = Transformer().to(dtype).eval()
    with torch.no_grad():
        model.head.weight.mul_(4.0)  # confident enough for curvature
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 4, 5, generator=generator, dtype=torch.float64).to(dtype)
    y = torch.randint(0, CLASSES, (N_SAMPLES,), generator=generator)
    return model, x, y


def mlp(activation: type[nn.Module]) -> Problem:
    def make(dtype: torch.dtype) -> tuple[nn.Module, Tensor, Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(6, 16), activation(), nn.Linear(16, 16), activation(), nn.Linear(16, CLASSES)
        )
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(N_SAMPLES, 6, generator=generator, dtype=torch.float64).to(dtype)
        y = torch.randint(0, CLASSES, (N_SAMPLES,), generator=generator)
        return model.to(dtype).eval(), x, y

    return make


PROBLEMS: dict[str, Problem] = {
    "transformer": transformer,
    "tanh-mlp": mlp(nn.Tanh),
    "softplus-mlp": mlp(nn.Softplus),
}


def _batches(x: Tensor, y: Tensor) -> list[tuple[Tensor, Tensor]]:
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]


def _operator(make: Problem, dtype: torch.dtype) -> CentralDifferenceOperator:
    model, x, y = make(dtype)
    return CentralDifferenceOperator(model, _batches(x, y), loss_from_name("ce", 0.0))


def measure(name: str, dtype: torch.dtype, gaussian: int = 30) -> dict[str, Any]:
    """The row of one model and dtype (module docstring), without the timing."""
    make = PROBLEMS[name]
    model, x, y = make(torch.float64)
    exact = build_operator(model, loss_from_name("ce", 0.0), _batches(x, y))
    top = eigenvalues(exact, 1, tol=1e-10, seed=3).eigenvalues[0]
    operator = _operator(make, dtype)
    seen: list[tuple[Tensor, Tensor]] = []
    product = operator._product

    def kept(block: Tensor, total: Tensor | None = None) -> Tensor:
        out = product(block, total)
        columns = range(block.shape[1])  # copies: the operator reuses its buffers
        seen.extend((block[:, j].double().clone(), out[:, j].double().clone()) for j in columns)
        return out

    operator._product = kept  # type: ignore[method-assign]
    with eigenvalue_products(operator):
        spectrum = eigenvalues(operator, 3, tol=1e-4, seed=3)
    lanczos = len(seen)
    passes = [operator.n_data_passes]  # the eigenvalue stage's, its start included
    generator = torch.Generator().manual_seed(11)
    for _ in range(gaussian):
        vector = torch.randn(operator.shape[0], generator=generator, dtype=torch.float64)
        operator.matvec(vector.to(dtype))
    bound = operator.product_error
    errors = [(float((got - exact.matvec(v)).norm()), v) for v, got in seen]
    # the eigenvalue stage's in units of b·‖H‖‖v‖ (what its rules allow for), the Gaussian
    # vectors' in units of b·‖Hv‖ (the product's own norm: what a trace needs)
    over_norm = [error / (bound * top * float(v.norm())) for error, v in errors[:lanczos]]
    own = getattr(operator, "own_error", bound)  # b, relative to ‖Hv‖ (b' ≥ b: ‖H‖‖v‖)
    over_own = [error / (own * float(exact.matvec(v).norm())) for error, v in errors[lanczos:]] or [
        0.0
    ]
    return {
        "model": name,
        "dtype": str(dtype).removeprefix("torch."),
        "products": len(seen),
        "lanczos": lanczos,
        "within_bound": sum(r <= 1.0 for r in over_norm),
        "worst_over_bound": max(over_norm),
        "within_own": sum(r <= 1.0 for r in over_own),
        "worst_over_own": max(over_own),
        "passes_per_product": passes[0] / lanczos,
        "gaussian_passes_per_product": (operator.n_data_passes - passes[0]) / max(gaussian, 1),
        "lambda_max_error": abs(spectrum.eigenvalues[0] - top) / top,
        "rules": dict(getattr(operator, "rule_counts", {})),
        # five-point products whose error predicted as taken was over b·‖Hv‖ at their best step
        "predicted_over_own": getattr(getattr(operator, "control", None), "over_bound", None),
    }


def seconds(name: str, dtype: torch.dtype) -> float:
    """The wall time of a λmax run (tol 1e-4) from a fresh operator, its start included."""
    began = time.perf_counter()
    operator = _operator(PROBLEMS[name], dtype)
    with eigenvalue_products(operator):
        eigenvalues(operator, 1, tol=1e-4, seed=3)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gaussian", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=list(PROBLEMS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| model | dtype | eigenvalue products within b‖H‖‖v‖ | worst | passes a product "
        "| Gaussian products within b‖Hv‖ | worst | passes a product | predicted over b‖Hv‖ "
        "| λmax rel. error | λmax run s (min) | rules |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        for dtype in (torch.float32, torch.float64):
            row = measure(name, dtype, args.gaussian)
            wall = min(seconds(name, dtype) for _ in range(args.repeats))
            print(
                f"| {name} | {row['dtype']} | {row['within_bound']}/{row['lanczos']} | "
                f"{row['worst_over_bound']:.2g} | {row['passes_per_product']:.2f} | "
                f"{row['within_own']}/{args.gaussian} | {row['worst_over_own']:.2g} | "
                f"{row['gaussian_passes_per_product']:.2f} | {row['predicted_over_own']} | "
                f"{row['lambda_max_error']:.1e} | {wall:.2f} | "
                f"{row['rules'] or '—'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
