"""Warm-start benchmark: full-data Hessian products to λmax, from a random start and from the top
eigenvector of the Hessian over a fraction of the data.

The model: a small ViT built with timm (``vit_tiny_patch16_224`` at 32×32 pixels, patch 8, 10
classes, random weights), first trained for ``--train-steps`` SGD steps on synthetic
class-dependent images (a class pattern plus noise) so that its spectrum is a trained one's
rather than a random network's; then the Hessian of its mean cross-entropy over N of those
images (float32, :func:`curvcal.hessian_operator`).

Strategies, each to ``tol`` = 1e-3 and 1e-4, k = 1 (λmax), for each of ``--seeds`` seeds:

* ``random``: Lanczos from a random start (what ``curvcal hessian`` does);
* ``warm f``: Lanczos on the Hessian over ⌈f·N⌉ samples drawn by the seed, to ``--warm-tol``,
  then Lanczos on the full data from its top Ritz vector (``start=``). Its cost in full-product
  units is the full-data products plus f × the subsample's products (a product over f·N samples
  costs f of one over N; the measured ratio of their seconds is printed beside it).

Products are counted by the spectrum (``matvecs``: the Lanczos steps, shown beside them, and
the verification products).
One thread; the strategies run interleaved, seed by seed; the table gives the median over the
seeds of each strategy's full-product units, its ratio to the random start's, and the λmax
found (the same value to tol, else the row says so).

    python benchmarks/bench_warm_start.py                  # N = 256, f = 1/16, 1/8, 1/4, 3 seeds
    python benchmarks/bench_warm_start.py --smoke          # a tiny ViT in a few seconds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor, nn

import curvcal
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.results import ConvergenceWarning

TOLS = (1e-3, 1e-4)


def build_model(smoke: bool) -> nn.Module:
    """The timm ViT (random weights, seeded): tiny at 16×16 in smoke mode."""
    import timm

    torch.manual_seed(0)
    if smoke:
        return timm.create_model(
            "vit_tiny_patch16_224", img_size=16, patch_size=8, num_classes=10,
            depth=1, embed_dim=16, num_heads=2, pretrained=False,
        )  # fmt: skip
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=10,
        depth=4, embed_dim=96, num_heads=3, pretrained=False,
    )  # fmt: skip


def synthetic_images(n: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
    """n images of 3×size×size: a fixed pattern per class (10 classes, the same for every
    ``seed``) plus unit noise drawn by ``seed``."""
    patterns = torch.randn(10, 3, size, size, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = patterns[labels] + torch.randn(n, 3, size, size, generator=generator)
    return images, labels


def train(model: nn.Module, steps: int, size: int) -> float:
    """``steps`` SGD steps (lr 0.01, momentum 0.9, 64 fresh images each); the last batch's loss."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    loss = torch.tensor(math.nan)
    for step in range(steps):
        images, labels = synthetic_images(64, size, 1000 + step)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    return float(loss.detach())


def parse_fractions(text: str) -> list[float]:
    """``"1/16,1/8,0.25"`` as floats."""
    return [float(Fraction(part.strip())) for part in text.split(",") if part.strip()]


def batches(images: Tensor, labels: Tensor, batch: int) -> list[tuple[Tensor, Tensor]]:
    return [(images[i : i + batch], labels[i : i + batch]) for i in range(0, len(labels), batch)]


def subsample(n: int, fraction: float, seed: int) -> Tensor:
    """⌈fraction·n⌉ sample indices drawn without replacement by ``seed``, in order."""
    count = max(1, math.ceil(fraction * n))
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=generator)[:count].sort().values


