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
    python benchmarks/bench_trace.py --study [--span] [--eigh-dtype float32] [--timing-seeds N] ...
    python benchmarks/bench_trace.py --split [--runs R] [--products M]

``--study`` runs the variants of ``trace_study.py`` instead (Hutch++ splits, a power step, an
adaptive split, XTrace with a jackknife interval), with error percentiles, coverage and the time
of a run on the dense matrix; ``--span`` takes the products in the span of each seed's probes
(no eigendecomposition: for the DigitsCNN Hessian). ``--split`` compares, on the tanh MLP,
each estimator on H with the split trace of ``--trace-method auto`` there: tr(G) exact plus the
estimator on R = H − G, the Hessian of the loss linearised in the logits, with the products the
exact part leaves.
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
import trace_study

from curvcal.curvature import trace_estimate
from curvcal.curvature.residual import residual_products
from curvcal.losses import CrossEntropy, Linearised

ESTIMATORS = ("hutchpp", "xtrace", "hutchinson")


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


def spectral(
    name: str, cache: str | None, log: Any, eigh_dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor, Tensor, str]:
    """(A, λ, V, description) with A = V diag(λ) Vᵀ: known for the synthetic matrices, by
    ``eigh`` in ``eigh_dtype`` (kept in ``cache`` + ``.eigh`` when ``cache`` is given) for the
    Hessians (λ in float64, V in that dtype: the probes are rotated in it). A float32 ``eigh`` (2.5× faster: 9 instead of 21 minutes at
    P = 9,802 on one thread) studies V diag(λ) Vᵀ, a matrix about 1e-6 (relative) from A; it
    does not converge on the DigitsCNN Hessian (3,848 zero eigenvalues): use ``--span`` there."""
    if name in ("decaying", "flat"):
        matrix, description = build(name, cache, log)
        values = (
            10.0 * 0.9 ** torch.arange(2000, dtype=torch.float64)
            if name == "decaying"
            else torch.linspace(0.5, 1.5, 2000, dtype=torch.float64)
        )
        return matrix, values, _random_basis(2000, 1 if name == "decaying" else 2), description
    matrix, description = build(name, cache, log)
    store = f"{cache}.eigh-{str(eigh_dtype)[6:]}" if cache and name == "digits-cnn" else None
    if store and os.path.exists(store):
        values, basis = torch.load(store)
    else:
        log(f"{name}: eigendecomposition of the dense {matrix.shape[0]}² matrix ({eigh_dtype})")
        start = time.perf_counter()
        values, basis = torch.linalg.eigh(matrix.to(eigh_dtype))
        values = values.double()
        log(f"{name}: eigh in {time.perf_counter() - start:.0f} s")
        if store:
            torch.save((values, basis), store)
    return matrix, values, basis, description


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
            result = trace_estimate(
                matrix, products, trace_method=method, seed=seed, probe_batch=32
            )
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


