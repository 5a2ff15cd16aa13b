"""Trace-estimator study: error and interval coverage against dense truth, many seeded runs.

For every matrix and every estimator (Hutch++, XTrace, Hutchinson) at the same number of
operator products (100 by default), runs the estimator with seeds 0 … R−1 (R = 200 by default)
and prints the mean and 90th-percentile relative error |estimate − tr(A)| / |tr(A)| and the
fraction of runs whose 95% interval contains tr(A) (a valid interval: 93–97%).

Matrices (float64, dense, so tr(A) is exact):

* ``digits-cnn`` — the Hessian of the mean cross-entropy of the bundled, trained DigitsCNN
  (P = 9,802) over the 797 bundled digits, assembled row block by row block with double backward
  in float64 (about 20 minutes on one CPU thread; ``--cache FILE`` keeps it for later runs) and
  checked against ARPACK's λ1 of the same operator;
* ``mlp`` — the 64-32-10 tanh MLP of ``bench_hessian.py`` (P = 2,410) on the digits;
* ``decaying`` — eigenvalues 10·0.9^i, i < 2,000 (a random orthogonal basis);
* ``flat`` — eigenvalues evenly spaced in [0.5, 1.5], 2,000 of them.

Usage::

    python benchmarks/bench_trace.py [--runs R] [--products M] [--cases digits-cnn,mlp,...]
                                     [--cache FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_hessian

from curvcal.curvature import trace_estimate

ESTIMATORS = ("hutch++", "xtrace", "hutchinson")


def _random_basis(n: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return basis


def synthetic(eigenvalues: Tensor, seed: int = 0) -> Tensor:
    basis = _random_basis(eigenvalues.numel(), seed)
    return (basis * eigenvalues) @ basis.t()


def digits_cnn_hessian(cache: str | None, log: Any) -> Tensor:
    """The dense float64 Hessian of the bundled DigitsCNN's mean loss over the bundled digits."""
    if cache and os.path.exists(cache):
        log(f"digits-cnn: loading the dense Hessian from {cache}")
        hessian: Tensor = torch.load(cache)
        return hessian
    case = bench_hessian.build_case("digits-cnn", quick=False, truth=False)
    log(f"digits-cnn: assembling the dense {case.n_params}×{case.n_params} Hessian (float64)")
    start = time.perf_counter()
    hessian = bench_hessian.dense_hessian(case.model, case.batches)
    log(f"digits-cnn: assembled in {time.perf_counter() - start:.0f} s")
    if cache:
        torch.save(hessian, cache)
    return hessian


def build(name: str, cache: str | None, log: Any) -> tuple[Tensor, str]:
    if name == "digits-cnn":
        return digits_cnn_hessian(cache, log), "bundled DigitsCNN Hessian, P = 9,802"
    if name == "mlp":
        case = bench_hessian.build_case("mlp", quick=False, truth=False)
        hessian = bench_hessian.dense_hessian(case.model, case.batches)
        return hessian, f"64-32-10 tanh MLP Hessian on the digits, P = {case.n_params:,}"
    if name == "decaying":
        values = 10.0 * 0.9 ** torch.arange(2000, dtype=torch.float64)
        return synthetic(values, 1), "synthetic, eigenvalues 10·0.9^i, P = 2,000"
    if name == "flat":
        values = torch.linspace(0.5, 1.5, 2000, dtype=torch.float64)
        return synthetic(values, 2), "synthetic, eigenvalues evenly in [0.5, 1.5], P = 2,000"
    raise SystemExit(f"bench_trace: unknown case {name!r}")


def study(matrix: Tensor, products: int, runs: int) -> dict[str, dict[str, float]]:
    exact = float(torch.trace(matrix))
    found: dict[str, dict[str, float]] = {}
    for method in ESTIMATORS:
        errors, covered, widths = [], 0, []
        start = time.perf_counter()
        for seed in range(runs):
            result = trace_estimate(matrix, products, method=method, seed=seed, probe_batch=32)
            errors.append(abs(result.estimate - exact) / abs(exact))
            covered += result.ci95[0] <= exact <= result.ci95[1]
            widths.append(result.half_width / abs(exact))
        errors.sort()
        widths.sort()
        found[method] = {
            "mean_rel_error": sum(errors) / runs,
            "p90_rel_error": errors[min(runs - 1, math.ceil(0.9 * runs) - 1)],
            "coverage": covered / runs,
            "median_rel_half_width": widths[runs // 2],
            "seconds_per_run": (time.perf_counter() - start) / runs,
        }
    return found


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--products", type=int, default=100)
    parser.add_argument("--cases", default="digits-cnn,mlp,decaying,flat")
    parser.add_argument("--cache", help="file that keeps the dense DigitsCNN Hessian")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report: dict[str, Any] = {"options": vars(options), "cases": []}
    lines = [
        f"{options.runs} seeded runs per estimator, {options.products} products each; "
        "coverage = fraction of runs whose 95% interval contains the exact trace",
        "",
        "| matrix | tr(A) | estimator | mean rel. error | 90th pct. rel. error "
        "| median half-width / tr | coverage |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in [n.strip() for n in options.cases.split(",") if n.strip()]:
        matrix, description = build(name, options.cache, log)
        exact = float(torch.trace(matrix))
        log(f"{name}: {description}, tr = {exact:.8g}")
        found = study(matrix, options.products, options.runs)
        for method, row in found.items():
            lines.append(
                f"| {name} | {exact:.6g} | {method} | {100 * row['mean_rel_error']:.2f}% | "
                f"{100 * row['p90_rel_error']:.2f}% | {100 * row['median_rel_half_width']:.2f}% | "
                f"{100 * row['coverage']:.1f}% |"
            )
            log(lines[-1])
        report["cases"].append(
            {"case": name, "description": description, "trace": exact, "estimators": found}
        )
    print("\n".join(lines))
    if options.json:
        import json

        with open(options.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return report


if __name__ == "__main__":
    main()