def _spectrum(operator: Any, tol: float, seed: int, start: Tensor | None = None) -> Any:
    captured: list[Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        began = time.perf_counter()
        spectrum = eigenvalues(
            operator, 1, tol=tol, seed=seed, start=start, on_vectors=captured.append,
            max_iter=400,
        )  # fmt: skip
        seconds = time.perf_counter() - began
    return spectrum, captured[0][:, 0], seconds


def trained_problem(options: argparse.Namespace) -> tuple[nn.Module, Tensor, Tensor, float]:
    """The benchmark's problem as ``options`` size it (one thread count, the smoke or full ViT,
    its SGD steps, N images): the model, the images, their labels and its last training loss."""
    torch.set_num_threads(options.threads)
    size = 16 if options.smoke else 32
    model = build_model(options.smoke)
    last_loss = train(model, options.train_steps, size)
    images, labels = synthetic_images(options.samples, size, 7)
    return model, images, labels, last_loss


def measure(options: argparse.Namespace) -> dict[str, Any]:
    model, images, labels, last_loss = trained_problem(options)
    data = batches(images, labels, options.batch)
    full = curvcal.hessian_operator(model, data)
    fractions = parse_fractions(options.fractions)
    runs: list[dict[str, Any]] = []
    for seed in range(options.seeds):
        for tol in TOLS:
            spectrum, _vector, seconds = _spectrum(full, tol, seed)
            runs.append({
                "seed": seed, "tol": tol, "strategy": "random", "fraction": None,
                "full_products": spectrum.matvecs, "steps": spectrum.values[0].iterations,
                "warm_products": 0,
                "units": float(spectrum.matvecs), "seconds": seconds, "warm_seconds": 0.0,
                "lambda_max": spectrum.values[0].value, "converged": spectrum.converged,
            })  # fmt: skip
        for fraction in fractions:
            chosen = subsample(options.samples, fraction, seed)
            part = curvcal.hessian_operator(
                model, batches(images[chosen], labels[chosen], options.batch)
            )
            warm, start, warm_seconds = _spectrum(part, options.warm_tol, seed)
            share = len(chosen) / options.samples
            for tol in TOLS:
                spectrum, _vector, seconds = _spectrum(full, tol, seed, start)
                runs.append({
                    "seed": seed, "tol": tol, "strategy": f"warm {fraction:g}",
                    "fraction": share, "full_products": spectrum.matvecs,
                    "steps": spectrum.values[0].iterations,
                    "warm_products": warm.matvecs,
                    "units": spectrum.matvecs + share * warm.matvecs,
                    "seconds": seconds, "warm_seconds": warm_seconds,
                    "lambda_max": spectrum.values[0].value, "converged": spectrum.converged,
                })  # fmt: skip
    return {"last_training_loss": last_loss, "n_params": full.shape[0], "runs": runs}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (strategy, tol): the medians over the seeds, and the ratio to the random start's."""
    rows = []
    for tol in TOLS:
        strategies = dict.fromkeys(r["strategy"] for r in runs)
        baseline = statistics.median(
            r["units"] for r in runs if r["strategy"] == "random" and r["tol"] == tol
        )
        reference = statistics.median(
            r["lambda_max"] for r in runs if r["strategy"] == "random" and r["tol"] == tol
        )
        for strategy in strategies:
            mine = [r for r in runs if r["strategy"] == strategy and r["tol"] == tol]
            units = statistics.median(r["units"] for r in mine)
            seconds = statistics.median(r["seconds"] + r["warm_seconds"] for r in mine)
            rows.append({
                "strategy": strategy, "tol": tol,
                "full_products": statistics.median(r["full_products"] for r in mine),
                "steps": statistics.median(r["steps"] for r in mine),
                "warm_products": statistics.median(r["warm_products"] for r in mine),
                "units": units, "random_over_this": baseline / units, "seconds": seconds,
                "lambda_max": statistics.median(r["lambda_max"] for r in mine),
                "agrees": all(
                    abs(r["lambda_max"] - reference) <= 10 * tol * abs(reference) for r in mine
                ),
                "converged": all(r["converged"] for r in mine),
            })  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="N, the full data's images")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--fractions", default="1/16,1/8,1/4")
    parser.add_argument("--warm-tol", type=float, default=1e-2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a tiny ViT on 32 images, one seed")
    parser.add_argument("--json", metavar="OUT")
    options = parser.parse_args(argv)
    if options.smoke:
        options.samples, options.batch, options.seeds = 32, 16, 1
        options.fractions, options.train_steps = "1/4", 3
    if options.samples < 2 or options.seeds < 1 or options.batch < 1:
        parser.error("--samples must be ≥ 2, --seeds and --batch ≥ 1")
    try:
        fractions = parse_fractions(options.fractions)
    except ValueError:
        parser.error(f"--fractions: not numbers: {options.fractions!r}")
    if not fractions or not all(0 < f < 1 for f in fractions):
        parser.error("--fractions: each must lie in (0, 1)")
    measured = measure(options)
    rows = summarise(measured["runs"])
    print(
        f"ViT ({measured['n_params']:,} parameters, last training loss "
        f"{measured['last_training_loss']:.3f}), N = {options.samples}, float32, "
        f"{options.threads} thread(s), warm stage to tol {options.warm_tol:g}, "
        f"median of {options.seeds} seed(s)"
    )
    print()
    print(
        "| strategy | tol | full products (steps) | warm products | full-product units "
        "| random / this | s | λmax | converged |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(
            f"| {row['strategy']} | {row['tol']:g} | {row['full_products']:g} ({row['steps']:g}) "
            f"| {row['warm_products']:g} | {row['units']:.2f} | {row['random_over_this']:.2f} "
            f"| {row['seconds']:.1f} | {row['lambda_max']:.6g} "
            f"| {'yes' if row['converged'] else 'NO'}{'' if row['agrees'] else ' (differs)'} |"
        )
    report = {"options": vars(options), "rows": rows, **measured}
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    return report


if __name__ == "__main__":
    main()