def study_split(
    hessian: Tensor, residual: Tensor, products: int, classes: int, runs: int
) -> dict[str, dict[str, float]]:
    """Each estimator on H with ``products`` products against the split trace: tr(G) exact
    (tr(H) − tr(R) of the dense matrices) plus the estimator on R with the products left
    (``residual_products``: the C − 1 gradient norms per sample of the exact part counted as
    products). Errors and coverage against tr(H)."""
    exact = float(torch.trace(hessian))
    gauss_newton = exact - float(torch.trace(residual))
    left = residual_products(products, classes)
    found: dict[str, dict[str, float]] = {}
    for label, matrix, shift, spent in (
        ("{} on H", hessian, 0.0, products),
        ("tr(G) + {} on R", residual, gauss_newton, left),
    ):
        for method in ESTIMATORS:
            errors, covered, widths = [], 0, []
            for seed in range(runs):
                result = trace_estimate(
                    matrix, spent, trace_method=method, seed=seed, probe_batch=32
                )
                estimate = shift + result.estimate
                errors.append(abs(estimate - exact) / abs(exact))
                covered += shift + result.ci95[0] <= exact <= shift + result.ci95[1]
                widths.append(result.half_width / abs(exact))
            errors.sort()
            widths.sort()
            found[f"{label.format(method)} ({spent})"] = {
                "mean_rel_error": sum(errors) / runs,
                "p90_rel_error": _rank(errors, 0.9),
                "max_rel_error": errors[-1],
                "runs_over_1pct": sum(e > 0.01 for e in errors),
                "coverage": covered / runs,
                "median_rel_half_width": widths[runs // 2],
            }
    return found


def run_split(options: argparse.Namespace, log: Any) -> dict[str, Any]:
    """``--split``: the split trace against the estimators on H, on the tanh MLP's dense H
    and R (the Hessian of the loss linearised in the logits)."""
    case = bench_hessian.build_case("mlp", quick=False, truth=False)
    hessian = bench_hessian.dense_hessian(case.model, case.batches)
    residual = bench_hessian.dense_hessian(case.model, case.batches, Linearised(CrossEntropy()))
    exact = float(torch.trace(hessian))
    log(
        f"mlp: tr(H) = {exact:.8g}, tr(R) = {float(torch.trace(residual)):.6g}, "
        f"‖H‖_F = {float(hessian.norm()):.4g}, ‖R‖_F = {float(residual.norm()):.4g}"
    )
    found = study_split(hessian, residual, options.products, 10, options.runs)
    lines = [
        f"{options.runs} seeded runs per row; errors relative to tr(H); products in brackets",
        "",
        "| estimate | mean | 90th pct. | max | runs > 1% | median half-width | coverage |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in found.items():
        lines.append(
            f"| {name} | {100 * row['mean_rel_error']:.2f}% | {100 * row['p90_rel_error']:.2f}% "
            f"| {100 * row['max_rel_error']:.2f}% | {row['runs_over_1pct']} "
            f"| {100 * row['median_rel_half_width']:.2f}% | {100 * row['coverage']:.1f}% |"
        )
    print("\n".join(lines))
    return {"options": vars(options), "trace": exact, "split": found}


def _rank(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    return values[min(len(values) - 1, math.ceil(fraction * len(values)) - 1)]


def summarise(runs: list[trace_study.Run], exact: float) -> dict[str, float]:
    """Error statistics (relative to |tr|) and coverage of the runs of one variant."""
    errors = sorted(abs(r.estimate - exact) / abs(exact) for r in runs)
    with_interval = [r for r in runs if not math.isnan(r.low)]
    widths = sorted((r.high - r.low) / 2 / abs(exact) for r in with_interval)
    return {
        "mean_rel_error": sum(errors) / len(errors),
        "median_rel_error": _rank(errors, 0.5),
        "p90_rel_error": _rank(errors, 0.9),
        "p95_rel_error": _rank(errors, 0.95),
        "max_rel_error": errors[-1],
        "runs_over_1pct": sum(e > 0.01 for e in errors),
        "coverage": (
            sum(r.low <= exact <= r.high for r in with_interval) / len(with_interval)
            if with_interval
            else math.nan
        ),
        "median_rel_half_width": _rank(widths, 0.5) if widths else math.nan,
        "mean_sketch": sum(r.sketch for r in runs) / len(runs),
    }


def study_variants(
    matrix: Tensor, values: Tensor, basis: Tensor, products: int, runs: int
) -> dict[str, dict[str, float]]:
    """Every variant of ``trace_study`` with seeds 0 … runs − 1, in the eigenbasis of A;
    errors against Σλ, the exact trace of the matrix studied."""
    exact = float(values.sum())

    def apply(columns: Tensor) -> Tensor:
        return values[:, None] * columns

    collected: dict[str, list[trace_study.Run]] = {}
    for seed in range(runs):
        pool = _rotate(basis, trace_study.pool_of(values.numel(), products, seed))
        for name, run in trace_study.run_seed(apply, pool, products).items():
            collected.setdefault(name, []).append(run)
    return {name: summarise(found, exact) for name, found in collected.items()}


def study_in_span(matrix: Tensor, products: int, runs: int) -> dict[str, dict[str, float]]:
    """As ``study_variants`` without an eigenbasis: per seed, B = orth([Ω, AΩ_(m/2)]) (the
    pool and the images of the largest sketch) and AB, both with float32 products; every
    variant's product of columns X in the span of B is (AB)(BᵀX), any other is A·X in float32.
    Every vector the variants multiply lies in that span (the sketches, their bases, the
    deflated probes, XTrace's), except the power step's bases. Products in float32 put the
    estimates about 1e-7 (relative) from float64 ones; errors against tr(A) in float64."""
    exact = float(torch.trace(matrix))
    single = matrix.float()

    def direct(columns: Tensor) -> Tensor:
        return (single @ columns.float()).double()

    collected: dict[str, list[trace_study.Run]] = {}
    for seed in range(runs):
        pool = trace_study.pool_of(matrix.shape[0], products, seed)
        span, _ = torch.linalg.qr(torch.cat([pool, direct(pool[:, : products // 2])], dim=1))
        images = direct(span)

        def apply(columns: Tensor, span: Tensor = span, images: Tensor = images) -> Tensor:
            coordinates = span.t() @ columns
            outside = (columns - span @ coordinates).norm() / columns.norm().clamp_min(1e-300)
            return images @ coordinates if outside <= 1e-5 else direct(columns)

        runs_of_seed = trace_study.run_seed(apply, pool, products)
        if seed == 0:
            plain = trace_study.run_seed(lambda x: matrix @ x, pool, products)
            worst = max(abs(plain[n].estimate - r.estimate) for n, r in runs_of_seed.items())
            print(
                f"seed 0, span against float64 products: {worst / abs(exact):.1e}", file=sys.stderr
            )
        for name, run in runs_of_seed.items():
            collected.setdefault(name, []).append(run)
    return {name: summarise(found, exact) for name, found in collected.items()}


def _rotate(basis: Tensor, pool: Tensor) -> Tensor:
    """Vᵀ·pool in V's dtype, returned in float64."""
    return (basis.t() @ pool.to(basis.dtype)).double()


def check_against_library(matrix: Tensor, values: Tensor, basis: Tensor, products: int) -> float:
    """Seed 0 on the matrix itself: every variant spends ``products`` products, and Hutchinson,
    Hutch++ (s = m/3) and XTrace with the jackknife interval agree with curvcal's functions
    (estimate and interval) and with the eigenbasis runs.
    Returns the largest relative difference found."""
    spent = [0]

    def apply(columns: Tensor) -> Tensor:
        spent[0] += columns.shape[1]
        return matrix @ columns

    pool = trace_study.pool_of(values.numel(), products, 0)
    direct = {}
    for name, function in trace_study.variants(products).items():
        spent[0] = 0
        direct[name] = function(apply, pool)
        if spent[0] != products:
            raise SystemExit(f"bench_trace: {name} spent {spent[0]} products, not {products}")
    spent[0] = 0
    direct["xtrace"], direct["xtrace jackknife"] = trace_study.xtrace_runs(apply, pool, products)
    if spent[0] != 2 * (products // 2):
        raise SystemExit(f"bench_trace: xtrace spent {spent[0]} products")
    rotated = trace_study.run_seed(lambda x: values[:, None] * x, _rotate(basis, pool), products)
    scale = abs(float(torch.trace(matrix)))
    worst = max(abs(direct[n].estimate - rotated[n].estimate) / scale for n in direct)
    library = {
        "hutchinson": "hutchinson",
        f"hutchpp s={max(1, products // 3)} (default)": "hutchpp",
        "xtrace jackknife": "xtrace",
    }
    for name, method in library.items():
        result = trace_estimate(matrix, products, trace_method=method, seed=0, probe_batch=32)
        worst = max(worst, abs(result.estimate - direct[name].estimate) / scale)
        worst = max(worst, abs(result.ci95[0] - direct[name].low) / scale)
    return worst


def time_variants(matrix: Tensor, products: int, seeds: int) -> dict[str, float]:
    """Minimum wall seconds of one run of each variant on the dense matrix (interleaved)."""
    best: dict[str, float] = {}

    def apply(columns: Tensor) -> Tensor:
        return matrix @ columns

    for seed in range(seeds):
        pool = trace_study.pool_of(matrix.shape[0], products, seed)
        functions = dict(trace_study.variants(products))
        functions["xtrace + jackknife"] = lambda a, p: trace_study.xtrace_runs(a, p, products)[1]
        for name, function in functions.items():
            start = time.perf_counter()
            function(apply, pool)
            best[name] = min(best.get(name, math.inf), time.perf_counter() - start)
    return best


def _study_rows(lines: list[str], name: str, found: dict[str, dict[str, float]], log: Any) -> None:
    for variant, row in found.items():
        lines.append(
            f"| {name} | {variant} | {100 * row['mean_rel_error']:.2f}% | "
            f"{100 * row['median_rel_error']:.2f}% | {100 * row['p90_rel_error']:.2f}% | "
            f"{100 * row['p95_rel_error']:.2f}% | {100 * row['max_rel_error']:.2f}% | "
            f"{row['runs_over_1pct']} | {100 * row['median_rel_half_width']:.2f}% | "
            f"{100 * row['coverage']:.1f}% | {row['mean_sketch']:.1f} |"
        )
        log(lines[-1])


def _finish(
    case: dict[str, Any],
    matrix: Tensor,
    found: dict[str, dict[str, float]],
    start: float,
    lines: list[str],
    options: argparse.Namespace,
    log: Any,
) -> dict[str, Any]:
    """One case's study done: its rows in the table, its estimators timed, its JSON record."""
    name = case["case"]
    log(f"{name}: study in {time.perf_counter() - start:.0f} s")
    _study_rows(lines, name, found, log)
    seconds = time_variants(matrix, options.products, options.timing_seeds)
    for variant, value in seconds.items():
        log(f"{name}: {variant}: {value:.3f} s per run (min of {options.timing_seeds})")
    return {**case, "variants": found, "seconds_per_run": seconds}


def case_names(cases: str) -> list[str]:
    """The case names of ``--cases``, comma-separated, blanks dropped."""
    return [name.strip() for name in cases.split(",") if name.strip()]


def run_study(options: argparse.Namespace, log: Any) -> dict[str, Any]:
    """``--study``: the variants' table (error statistics and coverage) for every case."""
    report: dict[str, Any] = {"options": vars(options), "cases": []}
    lines = [
        f"{options.runs} seeded runs per variant, {options.products} products each; errors "
        "relative to |tr(A)|; coverage = fraction of runs whose 95% interval contains tr(A)",
        "",
        "| matrix | variant | mean | median | 90th pct. | 95th pct. | max | runs > 1% "
        "| median half-width | coverage | mean sketch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in case_names(options.cases):
        if options.span:
            matrix, description = build(name, options.cache, log)
            exact = float(torch.trace(matrix))
            log(f"{name}: {description}, tr = {exact:.8g}; products in the span of the pool")
            start = time.perf_counter()
            found = study_in_span(matrix, options.products, options.runs)
            case = {"case": name, "description": description, "trace": exact}
            report["cases"].append(_finish(case, matrix, found, start, lines, options, log))
            continue
        eigh_dtype = getattr(torch, options.eigh_dtype)
        matrix, values, basis, description = spectral(name, options.cache, log, eigh_dtype)
        exact = float(torch.trace(matrix))
        log(f"{name}: |Σλ − tr(A)| / |tr(A)| = {abs(float(values.sum()) - exact) / abs(exact):.1e}")
        negative = float(values[values < 0].sum())
        log(
            f"{name}: {description}, tr = {exact:.8g}, λ range [{float(values[0]):.4g}, "
            f"{float(values[-1]):.4g}], {int((values < 0).sum())} negative eigenvalues "
            f"(sum {negative:.4g})"
        )
        difference = check_against_library(matrix, values, basis, options.products)
        log(f"{name}: seed 0 against curvcal's functions and the eigenbasis: {difference:.1e}")
        start = time.perf_counter()
        found = study_variants(matrix, values, basis, options.products, options.runs)
        case = {
            "case": name,
            "description": description,
            "trace": exact,
            "lambda_min": float(values[0]),
            "lambda_max": float(values[-1]),
            "negative_eigenvalues": int((values < 0).sum()),
            "negative_sum": negative,
            "check_difference": difference,
        }
        report["cases"].append(_finish(case, matrix, found, start, lines, options, log))
    print("\n".join(lines))
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--products", type=int, default=100)
    parser.add_argument("--cases", default="digits-cnn,mlp,decaying,flat")
    parser.add_argument("--cache", help="file that keeps the dense DigitsCNN Hessian")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--study", action="store_true", help="the variants of trace_study.py instead"
    )
    parser.add_argument("--timing-seeds", type=int, default=3)
    parser.add_argument("--eigh-dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument(
        "--span", action="store_true", help="--study without an eigenbasis (float32 products)"
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="the split trace (tr(G) exact + an estimator on R) on the tanh MLP",
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if options.split:
        report = run_split(options, log)
        _write_json(options.json, report)
        return report
    if options.study:
        report = run_study(options, log)
        _write_json(options.json, report)
        return report

    report: dict[str, Any] = {"options": vars(options), "cases": []}
    lines = [
        f"{options.runs} seeded runs per estimator, {options.products} products each; "
        "coverage = fraction of runs whose 95% interval contains the exact trace",
        "",
        "| matrix | tr(A) | estimator | mean rel. error | 90th pct. rel. error "
        "| median half-width / tr | coverage |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in case_names(options.cases):
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
    _write_json(options.json, report)
    return report


def _write_json(path: str | None, report: dict[str, Any]) -> None:
    if path:
        import json

        with open(path, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
