"""The full maps' last stretch: Hessian products and CPU seconds of curvcal's Dirichlet fit with
the Kronecker preconditioner alone against the same fit that changes to the per-class block
preconditioner (curvcal.calibration.class_blocks) once a step's solve needs
``STRETCH_PRODUCTS`` products.

On the synthetic over-confident logits of ``bench_calibration.py`` (fixed seed), one thread,
the two interleaved, minimum CPU seconds over ``--repeats``. Each row: Newton steps, Hessian
products, CPU seconds to the fit's own end (max |∂L| under the gradient tolerance, or
``--cap`` CPU seconds), the objective reached, the products and CPU seconds it took to first
come within 1e-9 · max(|L|, 1) of the lower of the two final objectives (``to common``:
the same objective for both), and max |Δp| between the two maps' probabilities on the fit
rows.

    python benchmarks/bench_full_map_stretch.py --sizes 2000x300,20000x100 --repeats 2
    python benchmarks/bench_full_map_stretch.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibration import _one_blas_thread, synthetic_logits

import curvcal.calibration.linear as linear

QUICK_SIZES = "200x40"
VARIANTS = {"kronecker": 10**12, "blocks": linear.STRETCH_PRODUCTS}


class _Capped(Exception):
    pass


def one_fit(
    logits: torch.Tensor, labels: torch.Tensor, strength: float, switch: int, cap: float
) -> dict[str, Any]:
    """One traced Dirichlet ODIR fit with the block preconditioner's switch at ``switch``
    products: its path of (CPU s, products, objective), steps, end and map."""
    products = [0]
    steps = [0]
    path: list[tuple[float, int, float]] = []
    last: list[torch.Tensor] = []
    original = linear._steihaug

    def counting(times: Callable[[np.ndarray], np.ndarray], *args: Any, **kwargs: Any) -> Any:
        def counted(vector: np.ndarray) -> np.ndarray:
            products[0] += 1
            return times(vector)

        steps[0] += 1
        return original(counted, *args, **kwargs)

    start = time.process_time()

    def trace(value: float, current: Callable[[], torch.Tensor]) -> None:
        seconds = time.process_time() - start
        path.append((seconds, products[0], value))
        last[:] = [current()]
        if seconds > cap:
            raise _Capped

    linear._steihaug = counting
    linear.STRETCH_PRODUCTS = switch
    capped = False
    try:
        linear.fit_linear(
            logits,
            labels,
            "dirichlet",
            l2_off_diagonal=strength,
            l2_bias=strength,
            trace=trace,
        )
    except _Capped:
        capped = True
    finally:
        linear._steihaug = original
        linear.STRETCH_PRODUCTS = VARIANTS["blocks"]
    seconds = time.process_time() - start
    return {
        "seconds": seconds,
        "products": products[0],
        "steps": steps[0],
        "objective": min(v for _, _, v in path),
        "capped": capped,
        "path": path,
        "map": last[0],
    }


def reached(path: list[tuple[float, int, float]], target: float) -> tuple[float, int] | None:
    for seconds, products, value in path:
        if value <= target:
            return seconds, products
    return None


def bench(n: int, k: int, strength: float, repeats: int, cap: float) -> list[dict[str, Any]]:
    logits, labels = synthetic_logits(n, k)
    logp = torch.log_softmax(logits.double(), 1)
    runs: dict[str, dict[str, Any]] = {}
    for _ in range(repeats):
        for name, switch in VARIANTS.items():
            run = one_fit(logits, labels, strength, switch, cap)
            print(f"  {n}x{k} λ={strength:g} {name}: {run['seconds']:.2f} s", file=sys.stderr)
            if name not in runs or run["seconds"] < runs[name]["seconds"]:
                runs[name] = run
    common = min(r["objective"] for r in runs.values())
    target = common + 1e-9 * max(abs(common), 1.0)
    probabilities = {}
    for name, run in runs.items():
        v = run["map"]
        probabilities[name] = torch.softmax(logp @ v[:, :k].T + v[:, k], 1)
    moved = float((probabilities["kronecker"] - probabilities["blocks"]).abs().max())
    rows = []
    for name, run in runs.items():
        to_common = reached(run["path"], target)
        rows.append(
            {
                "n": n,
                "k": k,
                "strength": strength,
                "preconditioner": name,
                "steps": run["steps"],
                "products": run["products"],
                "seconds": run["seconds"],
                "capped": run["capped"],
                "objective": run["objective"],
                "to_common_seconds": None if to_common is None else to_common[0],
                "to_common_products": None if to_common is None else to_common[1],
                "max_dp_between": moved,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000x300,20000x100")
    parser.add_argument("--strength", type=float, default=1e-2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cap", type=float, default=math.inf, help="CPU seconds per fit")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SIZES}, one repeat")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = QUICK_SIZES, 1
    torch.set_num_threads(1)
    _one_blas_thread()
    rows = []
    for size in args.sizes.split(","):
        n, k = (int(v) for v in size.lower().split("x"))
        rows += bench(n, k, args.strength, args.repeats, args.cap)
    print(
        "| N × K | λ | preconditioner | Newton steps | products | CPU s (min) | objective "
        "| products to common | CPU s to common | max \\|Δp\\| between |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        secs = f"{r['seconds']:.2f}" + (" (capped)" if r["capped"] else "")
        to_p = "" if r["to_common_products"] is None else str(r["to_common_products"])
        to_s = "" if r["to_common_seconds"] is None else f"{r['to_common_seconds']:.2f}"
        print(
            f"| {r['n']:,} × {r['k']:,} | {r['strength']:g} | {r['preconditioner']} "
            f"| {r['steps']} | {r['products']:,} | {secs} | {r['objective']:.12e} | {to_p} "
            f"| {to_s} | {r['max_dp_between']:.1e} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
