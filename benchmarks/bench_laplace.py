"""Last-layer Laplace: curvcal's kernels against laplace-torch on the same head and data.

One problem per size ``NxDxK``: features φ (N×D, float64, a fixed random tanh layer of Gaussian
inputs), a head ``nn.Linear(D, K)`` with a bias (scaled so the MAP softmax is over-confident),
labels drawn from softmax(½ f), and ``--eval`` further rows to predict. Both libraries get the
same float64 tensors and do the same three steps, timed as one task:

- curvcal: :func:`~curvcal.calibration.laplace.fit_laplace` (GGN, δ by the marginal likelihood,
  Brent's method in log δ; it also scores its own fit split, which laplace-torch does not), then
  the probit predictive of the posterior at the evaluation rows;
- laplace-torch: ``Laplace(model, "classification", subset_of_weights="last_layer",
  hessian_structure=S)`` on ``nn.Sequential(nn.Identity(), head)``, ``fit`` on a DataLoader of
  ``--batch-size`` rows, ``optimize_prior_precision(method="marglik")`` (its default: 100 Adam
  steps in log δ) and ``la(x_eval, link_approx="probit")`` under ``torch.no_grad()``.

``full`` runs only where the P×P GGN (P = (D+1)K) is at most ``--full-max`` parameters.
One thread, the two libraries interleaved in each repeat, the minimum of ``--repeats`` CPU
seconds (``time.process_time``) and the peak resident memory each task added (sampled every
millisecond). Each row states how far the two agree: δ (relative) and the predictive
probabilities (max absolute difference) at each library's own δ, and the probabilities again
with laplace-torch set to curvcal's δ (the same posterior: the kernels' agreement).

    python benchmarks/bench_laplace.py --sizes 50000x512x10,50000x512x100 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibration import _one_blas_thread, load_peer, measure_cpu

from curvcal.calibration.laplace import fit_laplace

#: The sizes of a practitioner's last layer: 50,000 fit rows of 512 features, 10 to 1,000 classes.
SIZES = "50000x512x10,50000x512x100,50000x512x1000"
QUICK_SIZES = "400x8x3,300x6x12"
#: ``full`` up to this many parameters: a P×P float64 GGN of 210 MB (laplace-torch also holds a
#: float32 identity of P² and a float64 copy for the inverse).
FULL_MAX = 5200
LIBRARIES = (("curvcal", "curvcal_stages"), ("laplace-torch", "peer_stages"))


def problem(n: int, d: int, k: int, n_eval: int, seed: int = 0) -> dict[str, Tensor]:
    """Features of fit and evaluation rows, a head (W, b) and fit labels, float64."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n + n_eval, d, generator=g, dtype=torch.float64)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    phi = torch.tanh(inputs @ mix)
    weight = 3.0 * torch.randn(k, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    bias = 0.5 * torch.randn(k, generator=g, dtype=torch.float64)
    logits = phi[:n] @ weight.T + bias
    labels = torch.multinomial(torch.softmax(0.5 * logits, 1), 1, generator=g)[:, 0]
    return {"fit": phi[:n], "eval": phi[n:], "labels": labels, "weight": weight, "bias": bias}


def run_curvcal(
    data: dict[str, Tensor], structure: str, stages: dict[str, float]
) -> tuple[float, Tensor]:
    """δ and the probit predictive probabilities at the evaluation rows; the CPU seconds of
    the fit (GGN and δ) and of the predictive go into ``stages``."""
    start = time.process_time()
    fit = fit_laplace(
        data["fit"], data["labels"], data["weight"], data["bias"], structure=structure
    )
    middle = time.process_time()
    probs = fit.calibrator.probabilities(data["eval"])
    stages["fit"], stages["predictive"] = middle - start, time.process_time() - middle
    return fit.prior_precision, probs


def peer_model(data: dict[str, Tensor]) -> nn.Module:
    """``nn.Sequential(nn.Identity(), head)``: the head is the last layer, its inputs φ."""
    k, d = data["weight"].shape
    head = nn.Linear(d, k).double()
    with torch.no_grad():
        head.weight.copy_(data["weight"])
        head.bias.copy_(data["bias"])
    return nn.Sequential(nn.Identity(), head).eval()


def run_peer(
    laplace: Any,
    data: dict[str, Tensor],
    structure: str,
    batch_size: int,
    rows: int,
    stages: dict[str, float],
) -> tuple[Any, float, Tensor]:
    """laplace-torch's fitted object, its δ and its probit predictive at the evaluation rows
    (``rows`` rows a call: see :func:`predictive_rows`); CPU seconds of each step in ``stages``."""
    start = time.process_time()
    la = laplace.Laplace(
        peer_model(data),
        "classification",
        subset_of_weights="last_layer",
        hessian_structure=structure,
    )
    dataset = torch.utils.data.TensorDataset(data["fit"], data["labels"])
    la.fit(torch.utils.data.DataLoader(dataset, batch_size=batch_size))
    fitted = time.process_time()
    la.optimize_prior_precision(method="marglik")
    delta = float(la.prior_precision)
    prior = time.process_time()
    probs = peer_predictive(la, data["eval"], rows)
    stages["fit"], stages["prior"] = fitted - start, prior - fitted
    stages["predictive"] = time.process_time() - prior
    return la, delta, probs


def predictive_rows(k: int, parameters: int, budget_mb: float) -> int:
    """Rows per call of laplace-torch's predictive: it builds the last layer's Jacobian of every
    row, K×P float64 numbers a row (and a temporary as large), so rows = budget / (2·8·K·P);
    0 when one row is over the budget."""
    return int(budget_mb * 2**20 // (2 * 8 * k * parameters))


def peer_predictive(la: Any, x: Tensor, rows: int) -> Tensor:
    """laplace-torch's probit predictive, ``rows`` rows a call, without autograd."""
    with torch.no_grad():
        parts = [
            la(x[start : start + rows], link_approx="probit")
            for start in range(0, x.shape[0], rows)
        ]
    return torch.cat(parts)


def bench_case(
    laplace: Any, size: tuple[int, int, int], structure: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One (size, structure): both libraries, interleaved, min CPU seconds and peak memory."""
    n, d, k = size
    data = problem(n, d, k, args.eval)
    row: dict[str, Any] = {"n": n, "d": d, "k": k, "structure": structure}
    row["parameters"] = (d + 1) * k
    rows = min(args.batch_size, predictive_rows(k, row["parameters"], args.peer_mb))
    if rows < 1:
        row["peer_skipped"] = (
            f"one row of laplace-torch's predictive Jacobian is K·P float64 = "
            f"{8 * k * row['parameters'] / 2**20:,.0f} MiB, twice that over --peer-mb {args.peer_mb:g}"
        )
        laplace = None
    best: dict[str, list[float]] = {"curvcal": [math.inf, 0.0], "laplace-torch": [math.inf, 0.0]}
    ours: tuple[float, Tensor] | None = None
    peer: tuple[Any, float, Tensor] | None = None
    for _ in range(args.repeats):
        stages: dict[str, float] = {}
        _wall, cpu, ours, peak = measure_cpu(
            lambda stages=stages: run_curvcal(data, structure, stages)
        )
        if cpu < best["curvcal"][0]:
            row["curvcal_stages"] = stages
        best["curvcal"] = [min(best["curvcal"][0], cpu), max(best["curvcal"][1], peak)]
        if laplace is None:
            continue
        peer, peer_stages = None, {}
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            _wall, cpu, peer, peak = measure_cpu(
                lambda peer_stages=peer_stages: run_peer(
                    laplace, data, structure, args.batch_size, rows, peer_stages
                )
            )
        if cpu < best["laplace-torch"][0]:
            row["peer_stages"] = peer_stages
        best["laplace-torch"] = [
            min(best["laplace-torch"][0], cpu),
            max(best["laplace-torch"][1], peak),
        ]
    assert ours is not None
    row["curvcal_seconds"], row["curvcal_peak_mb"] = best["curvcal"]
    row["curvcal_delta"] = ours[0]
    if peer is None:
        return row
    la, peer_delta, peer_probs = peer
    row["peer_seconds"], row["peer_peak_mb"] = best["laplace-torch"]
    row["peer_delta"] = peer_delta
    row["ratio"] = row["peer_seconds"] / row["curvcal_seconds"]
    row["delta_rel_diff"] = abs(peer_delta / ours[0] - 1)
    row["probs_max_diff_own_delta"] = float((peer_probs - ours[1]).abs().max())
    la.prior_precision = torch.tensor(ours[0], dtype=torch.float64)
    same = peer_predictive(la, data["eval"], rows)
    row["probs_max_diff_same_delta"] = float((same - ours[1]).abs().max())
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (CPU seconds, peak MB added, agreement)."""
    lines = [
        "| N × D × K | structure | P | curvcal s | laplace-torch s | peer / curvcal "
        "| curvcal MB | laplace-torch MB | δ curvcal | δ rel. diff | max Δp own δ | max Δp same δ |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        peer = "peer_seconds" in r
        cells = [
            f"{r['n']} × {r['d']} × {r['k']}",
            r["structure"],
            f"{r['parameters']:,}",
            f"{r['curvcal_seconds']:.3g}",
            f"{r['peer_seconds']:.3g}" if peer else "—",
            f"{r['ratio']:.2f}" if peer else "—",
            f"{r['curvcal_peak_mb']:.0f}",
            f"{r['peer_peak_mb']:.0f}" if peer else "—",
            f"{r['curvcal_delta']:.4g}",
            f"{r['delta_rel_diff']:.1e}" if peer else "—",
            f"{r['probs_max_diff_own_delta']:.1e}" if peer else "—",
            f"{r['probs_max_diff_same_delta']:.1e}" if peer else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        stages = [
            f"{name} {step} {seconds:.3g}"
            for name, key in LIBRARIES
            if key in r
            for step, seconds in r[key].items()
        ]
        head = f"{r['n']} × {r['d']} × {r['k']} {r['structure']}"
        if stages:
            lines.append(f"\n{head}, CPU s of the fastest repeat: " + ", ".join(stages))
        if "peer_skipped" in r:
            lines.append(f"\n{head}: laplace-torch not run: {r['peer_skipped']}")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for part in text.split(","):
        n, d, k = (int(v) for v in part.lower().split("x"))
        sizes.append((n, d, k))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help=f"NxDxK,... (fit rows × features × classes; {SIZES})")
    parser.add_argument("--structures", default="full,kron")
    parser.add_argument("--eval", type=int, default=10000, help="evaluation rows")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4096, help="laplace-torch's batches")
    parser.add_argument(
        "--peer-mb",
        type=float,
        default=2048,
        help="memory for laplace-torch's predictive Jacobians",
    )
    parser.add_argument("--full-max", type=int, default=FULL_MAX, help="largest P for full")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (unless given), one repeat"
    )
    parser.add_argument("--json", help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or QUICK_SIZES
        args.eval, args.repeats, args.batch_size = 200, 1, 128
    args.sizes = args.sizes or SIZES
    torch.set_num_threads(1)
    _one_blas_thread()
    laplace = load_peer("laplace")
    rows = []
    for size in parse_sizes(args.sizes):
        for structure in args.structures.split(","):
            if structure == "full" and (size[1] + 1) * size[2] > args.full_max:
                continue
            rows.append(bench_case(laplace, size, structure, args))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
