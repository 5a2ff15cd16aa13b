"""Calibration benchmark: curvcal against torchmetrics, netcal and probmetrics on the same logits.

For each size (N × K) the script draws over-confident synthetic logits (labels sampled from
softmax(z), logits saved as 2.5·z in float32, fixed seed), then

- computes every curvcal metric (``calibration_metrics``) and the NLL temperature fit, and the
  peers' ECE, MCE, RMS-CE, AdaECE and temperature scaling on the same logits;
- checks agreement of every value where the conventions match ([a, b) bins for torchmetrics
  and netcal, so curvcal runs with ``edges="right"`` for those rows);
- times curvcal and the peers interleaved (one thread, minimum over ``--repeats``) and gives
  the ratio peer / curvcal.

A second part shows the conventions on which the libraries differ, on tiny hand-made inputs:
torchmetrics' hidden bin for confidence 1.0, the binary switch to positive-class ECE, equal-mass
bins with tied confidences, and the widely copied LBFGS temperature recipe.

Peers are imported lazily; a missing one is reported as "not installed" and skipped.

The focal temperature fit with its defaults (10 γ, ECE objective) runs in the same repeats and
is quoted as a ratio to the plain NLL temperature fit, with its passes over the data.

    python benchmarks/bench_calibration.py [--quick] [--repeats R] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import math
import os
import resource
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from curvcal.calibration import (
    calibration_metrics,
    expected_calibration_error,
    fit_focal_temperature,
    fit_temperature,
    negative_log_likelihood,
)

FULL_SIZES = ((1_000_000, 100), (50_000, 1_000))
QUICK_SIZES = ((100_000, 100), (20_000, 1_000))
OVERCONFIDENCE = 2.5
N_BINS = 15
PEERS = ("torchmetrics", "netcal", "probmetrics")
#: Rows of the first size on which the (slow) LBFGS recipe and netcal's fit are demonstrated.
RECIPE_ROWS = 100_000


def synthetic_logits(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits 2.5·z and int64 labels y ~ softmax(z) (Gumbel-max), z ~ N(0, σ²).

    σ = 1 + ln(K)/2 gives a top-label accuracy near one half; the factor 2.5 makes the scores
    over-confident, so the NLL-optimal temperature is close to 2.5.
    """
    generator = torch.Generator().manual_seed(seed)
    sigma = 1.0 + 0.5 * math.log(k)
    logits = torch.empty(n, k, dtype=torch.float32)
    labels = torch.empty(n, dtype=torch.int64)
    step = max(1, (1 << 20) // k)
    for start in range(0, n, step):
        rows = min(step, n - start)
        z = torch.randn(rows, k, generator=generator) * sigma
        uniform = torch.rand(rows, k, generator=generator).clamp_(min=1e-12)
        labels[start : start + rows] = (z - torch.log(-torch.log(uniform))).argmax(dim=1)
        logits[start : start + rows] = OVERCONFIDENCE * z
    return logits, labels


def load_peer(name: str) -> Any | None:
    """The peer's module, or None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Timer:
    """Minimum wall time per task over repeats; the tasks of one repeat run interleaved."""

    best: dict[str, float] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def run(self, name: str, task: Callable[[], Any]) -> Any:
        gc.collect()
        start = time.perf_counter()
        value = task()
        elapsed = time.perf_counter() - start
        self.best[name] = min(self.best.get(name, math.inf), elapsed)
        self.values[name] = value
        return value


# ---------------------------------------------------------------------------------------------
# The tasks: each returns a dict of named values.


def curvcal_all(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    m = calibration_metrics(logits, labels, bins=N_BINS)
    return {
        "ece": m.ece,
        "mce": m.mce,
        "rms_ce": m.rms_ce,
        "adaece": m.adaece,
        "classwise_ece": m.classwise_ece,
        "nll": m.nll,
        "brier": m.brier,
        "accuracy": m.accuracy,
        "smooth_ece": m.smooth_ece,
    }


def curvcal_right(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    m = calibration_metrics(logits, labels, bins=N_BINS, edges="right")
    return {"ece": m.ece, "mce": m.mce, "rms_ce": m.rms_ce}


def curvcal_ts(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    fit = fit_temperature(logits, labels)
    return {
        "temperature": fit.temperature,
        "nll_after": fit.nll_after,
        "derivative": fit.derivative,
        "n_evaluations": fit.n_evaluations,
    }


def curvcal_focal(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    fit = fit_focal_temperature(logits, labels)  # defaults: 10 γ, ECE objective
    return {
        "gamma": fit.gamma,
        "temperature": fit.temperature,
        "ece_after": fit.objective_after,
        "n_evaluations": fit.n_evaluations,
        "n_exact_evaluations": fit.n_exact_evaluations,
    }


def torchmetrics_ece_mce(tm: Any, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from torchmetrics.functional.classification import multiclass_calibration_error as ce

    k = logits.shape[1]
    # torchmetrics softmaxes scores outside [0, 1] itself (it guesses the input kind).
    return {
        "ece": float(ce(logits, labels, k, n_bins=N_BINS, norm="l1")),
        "mce": float(ce(logits, labels, k, n_bins=N_BINS, norm="max")),
    }


def torchmetrics_rms(tm: Any, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from torchmetrics.functional.classification import multiclass_calibration_error as ce

    return {"rms_ce": float(ce(logits, labels, logits.shape[1], n_bins=N_BINS, norm="l2"))}


def probabilities(logits: torch.Tensor) -> np.ndarray:
    """float64 softmax probabilities (netcal takes probabilities, not logits)."""
    return torch.softmax(logits.to(torch.float64), dim=1).numpy()


def netcal_ece_mce(nc: Any, probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from netcal.metrics import ECE, MCE

    return {
        "ece": float(ECE(bins=N_BINS).measure(probs, labels)),
        "mce": float(MCE(bins=N_BINS).measure(probs, labels)),
    }


def netcal_adaece(nc: Any, probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from netcal.metrics import ECE

    return {"adaece": float(ECE(bins=N_BINS, equal_intervals=False).measure(probs, labels))}


def netcal_ts(nc: Any, probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from netcal.scaling import TemperatureScaling

    model = TemperatureScaling()  # method "mle": scipy.optimize.minimize on the NLL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(probs, labels, tensorboard=False)
    # netcal multiplies log(clip(p)) by a weight: T = 1 / weight.
    return {"temperature": 1.0 / float(np.asarray(model.weights).reshape(-1)[0])}


def probmetrics_temperature_module() -> Any:
    """probmetrics' temperature-scaling module.

    ``probmetrics.calibrators/__init__`` imports every calibrator, some of which need numba;
    when that import fails the package is registered without running its ``__init__`` so the
    temperature-scaling module (which needs only torch) still loads.
    """
    try:
        return importlib.import_module("probmetrics.calibrators.temperature_scaling")
    except ImportError:
        sys.modules.pop("probmetrics.calibrators", None)
        root = importlib.util.find_spec("probmetrics")
        if root is None or root.origin is None:
            raise
        package = types.ModuleType("probmetrics.calibrators")
        package.__path__ = [os.path.join(os.path.dirname(root.origin), "calibrators")]
        sys.modules["probmetrics.calibrators"] = package
        return importlib.import_module("probmetrics.calibrators.temperature_scaling")


def probmetrics_ts(pm: Any, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from probmetrics.distributions import CategoricalLogits

    model = (
        probmetrics_temperature_module().TemperatureScalingCalibrator()
    )  # bisection on dN/d ln s, 30 steps, float32
    model.fit_torch(CategoricalLogits(logits), labels)
    return {"temperature": 1.0 / float(model.invtemp_)}


def lbfgs_recipe_ts(pm: Any, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from probmetrics.distributions import CategoricalLogits

    model = (
        probmetrics_temperature_module().GuoTemperatureScalingCalibrator()
    )  # LBFGS from T = 1.5, lr 0.01, 50 iterations
    model.fit_torch(CategoricalLogits(logits), labels)
    return {"temperature": float(model.temp_)}


# ---------------------------------------------------------------------------------------------


def nll_at(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Mean NLL of softmax(z / T), float64 (curvcal's definition)."""
    return negative_log_likelihood(logits.to(torch.float64) / temperature, labels)


def bench_size(
    n: int, k: int, repeats: int, peers: dict[str, Any], seed: int = 0, focal: bool = True
) -> dict[str, Any]:
    """Values and timings of one size; the peers run interleaved with curvcal."""
    logits, labels = synthetic_logits(n, k, seed)
    timer = Timer()
    tm, nc, pm = (peers.get(name) for name in PEERS)
    probs = probabilities(logits) if nc is not None else None
    labels_np = labels.numpy()
    for _ in range(repeats):
        timer.run("curvcal all metrics", lambda: curvcal_all(logits, labels))
        if tm is not None:
            timer.run("torchmetrics ECE+MCE", lambda: torchmetrics_ece_mce(tm, logits, labels))
        timer.run("curvcal TS (NLL)", lambda: curvcal_ts(logits, labels))
        if pm is not None:
            timer.run("probmetrics TS", lambda: probmetrics_ts(pm, logits, labels))
        if nc is not None:
            timer.run("netcal ECE+MCE", lambda: netcal_ece_mce(nc, probs, labels_np))
        if focal:
            timer.run("curvcal focal TS (defaults)", lambda: curvcal_focal(logits, labels))
    # Values only (not timed against each other beyond one run).
    right = curvcal_right(logits, labels)
    if tm is not None:
        timer.run("torchmetrics RMS", lambda: torchmetrics_rms(tm, logits, labels))
    if nc is not None:
        timer.run("netcal AdaECE", lambda: netcal_adaece(nc, probs, labels_np))
        timer.run("netcal TS", lambda: netcal_ts(nc, probs, labels_np))
    probs = None  # free the N×K float64 copy before the next size
    gc.collect()
    ours = timer.values["curvcal all metrics"]
    ts = timer.values["curvcal TS (NLL)"]
    rows: list[dict[str, Any]] = []

    def row(metric: str, peer: str, peer_value: float | None, our_value: float, note: str) -> None:
        difference = None if peer_value is None else abs(peer_value - our_value)
        rows.append(
            {
                "metric": metric,
                "peer": peer,
                "peer_value": peer_value,
                "curvcal": our_value,
                "abs_diff": difference,
                "convention": note,
            }
        )

    if tm is not None:
        tmv = {**timer.values["torchmetrics ECE+MCE"], **timer.values["torchmetrics RMS"]}
        for name in ("ece", "mce", "rms_ce"):
            row(name, "torchmetrics", tmv[name], right[name], "[a,b) edges (curvcal --edges right)")
    if nc is not None:
        ncv = timer.values["netcal ECE+MCE"]
        for name in ("ece", "mce"):
            row(name, "netcal", ncv[name], right[name], "[a,b) edges (curvcal --edges right)")
        row(
            "adaece",
            "netcal",
            timer.values["netcal AdaECE"]["adaece"],
            ours["adaece"],
            "netcal: np.quantile edges; curvcal: tie-safe rank cuts",
        )
        t_nc = timer.values["netcal TS"]["temperature"]
        row("TS temperature", "netcal", t_nc, ts["temperature"], "netcal fits log(clip(p))")
        row("TS NLL after", "netcal", nll_at(logits, labels, t_nc), ts["nll_after"], "same NLL")
    if pm is not None:
        t_pm = timer.values["probmetrics TS"]["temperature"]
        row("TS temperature", "probmetrics", t_pm, ts["temperature"], "same objective")
        row("TS NLL after", "probmetrics", nll_at(logits, labels, t_pm), ts["nll_after"], "same")
    ours_total = timer.best["curvcal all metrics"] + timer.best["curvcal TS (NLL)"]
    peer_totals = {}
    if tm is not None and pm is not None:
        peer_totals["torchmetrics ECE+MCE + probmetrics TS"] = (
            timer.best["torchmetrics ECE+MCE"] + timer.best["probmetrics TS"]
        )
    if nc is not None:
        peer_totals["netcal ECE+MCE+TS"] = timer.best["netcal ECE+MCE"] + timer.best["netcal TS"]
    seconds = timer.best
    metrics_ratios = {
        name: seconds[name] / seconds["curvcal all metrics"]
        for name in ("torchmetrics ECE+MCE", "netcal ECE+MCE")
        if name in seconds
    }
    if focal:
        metrics_ratios["curvcal focal TS / curvcal TS"] = (
            seconds["curvcal focal TS (defaults)"] / seconds["curvcal TS (NLL)"]
        )
    return {
        "n": n,
        "k": k,
        "curvcal": ours,
        "curvcal_focal": timer.values.get("curvcal focal TS (defaults)"),
        "single_ratios": metrics_ratios,
        "curvcal_right": right,
        "curvcal_ts": ts,
        "agreement": rows,
        "seconds": timer.best,
        "curvcal_total_seconds": ours_total,
        "peer_totals_seconds": peer_totals,
        "ratios": {name: total / ours_total for name, total in peer_totals.items()},
        "peak_rss_mb": peak_rss_mb(),
    }


def conventions(peers: dict[str, Any], recipe_rows: int) -> dict[str, Any]:
    """The documented differences, each on an input small enough to check by hand."""
    out: dict[str, Any] = {}
    tm, nc, pm = (peers.get(name) for name in PEERS)
    # 1. A confidence of exactly 1.0 (references.md golden case; curvcal ECE = 0.200).
    p_one = torch.tensor([[0.9, 0.1, 0.0], [1.0, 0.0, 0.0], [0.0, 0.3, 0.7]], dtype=torch.float64)
    y_one = torch.tensor([0, 1, 2])
    case: dict[str, Any] = {
        "curvcal": expected_calibration_error(p_one, y_one, kind="probs", bins=2),
        "curvcal_right": expected_calibration_error(
            p_one, y_one, kind="probs", bins=2, edges="right"
        ),
    }
    if tm is not None:
        from torchmetrics.functional.classification import multiclass_calibration_error as ce

        case["torchmetrics"] = float(ce(p_one, y_one, 3, n_bins=2, norm="l1"))
    out["confidence_one"] = case
    # 2. Binary problems: netcal switches to the positive-class ECE.
    logits2, labels2 = synthetic_logits(20_000, 2, seed=1)
    m2 = calibration_metrics(logits2, labels2, bins=N_BINS, edges="right")
    case = {"curvcal_top_label": m2.ece, "curvcal_positive_class": m2.positive_class_ece}
    if nc is not None:
        from netcal.metrics import ECE

        case["netcal"] = float(ECE(bins=N_BINS).measure(probabilities(logits2), labels2.numpy()))
    out["binary"] = case
    # 3. Equal-mass bins with ties: the rank cut (5 of 10) falls inside a tie group of 0.6.
    conf = torch.tensor([0.6] * 7 + [0.9] * 3, dtype=torch.float64)
    probs_tied = torch.stack([conf, 1 - conf], dim=1)
    y_tied = torch.tensor([0, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    m3 = calibration_metrics(probs_tied, y_tied, kind="probs", bins=2)
    case = {"curvcal": m3.adaece, "curvcal_bins_used": m3.adaece_bins_used}
    if nc is not None:
        from netcal.metrics import ECE

        case["netcal"] = float(
            ECE(bins=2, equal_intervals=False).measure(probs_tied.numpy(), y_tied.numpy())
        )
    out["equal_mass_ties"] = case
    # 4. The widely copied LBFGS recipe (start T = 1.5, lr 0.01) against the exact optimum.
    logits4, labels4 = synthetic_logits(recipe_rows, 100, seed=0)
    exact = fit_temperature(logits4, labels4)
    case = {"rows": recipe_rows, "curvcal_T": exact.temperature, "curvcal_nll": exact.nll_after}
    if pm is not None:
        recipe = lbfgs_recipe_ts(pm, logits4, labels4)["temperature"]
        case["lbfgs_recipe_T"] = recipe
        case["lbfgs_recipe_nll"] = nll_at(logits4, labels4, recipe)
    out["lbfgs_recipe"] = case
    return out


def markdown(result: dict[str, Any]) -> str:
    """The tables of benchmarks/README.md for one run."""
    lines = []
    for size in result["sizes"]:
        lines.append(
            f"\n### {size['n']:,} × {size['k']:,} (peak RSS {size['peak_rss_mb']:.0f} MB)\n"
        )
        lines.append("| metric | peer | peer value | curvcal | abs diff | convention |")
        lines.append("|---|---|---:|---:|---:|---|")
        for r in size["agreement"]:
            diff = "" if r["abs_diff"] is None else f"{r['abs_diff']:.2e}"
            lines.append(
                f"| {r['metric']} | {r['peer']} | {r['peer_value']:.6f} | {r['curvcal']:.6f} "
                f"| {diff} | {r['convention']} |"
            )
        lines.append("\n| task | seconds (min) |")
        lines.append("|---|---:|")
        for name, seconds in size["seconds"].items():
            lines.append(f"| {name} | {seconds:.2f} |")
        lines.append(f"| **curvcal all metrics + TS** | **{size['curvcal_total_seconds']:.2f}** |")
        for name, seconds in size["peer_totals_seconds"].items():
            ratio = size["ratios"][name]
            lines.append(f"| {name} | {seconds:.2f} ({ratio:.1f}× curvcal) |")
        if size["single_ratios"]:
            lines.append("\n| ratio (same run, minimum of repeats) | value |")
            lines.append("|---|---:|")
            for name, ratio in size["single_ratios"].items():
                label = name if " / " in name else f"{name} / curvcal all metrics"
                lines.append(f"| {label} | {ratio:.2f} |")
        if size["curvcal_focal"]:
            f = size["curvcal_focal"]
            lines.append(
                f"\nfocal TS: γ = {f['gamma']}, T = {f['temperature']:.4f}, "
                f"ECE after {f['ece_after']:.6f}, {f['n_evaluations']} passes over the data "
                f"({f['n_exact_evaluations']} in float64)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats (minimum quoted)")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument(
        "--sizes", metavar="NxK,...", help="override the sizes, e.g. 2000x10,500x50"
    )
    parser.add_argument("--no-peers", action="store_true", help="curvcal only")
    parser.add_argument("--no-focal", action="store_true", help="skip the focal temperature fit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.sizes:
        sizes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.sizes.split(","))
    else:
        sizes = QUICK_SIZES if args.quick else FULL_SIZES
    peers = {} if args.no_peers else {name: load_peer(name) for name in PEERS}
    for name in PEERS:
        if peers.get(name) is None:
            print(f"{name}: not installed (skipped)", file=sys.stderr)
    versions = {
        name: getattr(module, "__version__", "?") for name, module in peers.items() if module
    }
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peers": {name: versions.get(name, "not installed") for name in PEERS},
        "repeats": args.repeats,
        "sizes": [],
    }
    for n, k in sizes:
        print(f"size {n} x {k} ...", file=sys.stderr)
        result["sizes"].append(bench_size(n, k, args.repeats, peers, focal=not args.no_focal))
    recipe_rows = min(RECIPE_ROWS, sizes[0][0])
    result["conventions"] = conventions(peers, recipe_rows)
    result["peak_rss_mb"] = peak_rss_mb()
    print(markdown(result))
    print(json.dumps(result["conventions"], indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
