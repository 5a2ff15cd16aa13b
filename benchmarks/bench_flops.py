"""The arithmetic of one Hessian-vector product against one gradient pass, counted, not timed.

``torch.utils.flop_counter.FlopCounterMode`` counts the floating-point operations of the
matrix products, convolutions and attention an autograd call dispatches (2·m·n·k for an m×k by
k×n product; elementwise work is not counted: it is a few percent of these models' time). For
each case it counts, over the same batches:

* ``forward``: the loss alone (its graph built and dropped);
* ``gradient``: one gradient of the summed loss (the floor a product is compared with);
* ``double backward``: the textbook product, per batch ``grad(create_graph=True)`` then
  ``grad(g, params, grad_outputs=v)``;
* ``second backward``: the last step alone, through a graph built beforehand (what a product
  through kept graphs costs);
* ``curvcal rebuilt``, ``curvcal func``, ``curvcal kept``: one ``HessianOperator.matvec`` with
  ``keep_graphs="never"`` (engine ``autograd``), with engine ``func`` (forward-over-reverse,
  ``torch.func.jvp`` of ``torch.func.grad``) and with ``keep_graphs="always"`` (its graphs built
  by a first product, which is not counted).

A count is the same on every machine and in every run; a time is not. The ratio of an exact
product to a gradient pass is fixed by this arithmetic: where a product is dominated by
bilinear operations (a convolution or a matrix product of an activation and a weight), a
gradient is one forward and two backward products per layer (3 units), and an exact product
that rebuilds the graph is 9 units by either engine (reverse-over-reverse: 1 + 2 + 4 + 2; forward-
over-reverse: 3 + 6), so about 3× a gradient; through a kept graph the second backward alone is
about 2×. Attention adds products of two activations, which change the count a little.

With ``--lambda-seeds 0,1,2`` it also counts whole λ1 runs from each seed's start vector:
curvcal's float32 Lanczos at tol 1e-4 and 1e-6 (its default operator: graphs kept where the
budget allows, the graphs' construction and the verifying product included) and PyHessian's
``eigenvalues(tol=1e-4)`` (power iteration; with a data loader it rebuilds every batch's graph
for every product), as ``bench_hessian.py`` runs them. Their ratio is the share of arithmetic,
the time ratio that a machine with no other cost than these operations would show.

Cases: ``mlp`` and ``digits-cnn`` (797 bundled digits in batches of 100, as in
``bench_hessian.py``), ``resnet18`` and ``vit`` (64 CIFAR-size images in batches of 32),
``tiny`` (a 6-5-3 tanh MLP on 60 samples).

Usage::

    python benchmarks/bench_flops.py [--cases mlp,digits-cnn,resnet18,vit] [--quick]
        [--lambda-seeds 0,1,2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_hessian

from curvcal.curvature.operator import HessianOperator

CASES = ("mlp", "digits-cnn", "resnet18", "vit")
STEPS = (
    "forward",
    "gradient",
    "double backward",
    "second backward",
    "curvcal rebuilt",
    "curvcal func",
    "curvcal kept",
)

Batches = Sequence[tuple[Tensor, Tensor]]


def count(step: Callable[[], Any]) -> int:
    """Floating-point operations of ``step``, attention by its composite ("math") kernel, which is
    the one a second derivative runs through."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(model(x), y, reduction="sum")


def steps_of(model: nn.Module, batches: Batches, vector: Tensor) -> dict[str, Callable[[], Any]]:
    """The counted steps of the module docstring for ``model`` on ``batches`` and tangent
    ``vector`` (P values). Graphs that a step only reads are built here, outside the count."""
    params = [p for p in model.parameters() if p.requires_grad]
    pieces = [
        piece.reshape(p.shape)
        for piece, p in zip(vector.split([p.numel() for p in params]), params, strict=True)
    ]

    def forward() -> None:  # with a graph: no_grad would let attention take a fused fast path
        for x, y in batches:
            _loss(model, x, y)

    def gradient() -> None:
        for x, y in batches:
            torch.autograd.grad(_loss(model, x, y), params)

    def double_backward() -> None:
        for x, y in batches:
            grads = torch.autograd.grad(_loss(model, x, y), params, create_graph=True)
            torch.autograd.grad(grads, params, grad_outputs=pieces)

    with sdpa_kernel(SDPBackend.MATH):
        kept_grads = [
            torch.autograd.grad(_loss(model, x, y), params, create_graph=True) for x, y in batches
        ]

    def second_backward() -> None:
        for grads in kept_grads:
            torch.autograd.grad(grads, params, grad_outputs=pieces, retain_graph=True)

    rebuilt = HessianOperator(model, list(batches), hvp="autograd", keep_graphs="never")
    kept = HessianOperator(model, list(batches), hvp="autograd", keep_graphs="always")
    kept.matvec(vector)  # builds the kept graphs
    steps: dict[str, Callable[[], Any]] = {
        "forward": forward,
        "gradient": gradient,
        "double backward": double_backward,
        "second backward": second_backward,
        "curvcal rebuilt": lambda: rebuilt.matvec(vector),
        "curvcal kept": lambda: kept.matvec(vector),
    }
    try:
        func = HessianOperator(model, list(batches), hvp="func", keep_graphs="never")
        func.matvec(vector)  # traces torch.func once, outside the count
        steps["curvcal func"] = lambda: func.matvec(vector)
    except (RuntimeError, NotImplementedError) as error:  # an operator with no forward rule
        print(
            f"bench_flops: engine func unavailable: {str(error).splitlines()[0]}", file=sys.stderr
        )
    return {name: steps[name] for name in STEPS if name in steps}


