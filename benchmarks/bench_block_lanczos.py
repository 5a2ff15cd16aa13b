"""Block Lanczos over probes against single-vector Lanczos: products to λmax, and what one pass
over the data with b vectors costs per vector.

Block Lanczos multiplies b vectors at a time. It can only win if (a) it needs fewer block steps
× b products than single-vector Lanczos needs products, or (b) a product of b vectors
(``operator.matmat``: ``probe_batch`` columns share one pass over the data, the forward and
the first backward shared among them) costs much less than b single products. This script
measures both on the CPU:

* products to tol: curvcal's Lanczos (:func:`curvcal.curvature.eigen.eigenvalues`, k = 1,
  partial reorthogonalisation: what ``curvcal hessian`` runs) against :func:`block_lanczos`
  below at b = 2, 4, 8, to tol 1e-3 and 1e-4, for each of ``--seeds`` seeds;
* the per-vector cost c_b = t(matmat of b columns) / (b · t(matvec)), the two timed
  interleaved and the least of ``--repeats`` kept, at b = 1, 2, 4, 8, for three operators over
  the same data: the default one (the memory plan keeps the double-backward graphs where they
  fit, and then answers each vector by one backward through them), ``keep_graphs="never"``
  (double backward, the forward and first backward shared by the block) and
  ``keep_graphs="never", hvp="func"`` (forward-over-reverse vmapped over the block: what
  ``hvp="auto"`` runs for blocks on CUDA);
* full-product units: products × c_b (1 for single-vector Lanczos), and the break-even
  c* = single products / block products: a device whose measured c_b is below c* makes
  block Lanczos cheaper there;
* the same products on dense float64 matrices of P = 2,000 whose top eigenvalue is repeated
  three times or sits in a cluster of three (relative gaps 1e-3), where block Lanczos should do
  best.

The model and data are :mod:`bench_warm_start`'s (a timm ViT of 0.47 M parameters trained a
few SGD steps on synthetic class-dependent images, the Hessian of its mean cross-entropy over N
of them, float32), imported from there.

Block Lanczos (Golub & Underwood 1977; Golub & Van Loan §10.3.6): Q_1 = orth(G), G a P×b
Gaussian draw from the seed; each step multiplies the latest block, W = A Q_j, clears W of the
whole basis twice in float64 (full reorthogonalisation, the amounts removed kept as the
coefficients of the projected matrix H = Qᵀ A Q, block tridiagonal to rounding), and factors
the rest W = Q_{j+1} B_{j+1} by QR (an SVD dropping the directions below 100·ε·‖A‖ when the
block loses rank: b ≥ P, or an invariant subspace). The Ritz pairs (θ, s) are those of H's
symmetric part, in float64, y = Q s. The stopping rule is curvcal's Lanczos' rule
(:func:`curvcal.curvature.eigen.lanczos`), with the block's residual estimate
‖B_{j+1} s_j‖ ⊕ ‖K s‖ (s_j the rows of s on the latest block, K the skew part of H) in place
of |β s_m| ⊕ ‖K s‖: once the estimate and the change of θ since the last block step are ≤ tol
relative to d = max(|θ|, √ε·‖A‖), one product measures the true residual ‖A y − θ y‖ / d, and
the run stops when that is ≤ tol too; a failed check lowers the room the estimate must leave,
as curvcal's does. Products are counted as curvcal counts them: b per block step (fewer when
the block lost rank) and one per verification.

    python benchmarks/bench_block_lanczos.py               # N = 256, b = 2, 4, 8, 3 seeds
    python benchmarks/bench_block_lanczos.py --smoke       # a tiny ViT in a few seconds
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_warm_start import TOLS, batches, trained_problem

import curvcal
from curvcal.curvature.eigen import _MAX_FAILED_CHECKS, _rayleigh_ritz, _relative, eigenvalues
from curvcal.curvature.operators import LinearOperator, as_operator
from curvcal.curvature.precision import effective_tol
from curvcal.curvature.results import ConvergenceWarning

BLOCKS = (2, 4, 8)
#: the block widths whose per-vector cost is timed (b = 1: the matvec against itself)
WIDTHS = (1, 2, 4, 8)
#: operator variants timed: name -> keywords of curvcal.hessian_operator
VARIANTS = {
    "default": {},
    "rebuilt": {"keep_graphs": "never"},
    "func": {"keep_graphs": "never", "hvp": "func"},
}
#: dense cases: the top of the spectrum of a P×P float64 matrix, the rest uniform in [0, 0.9]
DENSE_TOPS = {"repeated": (1.0, 1.0, 1.0), "cluster": (1.0, 0.999, 0.998)}


@dataclass(frozen=True)
class BlockRun:
    """One block Lanczos run for λmax: the top Ritz value, its verified relative residual and
    last change, the products (b per block step, one per verification), and why it stopped
    (``tol``, ``max_products``, ``exhausted``: the basis spans the space, ``invariant``: the
    block Krylov space is invariant, ``precision``: failed checks say rounding is the limit)."""

    value: float
    residual: float
    change: float
    products: int
    block_steps: int
    verifications: int
    basis_size: int
    converged: bool
    stopped_by: str


def _orthonormal_block(image: Tensor, drop: float) -> tuple[Tensor, Tensor]:
    """W = Q B with orthonormal columns Q: by QR when every |R_ii| > ``drop``, else by an SVD
    keeping the singular values above ``drop`` (B = diag(σ) Vᵀ, fewer rows than W's columns;
    none when W is below ``drop`` altogether)."""
    q, r = torch.linalg.qr(image)
    if bool((r.diagonal().abs() > drop).all()):
        return q, r
    u, sigma, vh = torch.linalg.svd(image, full_matrices=False)
    kept = sigma > drop
    return u[:, kept], sigma[kept, None] * vh[kept]


def block_lanczos(
    operator: LinearOperator | Tensor,
    block: int,
    *,
    tol: float = 1e-4,
    seed: int = 0,
    max_products: int | None = None,
) -> BlockRun:
    """λmax of a symmetric operator by block Lanczos with blocks of ``block`` vectors (at most
    P), full reorthogonalisation in float64 and curvcal's stopping rule (module docstring).

    ``max_products`` bounds the products, verifications included (at least ``block`` + 1).
    :class:`ValueError` for a ``block`` that is not an integer ≥ 1, a ``tol`` that is not > 0
    or a ``max_products`` below ``block`` + 1."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block: the block size must be an integer ≥ 1, got {block!r}")
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol: must be a finite number > 0, got {tol!r}")
    op = as_operator(operator)
    n = op.shape[0]
    width = min(block, n)
    if max_products is not None and max_products < width + 1:
        raise ValueError(f"max_products: must be ≥ block + 1 = {width + 1}, got {max_products}")
    tol = effective_tol(tol, float(getattr(op, "precision_floor", 0.0)))
    wide = torch.float64
    eps = torch.finfo(op.dtype).eps
    draw = torch.randn(n, width, generator=torch.Generator().manual_seed(seed), dtype=wide)
    first, _ = torch.linalg.qr(draw.to(op.device))
    # the whole basis at once when the budget bounds it (no copy as it grows: on a device a
    # column of a large model is most of a gigabyte), else doubled as needed
    capacity = min(n, max_products) if max_products is not None else max(4 * width, 16)
    basis = torch.empty(n, capacity, dtype=wide, device=op.device)
    basis[:, :width] = first
    projected = torch.zeros(capacity + width, capacity, dtype=wide)
    begin, end = 0, width  # the latest block's columns of the basis
    scale, previous, change = 0.0, math.nan, math.inf
    room, failed, verified_at = 1.0, 0, -1
    products = steps = verifications = 0
    stopped_by, residual, theta = "max_products", math.inf, math.nan
    ritz = ritz_vectors = torch.zeros(0)
    while True:
        if max_products is not None and products + (end - begin) + 1 > max_products:
            break
        image = op.matmat(basis[:, begin:end].to(op.dtype)).to(wide)
        products += end - begin
        steps += 1
        coefficients = torch.zeros(end, end - begin, dtype=wide, device=op.device)
        for _ in range(2):  # classical Gram–Schmidt twice (DGKS)
            amounts = basis[:, :end].T @ image
            image -= basis[:, :end] @ amounts
            coefficients += amounts
        projected[:end, begin:end] = coefficients.cpu()
        ritz, ritz_vectors, skew = _rayleigh_ritz(projected[:end, :end])
        scale = max(scale, float(ritz.abs().max()))
        following, coupling = _orthonormal_block(image, 100 * eps * scale)
        following = following[:, : n - end]  # never more than the space has left
        coupling = coupling[: following.shape[1]].cpu()
        theta, s = float(ritz[-1]), ritz_vectors[:, -1]
        krylov = _relative(float((coupling @ s[begin:end]).norm()), theta, scale, op.dtype)
        asymmetry = _relative(float((skew @ s).norm()), theta, scale, op.dtype)
        estimate = math.hypot(krylov, asymmetry)
        if not math.isnan(previous):
            change = _relative(abs(theta - previous), theta, scale, op.dtype)
        previous = theta
        exhausted = end == n or following.shape[1] == 0
        if exhausted:
            change = 0.0 if end == n else change
        passed = estimate <= room * tol and change <= tol
        floored = krylov <= room * tol and asymmetry > tol
        overdue = verified_at >= 0 and steps >= verified_at + max(5, verified_at // 2)
        if passed or floored or overdue or exhausted:
            if max_products is not None and products + 1 > max_products:
                break
            residual = _verified_residual(op, basis[:, :end], s, theta, scale)
            products += 1
            verifications += 1
            verified_at = steps
            if residual <= tol and change <= tol:
                stopped_by = "tol"
                break
            if exhausted:
                stopped_by = "exhausted" if end == n else "invariant"
                break
            noise = math.sqrt(max(residual * residual - estimate * estimate, 0.0))
            failed += 1
            room = min(room, math.sqrt(max(1.0 - (noise / tol) ** 2, 0.0)) / 2)
            if noise >= tol or room < 1e-3 or failed >= _MAX_FAILED_CHECKS:
                stopped_by = "precision"
                break
        rows = following.shape[1]
        if end + rows > basis.shape[1]:  # grow the basis and the projected matrix
            grown = max(2 * basis.shape[1], end + rows)
            basis = torch.cat([basis, basis.new_empty(n, grown - basis.shape[1])], dim=1)
            larger = torch.zeros(grown + width, grown, dtype=wide)
            larger[: projected.shape[0], : projected.shape[1]] = projected
            projected = larger
        basis[:, end : end + rows] = following
        projected[end : end + rows, begin:end] = coupling
        begin, end = end, end + rows
    if verified_at != steps and steps > 0:  # a run stopped by its budget: measure what it has
        size = ritz_vectors.shape[0]
        theta = float(ritz[-1])
        residual = _verified_residual(op, basis[:, :size], ritz_vectors[:, -1], theta, scale)
        products += 1
        verifications += 1
    return BlockRun(
        value=theta,
        residual=residual,
        change=change,
        products=products,
        block_steps=steps,
        verifications=verifications,
        basis_size=int(ritz_vectors.shape[0]),
        converged=residual <= tol and change <= tol,
        stopped_by=stopped_by,
    )


def _verified_residual(
    op: LinearOperator, basis: Tensor, s: Tensor, theta: float, scale: float
) -> float:
    """‖A y − θ y‖ / max(|θ|, √ε·‖A‖) for y = Q s in the operator's dtype, made unit: one product."""
    vector = (basis @ s.to(basis.device)).to(op.dtype)
    vector = vector / vector.norm()
    image = op.matvec(vector).to(torch.float64)
    amount = float((image - theta * vector.to(torch.float64)).norm())
    return _relative(amount, theta, scale, op.dtype)


def per_vector_costs(
    operator: LinearOperator, widths: Sequence[int], repeats: int, seed: int = 0
) -> dict[int, dict[str, float]]:
    """For each b of ``widths``: the least seconds over ``repeats`` of one ``matmat`` of b
    columns and of b ``matvec`` calls (the same columns), interleaved b by b, and their ratio
    c_b = matmat / (b matvecs), the cost of a vector in a block over a single product's."""
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(operator.shape[0], max(widths), generator=generator).to(
        device=operator.device, dtype=operator.dtype
    )
    synchronise = torch.cuda.synchronize if operator.device.type == "cuda" else (lambda: None)
    operator.matvec(vectors[:, 0])  # warm-up: kept graphs built, kernels chosen
    operator.matmat(vectors[:, : max(widths)])
    block = dict.fromkeys(widths, math.inf)
    single = dict.fromkeys(widths, math.inf)
    for _ in range(repeats):
        for width in widths:
            synchronise()
            began = time.perf_counter()
            operator.matmat(vectors[:, :width])
            synchronise()
            block[width] = min(block[width], time.perf_counter() - began)
            began = time.perf_counter()
            for column in range(width):
                operator.matvec(vectors[:, column])
            synchronise()
            single[width] = min(single[width], time.perf_counter() - began)
    return {
        width: {
            "matmat_s": block[width],
            "matvecs_s": single[width],
            "per_vector": block[width] / single[width],
        }
        for width in widths
    }


def single_lanczos(operator: LinearOperator | Tensor, tol: float, seed: int) -> dict[str, Any]:
    """curvcal's Lanczos for λmax (the command's default), as a row of the same fields as a
    :class:`BlockRun`'s."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        spectrum = eigenvalues(operator, 1, tol=tol, seed=seed, max_iter=400)
    top = spectrum.values[0]
    return {
        "value": top.value, "residual": top.residual, "change": top.relative_change,
        "products": spectrum.matvecs, "block_steps": top.iterations,
        "verifications": spectrum.matvecs - top.iterations, "basis_size": top.iterations,
        "converged": spectrum.converged, "stopped_by": spectrum.stopped_by,
    }  # fmt: skip


def dense_case(top: Sequence[float], n: int, seed: int = 0) -> Tensor:
    """A P×P float64 symmetric matrix V diag(λ) Vᵀ: the ``top`` eigenvalues, the other n −
    len(top) spread evenly over [0, 0.9], V a Haar-random orthogonal matrix from ``seed``."""
    generator = torch.Generator().manual_seed(1000 + seed)
    rotation, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    spectrum = torch.cat([
        torch.tensor(top, dtype=torch.float64),
        torch.linspace(0.0, 0.9, n - len(top), dtype=torch.float64),
    ])  # fmt: skip
    return (rotation * spectrum) @ rotation.T


def run_strategies(
    operator: LinearOperator | Tensor, blocks: Sequence[int], seeds: Sequence[int], case: str
) -> list[dict[str, Any]]:
    """Single-vector and block Lanczos at each tol of TOLS, seed by seed, interleaved."""
    runs = []
    for seed in seeds:
        for tol in TOLS:
            began = time.perf_counter()
            row = single_lanczos(operator, tol, seed)
            runs.append({"case": case, "seed": seed, "tol": tol, "block": 1, "strategy": "single",
                         **row, "seconds": time.perf_counter() - began})  # fmt: skip
            for block in blocks:
                began = time.perf_counter()
                found = block_lanczos(operator, block, tol=tol, seed=seed, max_products=800)
                runs.append({"case": case, "seed": seed, "tol": tol, "block": block,
                             "strategy": f"block {block}", **asdict(found),
                             "seconds": time.perf_counter() - began})  # fmt: skip
    return runs


def summarise(
    runs: list[dict[str, Any]], costs: dict[str, dict[int, dict[str, float]]]
) -> list[dict[str, Any]]:
    """Per (case, tol, strategy): medians over the seeds; the break-even per-vector cost
    c* = single products / block products; and full-product units = products × c_b for each
    timed operator variant (the ViT case only)."""
    rows = []
    for case in dict.fromkeys(r["case"] for r in runs):
        for tol in TOLS:
            mine = [r for r in runs if r["case"] == case and r["tol"] == tol]
            single = statistics.median(r["products"] for r in mine if r["block"] == 1)
            reference = statistics.median(r["value"] for r in mine if r["block"] == 1)
            for block in dict.fromkeys(r["block"] for r in mine):
                these = [r for r in mine if r["block"] == block]
                products = statistics.median(r["products"] for r in these)
                units = {
                    variant: products * (1.0 if block == 1 else table[block]["per_vector"])
                    for variant, table in costs.items()
                    if case == "vit" and (block == 1 or block in table)
                }
                rows.append({
                    "case": case, "tol": tol, "block": block, "strategy": these[0]["strategy"],
                    "products": products,
                    "block_steps": statistics.median(r["block_steps"] for r in these),
                    "verifications": statistics.median(r["verifications"] for r in these),
                    "break_even": single / products, "units": units,
                    "value": statistics.median(r["value"] for r in these),
                    "agrees": all(
                        abs(r["value"] - reference) <= 10 * tol * abs(reference) for r in these
                    ),
                    "converged": all(r["converged"] for r in these),
                    "seconds": statistics.median(r["seconds"] for r in these),
                })  # fmt: skip
    return rows


def measure(options: argparse.Namespace) -> dict[str, Any]:
    model, images, labels, last_loss = trained_problem(options)
    data = batches(images, labels, options.batch)
    blocks = [b for b in BLOCKS if b <= options.max_block]
    widths = [w for w in WIDTHS if w <= options.max_block]
    parts = options.parts.split(",")
    costs: dict[str, dict[int, dict[str, float]]] = {}
    graphs: dict[str, Any] = {}
    if "costs" in parts:
        for variant, keywords in VARIANTS.items():
            timed = curvcal.hessian_operator(model, data, **keywords)
            costs[variant] = per_vector_costs(timed, widths, options.repeats)
            graphs[variant] = {"graphs_kept": timed.graphs_kept, "engine": timed.engine,
                               "probe_batch": timed.probe_batch}  # fmt: skip
            del timed
    full = curvcal.hessian_operator(model, data)
    runs: list[dict[str, Any]] = []
    if "products" in parts:
        seeds = range(options.first_seed, options.first_seed + options.seeds)
        runs += run_strategies(full, blocks, seeds, "vit")
        for name, top in DENSE_TOPS.items():
            runs += run_strategies(dense_case(top, options.dense_size), blocks, seeds, name)
    return {"last_training_loss": last_loss, "n_params": full.shape[0], "runs": runs,
            "costs": costs, "operators": graphs}  # fmt: skip


def merged(paths: Sequence[str]) -> dict[str, Any]:
    """The runs of earlier ``--json`` reports together (seeds measured in separate runs), with
    the per-vector costs of the first report that timed them."""
    reports = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            reports.append(json.load(handle))
    timed = next((r for r in reports if r["costs"]), reports[0])
    costs = {
        variant: {int(width): cells for width, cells in table.items()}
        for variant, table in timed["costs"].items()
    }
    return {
        "last_training_loss": reports[0]["last_training_loss"],
        "n_params": reports[0]["n_params"],
        "runs": [run for report in reports for run in report["runs"]],
        "costs": costs,
        "operators": timed["operators"],
    }


def print_tables(measured: dict[str, Any], rows: list[dict[str, Any]], options: Any) -> None:
    """The per-vector costs (when timed) and the products table, as markdown."""
    costs = measured["costs"]
    seeds = len({r["seed"] for r in measured["runs"]})
    print(
        f"ViT ({measured['n_params']:,} parameters, last training loss "
        f"{measured['last_training_loss']:.3f}), N = {options.samples}, float32, "
        f"{options.threads} thread(s), median of {seeds} seed(s); dense cases "
        f"P = {options.dense_size}, float64"
    )
    if costs:
        widths = list(next(iter(costs.values())))
        print("\nPer-vector cost c_b = matmat(b) / (b matvecs), least of "
              f"{options.repeats} (seconds of matmat / b matvecs):\n")  # fmt: skip
        print("| operator | " + " | ".join(f"b = {w}" for w in widths) + " |")
        print("|---|" + "---:|" * len(widths))
        for variant, table in costs.items():
            kept = measured["operators"][variant]
            graphs = "kept" if kept["graphs_kept"] else "rebuilt"
            cells = " | ".join(
                f"{t['per_vector']:.2f} ({t['matmat_s']:.3f} / {t['matvecs_s']:.3f})"
                for t in table.values()
            )
            print(f"| {variant} ({kept['engine']}, graphs {graphs}) | {cells} |")
    if not rows:
        return
    variants = list(costs)
    print()
    print("| case | tol | strategy | products (block steps) | break-even c* | "
          + "".join(f"units, {v} | " for v in variants) + "λmax | converged |")  # fmt: skip
    print("|---|---:|---|---:|---:|" + "---:|" * len(variants) + "---:|---|")
    for row in rows:
        units = "".join(
            (f"{row['units'][v]:.2f} | " if v in row["units"] else "— | ") for v in variants
        )
        print(
            f"| {row['case']} | {row['tol']:g} | {row['strategy']} | {row['products']:g} "
            f"({row['block_steps']:g}) | {row['break_even']:.2f} | {units}{row['value']:.6g} "
            f"| {'yes' if row['converged'] else 'NO'}{'' if row['agrees'] else ' (differs)'} |"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="N, the images")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, +1, …")
    parser.add_argument(
        "--parts", default="costs,products",
        help="costs (the per-vector timings), products (the Lanczos runs), or both",
    )  # fmt: skip
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--max-block", type=int, default=8, help="the largest b (2, 4 or 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timings kept: the least")
    parser.add_argument("--dense-size", type=int, default=2000, help="P of the dense cases")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a tiny ViT on 32 images, one seed")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON",
        help="measure nothing: the table of earlier --json reports together",
    )  # fmt: skip
    options = parser.parse_args(argv)
    if options.smoke:
        options.samples, options.batch, options.seeds, options.train_steps = 32, 16, 1, 3
        options.max_block, options.repeats, options.dense_size = 4, 1, 200
    if options.samples < 2 or options.seeds < 1 or options.batch < 1 or options.repeats < 1:
        parser.error("--samples must be ≥ 2, --seeds, --batch and --repeats ≥ 1")
    if not set(options.parts.split(",")) <= {"costs", "products"} or not options.parts:
        parser.error("--parts: costs, products or costs,products")
    if options.max_block not in BLOCKS:
        parser.error(f"--max-block: one of {', '.join(map(str, BLOCKS))}")
    if options.dense_size < 2 * max(BLOCKS):
        parser.error(f"--dense-size must be ≥ {2 * max(BLOCKS)}")
    measured = merged(options.merge) if options.merge else measure(options)
    rows = summarise(measured["runs"], measured["costs"])
    print_tables(measured, rows, options)
    report = {"options": vars(options), "rows": rows, **measured}
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1, default=str)
    return report


if __name__ == "__main__":
    main()
