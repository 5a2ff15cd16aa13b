"""SLQ density with its Lanczos basis kept and by the three-term recurrence alone, against the
exact smoothed spectral measure of the same probes.

For each case, a dense symmetric matrix A = V diag(λ) Vᵀ (λ, V by ``eigh`` in float64) and each
number of steps, ``spectral_density(A, runs=R, steps=S, seed=s)`` runs twice: with every run's
basis kept (full reorthogonalisation, what ``curvcal hessian --density`` does when the memory
budget holds S vectors of P values) and without it (the three-term recurrence in four vectors,
what it does otherwise). Each density is compared with the measure it approximates,

    ρ*(t) = (1/R) Σ_r Σ_i (v_rᵀ v_i)² N(t; λ_i, σ²),

for the same normalised Rademacher probes v_r and the same bandwidth σ: the L1 distance over the
grid (∫|ρ − ρ*|, the densities integrate to 1), the largest error of the quadrature moments
Σ_j w_j θ_j^p against v_rᵀAᵖv_r for p = 1, 2, 4 (relative to ‖A‖ᵖ), how many Ritz values of the
runs repeat the largest eigenvalue (ghosts: more than one per run), and the time.

Cases: ``mlp`` (the 64-32-10 tanh MLP of ``bench_hessian.py`` on 797 digits, P = 2,410),
``digits-cnn`` (the bundled DigitsCNN, P = 9,802; its dense Hessian takes minutes, ``--cache``
keeps it), ``outliers`` (P = 2,000: a bulk N(0, 0.5²) around 0 and ten outliers from 2 to
30, a trained network's shape, where Ritz values converge early).

Usage::

    python benchmarks/bench_density.py [--cases mlp,digits-cnn,outliers] [--steps 20,40,80]
        [--runs 5] [--seed 0] [--cache digits-hessian.pt] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_hessian
import bench_trace

from curvcal.curvature.density import spectral_density
from curvcal.curvature.trace import draw_probes

CASES = ("mlp", "digits-cnn", "outliers")
POWERS = (1, 2, 4)


def outliers(n: int = 2000, seed: int = 1) -> Tensor:
    """A bulk of n − 10 values N(0, 0.5²) and ten outliers 30, 20, 15, 10, 8, 6, 5, 4, 3, 2."""
    generator = torch.Generator().manual_seed(seed)
    bulk = 0.5 * torch.randn(n - 10, generator=generator, dtype=torch.float64)
    top = torch.tensor([30.0, 20.0, 15.0, 10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.0], dtype=torch.float64)
    return bench_trace.synthetic(torch.cat([bulk, top]), seed=seed)


def build(name: str, cache: str | None, log: Any) -> Tensor:
    """The dense float64 matrix of case ``name``."""
    if name == "mlp":
        case = bench_hessian.build_case("mlp", quick=False, truth=False)
        return bench_hessian.dense_hessian(case.model, case.batches)
    if name == "digits-cnn":
        return bench_trace.digits_cnn_hessian(cache, log)
    if name == "outliers":
        return outliers()
    raise SystemExit(f"unknown case {name!r}; choose from {', '.join(CASES)}")


def probes(n: int, runs: int, seed: int) -> Tensor:
    """The (n, runs) normalised probes ``spectral_density`` draws with ``seed``, in its order."""
    generator = torch.Generator().manual_seed(seed)
    columns = [draw_probes(n, 1, "rademacher", generator)[:, 0] for _ in range(runs)]
    return torch.stack(columns, dim=1).double() / math.sqrt(n)


def compare(
    matrix: Tensor, values: Tensor, vectors: Tensor, runs: int, steps: int, seed: int
) -> dict[str, dict[str, float]]:
    """Both variants at ``steps`` steps against the exact smoothed measure of their probes."""
    columns = probes(matrix.shape[0], runs, seed)
    weights = (vectors.T @ columns) ** 2  # (n, runs): each probe's spectral measure
    norm = float(values.abs().max())
    images = {0: columns}  # A^p V by products, no matrix power
    for power in range(1, max(POWERS) + 1):
        images[power] = matrix @ images[power - 1]
    forms = {p: (columns * images[p]).sum(dim=0) for p in POWERS}  # v_rᵀAᵖv_r
    found: dict[str, dict[str, float]] = {}
    for label, kept in (("basis kept", True), ("three-term", False)):
        start = time.perf_counter()
        result = spectral_density(matrix, runs=runs, steps=steps, seed=seed, reorthogonalise=kept)
        seconds = time.perf_counter() - start
        grid = torch.tensor(result.grid, dtype=torch.float64)
        sigma = result.bandwidth
        kernel = torch.exp(-0.5 * ((grid[:, None] - values[None, :]) / sigma) ** 2)
        exact = (kernel / (sigma * math.sqrt(2 * math.pi))) @ weights.mean(dim=1)
        density = torch.tensor(result.density, dtype=torch.float64)
        moment_error, ghosts = 0.0, 0
        for run in range(runs):
            nodes = torch.tensor(result.nodes[run], dtype=torch.float64)
            node_weights = torch.tensor(result.weights[run], dtype=torch.float64)
            ghosts += int(((nodes - values[-1]).abs() <= 1e-8 * norm).sum())
            for power, form in forms.items():
                quadrature = float((node_weights * nodes**power).sum())
                moment_error = max(moment_error, abs(quadrature - float(form[run])) / norm**power)
        found[label] = {
            "l1_error": float(torch.trapezoid((density - exact).abs(), grid)),
            "moment_error": moment_error,
            "top_copies_per_run": ghosts / runs,
            "seconds": seconds,
            "matvecs": result.matvecs,
        }
    return found


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp,outliers", help=f"comma-separated: {CASES}")
    parser.add_argument(
        "--steps", default="20,40,80", help="Lanczos steps per run, comma-separated"
    )
    parser.add_argument("--runs", type=int, default=5, help="probes (SLQ runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="file for the DigitsCNN's dense Hessian")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    report: dict[str, Any] = {"options": {**vars(options), "json": None}, "cases": []}
    lines = [
        f"{options.runs} runs, seed {options.seed}; L1: ∫|ρ − ρ*| over the grid; moments: the "
        f"largest |Σ w θᵖ − vᵀAᵖv| / ‖A‖ᵖ, p in {POWERS}",
        "",
        "| case | P | steps | variant | L1 error | moment error | copies of λ1 per run | time s |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name in (c.strip() for c in options.cases.split(",") if c.strip()):
        matrix = build(name, options.cache, log)
        values, vectors = torch.linalg.eigh(matrix)
        rows = {}
        for steps in (int(s) for s in options.steps.split(",")):
            rows[steps] = compare(matrix, values, vectors, options.runs, steps, options.seed)
            for label, row in rows[steps].items():
                lines.append(
                    f"| {name} | {matrix.shape[0]:,} | {steps} | {label} | {row['l1_error']:.1e} "
                    f"| {row['moment_error']:.1e} | {row['top_copies_per_run']:.1f} "
                    f"| {row['seconds']:.2f} |"
                )
        report["cases"].append({"case": name, "n": matrix.shape[0], "steps": rows})
    print("\n".join(lines))
    if options.json:
        options.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