def measure(model: nn.Module, batches: Batches, seed: int = 0) -> dict[str, Any]:
    """Counts of every step, and each count over the gradient's."""
    model = model.eval()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    vector = torch.randn(n_params, generator=torch.Generator().manual_seed(seed))
    counts = {name: count(step) for name, step in steps_of(model, batches, vector).items()}
    per_gradient = {name: flops / counts["gradient"] for name, flops in counts.items()}
    return {"n_params": n_params, "flops": counts, "per_gradient": per_gradient}


LAMBDA_RUNS = ("curvcal tol 1e-4", "curvcal tol 1e-6", "PyHessian tol 1e-4")


def lambda_counts(case: Any, seeds: Sequence[int], gradient: int) -> list[dict[str, Any]]:
    """Per seed and run of :data:`LAMBDA_RUNS`: λ1, products and counted operations (also over
    one ``gradient``); PyHessian's row only where it is installed."""
    runs = {
        "curvcal tol 1e-4": bench_hessian.curvcal_lambda("lanczos", 1e-4, torch.float32),
        "curvcal tol 1e-6": bench_hessian.curvcal_lambda("lanczos", 1e-6, torch.float32),
    }
    if bench_hessian.peer_available("pyhessian"):
        runs["PyHessian tol 1e-4"] = bench_hessian.pyhessian_lambda(1000, 1e-4)
    rows = []
    for seed in seeds:
        for name, run in runs.items():
            outcome: list[Any] = []
            flops = count(lambda run=run, seed=seed, out=outcome: out.append(run(case, seed)))
            rows.append(
                {
                    "seed": seed,
                    "run": name,
                    "lambda_max": outcome[0].value,
                    "products": outcome[0].hvps,
                    "flops": flops,
                    "per_gradient": flops / gradient,
                }
            )
    return rows


def lambda_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | seed | run | λ1 | products | operations / gradient | / PyHessian's |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        for run in row.get("lambda", []):
            peer = next(
                (
                    other["flops"]
                    for other in row["lambda"]
                    if other["seed"] == run["seed"] and other["run"] == "PyHessian tol 1e-4"
                ),
                None,
            )
            share = f"{run['flops'] / peer:.2f}" if peer else "—"
            lines.append(
                f"| {row['case']} | {run['seed']} | {run['run']} | {run['lambda_max']:.6f} | "
                f"{run['products']} | {run['per_gradient']:.1f} | {share} |"
            )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    head = "| case | P | gradient GFLOP | " + " | ".join(
        f"{name} / gradient" for name in STEPS if name != "gradient"
    )
    lines = [head + " |", "|---|---:|---:|" + "---:|" * (len(STEPS) - 1)]
    for row in rows:
        ratios = row["per_gradient"]
        cells = [
            f"{ratios[name]:.2f}" if name in ratios else "—" for name in STEPS if name != "gradient"
        ]
        lines.append(
            f"| {row['case']} | {row['n_params']:,} | {row['flops']['gradient'] / 1e9:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="fewer samples (197 digits, 8 images)")
    parser.add_argument(
        "--lambda-seeds", default="", help="count whole λ1 runs from these seeds (comma-separated)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.lambda_seeds.split(",") if seed]
    rows = []
    for name in args.cases.split(","):
        case = bench_hessian.build_case(name, args.quick, truth=False)
        row = measure(case.model, case.batches)
        if seeds:
            row["lambda"] = lambda_counts(case, seeds, row["flops"]["gradient"])
        rows.append({"case": name, "description": case.description, **row})
    report = {"torch": torch.__version__, "cases": rows}
    print(table(rows))
    if seeds:
        print()
        print(lambda_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
