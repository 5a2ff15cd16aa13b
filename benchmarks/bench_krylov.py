"""Krylov-basis benchmark: one Lanczos step's reorthogonalisation, block against vector by vector.

Clears a vector of an orthonormal basis of m vectors of length P (float64, as Lanczos keeps
it), the way :class:`curvcal.curvature.krylov.KrylovBasis` does (the two latest vectors,
then one block Gram–Schmidt pass of matrix–vector products, a second only on the DGKS test),
against the baseline every Lanczos code starts from: modified Gram–Schmidt twice, a dot and an
in-place update per basis vector and pass. A third column clears the same vector in a basis
stored in float32 and computed in float64 (``storage=torch.float32``, what Lanczos keeps for
float32 products: every dot widened 65,536 columns at a time), timed in the same rounds. The
vector is a Lanczos-like image (large
components along the latest two basis vectors, a small remainder), so the DGKS test sees what
it sees in a run. One thread; the two are interleaved and the minimum of ``--repeats`` is
quoted with its ratio. The results are checked against each other (same remainder, same
coefficients to rounding).

    python benchmarks/bench_krylov.py                      # P = 11,181,642 (ResNet-18), m = 4, 12, 24
    python benchmarks/bench_krylov.py --size 1000000 --vectors 4,12 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from curvcal.curvature.krylov import KrylovBasis


def vector_by_vector(vector: Tensor, basis: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The baseline: modified Gram–Schmidt twice, in place on one copy."""
    coefficients = torch.zeros(len(basis), dtype=vector.dtype)
    vector = vector.clone()
    for _ in range(2):
        for index, b in enumerate(basis):
            amount = torch.dot(b, vector)
            vector.add_(b, alpha=-float(amount))
            coefficients[index] += amount
    return vector, coefficients


def lanczos_like(columns: Tensor, generator: torch.Generator) -> Tensor:
    """10³ and 10² along the two latest basis vectors, 1 along the rest, and a unit remainder."""
    outside = torch.randn(columns.shape[1], dtype=torch.float64, generator=generator)
    outside -= columns.t() @ (columns @ outside)
    outside /= outside.norm()
    return 1e3 * columns[-1] + 1e2 * columns[-2] + columns.sum(dim=0) + outside


def _timed(run: Callable[[], Any], timings: list[float]) -> Any:
    start = time.perf_counter()
    result = run()
    timings.append(time.perf_counter() - start)
    return result


def measure(size: int, count: int, repeats: int, seed: int = 0) -> dict[str, float]:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.empty(count, size, dtype=torch.float64)
    for i in range(count):  # an orthonormal basis without a size × count QR
        row = torch.randn(size, dtype=torch.float64, generator=generator)
        for _ in range(2):
            row -= rows[:i].t() @ (rows[:i] @ row)
        rows[i] = row / row.norm()
    as_list = [rows[i] for i in range(count)]
    blocks = KrylovBasis(size, torch.float64, "cpu")
    narrow = KrylovBasis(size, torch.float64, "cpu", storage=torch.float32)
    for i in range(count):
        blocks.append(rows[i])
        narrow.append(rows[i])
    vector = lanczos_like(rows, generator)
    ours: list[float] = []
    theirs: list[float] = []
    stored: list[float] = []
    for _ in range(repeats):
        new, new_coefficients = _timed(lambda: blocks.extend(vector), ours)
        old, old_coefficients = _timed(lambda: vector_by_vector(vector, as_list), theirs)
        kept, _ = _timed(lambda: narrow.extend(vector), stored)
    difference = float((new - old).norm() / old.norm())
    coefficient_difference = float((new_coefficients - old_coefficients).abs().max())
    if difference > 1e-8 or coefficient_difference > 1e-8 * float(vector.norm()):
        raise SystemExit(
            f"bench_krylov: the two disagree ({difference:.1e}, {coefficient_difference:.1e})"
        )
    # against rows rounded to float32, the remainder agrees to the rounding of the components
    # removed (10³ along the latest vector, 6e-8 relative)
    narrow_difference = float((kept - old).norm() / old.norm())
    if narrow_difference > 1e-3:
        raise SystemExit(f"bench_krylov: the float32 rows disagree ({narrow_difference:.1e})")
    return {
        "size": size,
        "vectors": count,
        "block_s": min(ours),
        "vector_by_vector_s": min(theirs),
        "ratio": min(ours) / min(theirs),
        "relative_difference": difference,
        "float32_rows_s": min(stored),
        "float32_rows_ratio": min(stored) / min(ours),
        "float32_rows_difference": narrow_difference,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=11_181_642, help="vector length P")
    parser.add_argument("--vectors", default="4,12,24", help="basis sizes m, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="OUT")
    options = parser.parse_args(argv)
    if options.size < 3 or options.repeats < 1:
        parser.error("--size must be ≥ 3 and --repeats ≥ 1")
    counts = [int(c) for c in options.vectors.split(",") if c.strip()]
    if not counts or min(counts) < 2 or max(counts) >= options.size:
        parser.error("--vectors: each m must be ≥ 2 and < --size")
    torch.set_num_threads(options.threads)
    rows = [measure(options.size, count, options.repeats) for count in counts]
    print(f"P = {options.size:,}, float64, {options.threads} thread(s), min of {options.repeats}")
    print()
    print(
        "| basis vectors m | block (KrylovBasis) s | vector by vector s | ratio "
        "| float32 rows s | float32 rows / block |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['vectors']} | {row['block_s']:.3f} | {row['vector_by_vector_s']:.3f} "
            f"| {row['ratio']:.2f} | {row['float32_rows_s']:.3f} "
            f"| {row['float32_rows_ratio']:.2f} |"
        )
    report = {"options": vars(options), "rows": rows}
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    return report


if __name__ == "__main__":
    main()
