"""Half-precision accuracy: λmax of a model run in float16 or bfloat16 against the same model in
float64 (before its weights were rounded), on small architectures trained briefly in float64.

For each architecture (an MLP, a CNN, an MLP with LayerNorm, one- and two-block post-norm
transformers with attention and LayerNorm) and each seed, the model is trained with Adam on
random labels (memorised: large logits, sharp normalisations, as a trained network has), then
λmax is found by Lanczos in float64 (tol 1e-8) and in the half dtype (tol 1e-4). The table gives
the relative error in units of u = 2^−p and the bound curvcal states for the model
(:func:`curvcal.curvature.precision.accuracy_bound`: FLOOR_UNITS + NORMALISER_UNITS per
normalising layer), and whether the bound held. No timing: a measurement of accuracy.

    python benchmarks/bench_half_accuracy.py                 # float16, 6 seeds, two recipes
    python benchmarks/bench_half_accuracy.py --dtype bfloat16 --seeds 3
"""

from __future__ import annotations

import argparse
import copy
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from curvcal.curvature.api import hessian_operator
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.precision import accuracy_bound, normalisers


class Transformer(nn.Module):
    """Linear embedding, post-norm encoder blocks (self-attention, LayerNorm, GELU), a final
    LayerNorm, mean pool, head."""

    def __init__(self, blocks: int, width: int = 16, heads: int = 2, inputs: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.Sequential(
            *[
                nn.TransformerEncoderLayer(
                    width, heads, 2 * width, dropout=0.0, activation="gelu", batch_first=True
                )
                for _ in range(blocks)
            ]
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(x))).mean(1))


ARCHITECTURES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (
        lambda: nn.Sequential(
            nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)
        ),
        (6,),
    ),
    "cnn": (
        lambda: nn.Sequential(
            nn.Conv2d(2, 8, 3),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2),
            nn.Tanh(),
            nn.Flatten(),
            nn.Linear(32, 5),
        ),
        (2, 7, 7),
    ),
    "mlp+layernorm": (
        lambda: nn.Sequential(
            nn.Linear(6, 32),
            nn.LayerNorm(32),
            nn.GELU(),
            nn.Linear(32, 32),
            nn.LayerNorm(32),
            nn.GELU(),
            nn.Linear(32, 5),
        ),
        (6,),
    ),
    "transformer-1": (lambda: Transformer(1), (8, 6)),
    "transformer-2": (lambda: Transformer(2), (8, 6)),
}

#: (Adam steps, learning rate) of the brief training
RECIPES = ((30, 0.03), (60, 0.01))


def measure(name: str, seed: int, steps: int, lr: float, dtype: torch.dtype) -> dict[str, float]:
    """λmax in float64 and in ``dtype`` of architecture ``name`` trained ``steps`` Adam steps."""
    build, shape = ARCHITECTURES[name]
    torch.manual_seed(seed)
    model = build().double()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, *shape, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 5, (64,), generator=generator)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    model.eval()
    batches = [(x[:32], y[:32]), (x[32:], y[32:])]
    wide = eigenvalues(hessian_operator(model, batches, probe_batch=16), 1, tol=1e-8, seed=1)
    half = copy.deepcopy(model).to(dtype)
    narrow = eigenvalues(hessian_operator(half, batches, probe_batch=16), 1, tol=1e-4, seed=1)
    exact, value = wide.eigenvalues[0], narrow.eigenvalues[0]
    sample = x[:1].to(dtype)  # the normalising operations one forward pass executes
    return {
        "lambda_max": exact,
        "error": abs(value - exact) / abs(exact),
        "bound": accuracy_bound(dtype, half, sample),
        "normalisers": normalisers(half, sample),
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, object]]:
    """Print the table; returns its rows (architecture, recipe, worst and median error in u,
    bound in u, held)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--only", default=None, help="comma-separated architectures")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    u = torch.finfo(dtype).eps / 2
    names = args.only.split(",") if args.only else list(ARCHITECTURES)
    print(
        "| architecture | normalisers | bound (u) | recipe | worst error (u) | median (u) | held |"
    )
    print("|---|---:|---:|---|---:|---:|---|")
    table: list[dict[str, object]] = []
    for name in names:
        for steps, lr in RECIPES:
            rows = [measure(name, seed, steps, lr, dtype) for seed in range(args.seeds)]
            errors = sorted(row["error"] / u for row in rows)
            bound = rows[0]["bound"] / u
            print(
                f"| {name} | {rows[0]['normalisers']} | {bound:.0f} | {steps} steps, lr {lr:g} "
                f"| {errors[-1]:.1f} | {errors[len(errors) // 2]:.1f} | "
                f"{'yes' if errors[-1] <= bound else 'NO'} |",
                flush=True,
            )
            table.append(
                {"architecture": name, "steps": steps, "lr": lr, "worst": errors[-1],
                 "median": errors[len(errors) // 2], "bound": bound,
                 "held": errors[-1] <= bound}
            )  # fmt: skip
    return table


if __name__ == "__main__":
    main()
