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

With ``--maps`` a per-map section follows, driven by the registry of calibration maps: for every
map (or those ``--map-names`` names) that applies at a size (``--map-sizes``, default 200,000 ×
100 and 50,000 × 1,000), the fit on the logits and the map applied to them are timed, interleaved
with each installed peer's own implementation of the same map (:data:`PEER_MAPS`), one thread,
minimum over ``--repeats``, with the ratio peer / curvcal in wall seconds and in CPU seconds
(the machine may be shared: a one-thread task's CPU time is what it computed, its wall time
grows with the load) and the peak resident memory each task added above what the process held
before it (sampled every millisecond). The full maps' rows at a fixed strength, against the
peers of the same objective, follow (:data:`FIXED_MAPS`); as the peers stop earlier than
curvcal's solve to a 10⁻⁸ gradient, each peer's final objective is evaluated too, and the CPU
seconds curvcal's solver took to first reach it (from the solver's trace) are reported beside
its whole fit ("to the peer's objective"). ``--json`` and ``--markdown`` are rewritten whole
after every map, so a long run that is stopped keeps what it measured.

    python benchmarks/bench_calibration.py [--quick] [--repeats R] [--json OUT] [--markdown OUT]
    python benchmarks/bench_calibration.py --maps --only-maps --map-sizes 20000x100
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import importlib.util
import io
import json
import math
import os
import resource
import sys
import threading
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
MAP_SIZES = ((200_000, 100), (50_000, 1_000))
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


# ---------------------------------------------------------------------------------------------
# Per-map section: every map of the registry against the peers' own implementations.


def rss_mb() -> float:
    """Resident set size of this process now, in MB (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
    except OSError:
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(task: Callable[[], Any]) -> tuple[float, Any, float]:
    """``(seconds, value, peak MB)`` of one run of ``task``: wall time, its result, and the
    peak resident memory above the level before it (a thread samples it every millisecond)."""
    elapsed, _cpu, value, peak = measure_cpu(task)
    return elapsed, value, peak


def measure_cpu(task: Callable[[], Any]) -> tuple[float, float, Any, float]:
    """``(wall seconds, CPU seconds, value, peak MB)`` of one run of ``task``, as
    :func:`measure`, with the CPU time the process spent on it (``time.process_time``, less the
    memory sampler's own ``thread_time``): on a shared machine the wall time of a one-thread
    task grows with the load, its CPU time much less."""
    gc.collect()
    before = rss_mb()
    peak = [before]
    sampler_cpu = [0.0]
    done = threading.Event()

    def sample() -> None:
        start = time.thread_time()
        while not done.wait(0.001):
            peak[0] = max(peak[0], rss_mb())
        sampler_cpu[0] = time.thread_time() - start

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        value = task()
    finally:
        elapsed = time.perf_counter() - start
        done.set()
        sampler.join()
        cpu = time.process_time() - start_cpu - sampler_cpu[0]
    peak[0] = max(peak[0], rss_mb())
    return elapsed, max(cpu, 0.0), value, peak[0] - before


#: Settings a map runs with in the per-map section where its default is not the definition the
#: peers implement: their histogram binning is equal-width (curvcal's default is equal-mass).
MAP_SETTINGS: dict[str, dict[str, Any]] = {
    "histogram": {"histogram_scheme": "equal-width", "histogram_bins": N_BINS},
    "histogram_ovr": {"histogram_scheme": "equal-width", "histogram_bins": N_BINS},
}


def curvcal_map(stage: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Fit the registry's map ``stage`` with its default settings (or those of
    :data:`MAP_SETTINGS`) and apply it to the same logits: N×K float64 probabilities."""
    import dataclasses

    from curvcal.calibration.inputs import InputNames
    from curvcal.calibration.registry import MAPS
    from curvcal.settings.calibration import CalibrationSettings

    settings = dataclasses.replace(CalibrationSettings(), **MAP_SETTINGS.get(stage, {}))

    def run(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        fit = MAPS[stage].fit(logits, labels, "logits", settings, names=InputNames("logits"))
        return fit.calibrator.probabilities(logits, "logits", "logits")

    return run


#: A peer's fit + apply on (float32 logits, int64 labels, float64 probabilities, NumPy labels),
#: returning N×K probabilities.
PeerMap = Callable[[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray], Any]


def netcal_map(module: str, name: str, **options: Any) -> PeerMap:
    """netcal's ``netcal.<module>.<name>(**options)``: ``fit(probs, labels)`` then
    ``transform(probs)`` (netcal takes probabilities, not logits)."""

    def run(logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray) -> Any:
        cls = getattr(importlib.import_module(f"netcal.{module}"), name)
        model = cls(**options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if module == "scaling":
                model.fit(probs, y, tensorboard=False)
            else:
                model.fit(probs, y)
            return np.asarray(model.transform(probs))

    return run


def probmetrics_calibrator(module: str, name: str) -> Any:
    """``probmetrics.calibrators.<module>.<name>``, loaded as
    :func:`probmetrics_temperature_module` loads its module (the package ``__init__`` needs
    numba)."""
    probmetrics_temperature_module()  # registers the package without its __init__ if need be
    return getattr(importlib.import_module(f"probmetrics.calibrators.{module}"), name)


def probmetrics_map(module: str, name: str, parameters: bool = False, **options: Any) -> PeerMap:
    """probmetrics' calibrator ``name(**options)``: ``fit_torch`` on the logits,
    ``predict_proba_torch`` (``parameters``, for ``MatrixScalingCalibrator``, whose scores are
    z · itemp + bias: a :class:`FullMapFit` with W = itempᵀ and b)."""

    def run(logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray) -> Any:
        from probmetrics.distributions import CategoricalLogits

        model = probmetrics_calibrator(module, name)(**options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit_torch(CategoricalLogits(logits), labels)
            probs = model.predict_proba_torch(CategoricalLogits(logits)).get_probs()
        if not parameters:
            return probs
        return FullMapFit(
            probs,
            model.itemp_.detach().to(torch.float64).T.contiguous(),
            model.bias_.detach().to(torch.float64),
        )

    return run


def top_label_pairs(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(confidence max_k p_k, 1[argmax = y]) of N×K probabilities."""
    return probs.max(axis=1), (probs.argmax(axis=1) == y).astype(np.float64)


def sklearn_top_label_isotonic(
    logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """scikit-learn's ``IsotonicRegression`` on the top-label confidence against correctness
    (fitted and applied; returns the calibrated confidences, N values)."""
    from sklearn.isotonic import IsotonicRegression

    confidence, correct = top_label_pairs(probs, y)
    model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    return model.fit(confidence, correct).predict(confidence)


def netcal_top_label_histogram(
    logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """netcal's binary ``HistogramBinning`` (equal-width, :data:`N_BINS`) on the top-label
    confidence against correctness (fitted and applied; the calibrated confidences)."""
    from netcal.binning import HistogramBinning

    confidence, correct = top_label_pairs(probs, y)
    model = HistogramBinning(bins=N_BINS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(confidence, correct)
        return np.asarray(model.transform(confidence))


def netcal_top_label_bbq(
    logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """netcal's binary ``BBQ`` (its defaults: equal-width binnings, BIC, the elbow rule) on the
    top-label confidence against correctness (fitted and applied; the calibrated
    confidences)."""
    from netcal.binning import BBQ

    confidence, correct = top_label_pairs(probs, y)
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),  # its progress bar
    ):
        warnings.simplefilter("ignore")
        model = BBQ().fit(confidence, correct)
        return np.asarray(model.transform(confidence))


def torch_uncertainty_bbq(logit: torch.Tensor, correct: torch.Tensor) -> np.ndarray:
    """torch-uncertainty's ``BBQScaler`` (its defaults: bin counts 2..15) fitted on one float32
    logit per sample against its 0/1 target (its binary case; its quantiles need float32) and
    applied to the same logits: the calibrated probabilities."""
    import logging

    from torch.utils.data import DataLoader, TensorDataset
    from torch_uncertainty.post_processing import BBQScaler

    model = BBQScaler(model=None)
    loader = DataLoader(TensorDataset(logit, correct), batch_size=len(logit))
    logging.disable(logging.WARNING)  # "model is None" on every fit
    try:
        model.fit(loader, progress=False)
    finally:
        logging.disable(logging.NOTSET)
    with torch.no_grad():
        return torch.sigmoid(model(logit)).to(torch.float64).numpy()


def torch_uncertainty_top_label_bbq(
    logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """:func:`torch_uncertainty_bbq` on the top-label confidence (as a logit) against
    correctness: the calibrated confidences."""
    confidence, correct = top_label_pairs(probs, y)
    x = torch.logit(torch.from_numpy(confidence)).to(torch.float32)
    return torch_uncertainty_bbq(x, torch.from_numpy(correct))


@dataclass(frozen=True)
class FullMapFit:
    """A peer's fitted full map: its N×K ``probabilities`` and its parameters, W (K×K, with
    s = W x + b) and b (K), as float64 tensors, so that its objective can be evaluated
    (:func:`full_map_objective`)."""

    probabilities: Any
    weights: torch.Tensor
    bias: torch.Tensor


def torch_uncertainty_map(
    name: str, classes: bool = False, parameters: bool = False, **options: Any
) -> PeerMap:
    """torch-uncertainty's ``torch_uncertainty.post_processing.<name>(**options)`` without a
    model (``classes``: with ``num_classes`` K, which its vector, matrix and Dirichlet scalers
    need): ``fit`` on one batch of (logits, labels), then ``forward`` on the logits, whose
    output (log-probabilities or scaled logits) is softmaxed to N×K probabilities
    (``parameters``: a :class:`FullMapFit` with its W and b too, for its matrix and Dirichlet
    scalers)."""

    def run(logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray, y: np.ndarray) -> Any:
        import logging

        from torch.utils.data import DataLoader, TensorDataset

        cls = getattr(importlib.import_module("torch_uncertainty.post_processing"), name)
        extra = {"num_classes": logits.shape[1]} if classes else {}
        model = cls(model=None, **options, **extra)
        loader = DataLoader(TensorDataset(logits, labels), batch_size=len(labels))
        logging.disable(logging.WARNING)  # "model is None" on every fit
        try:
            model.fit(loader, progress=False)
        finally:
            logging.disable(logging.NOTSET)
        with torch.no_grad():
            probs = torch.softmax(model(logits).to(torch.float64), dim=1)
        if not parameters:
            return probs
        return FullMapFit(
            probs,
            model.inv_temperature_weight.detach().to(torch.float64),
            model.inv_temperature_bias.detach().to(torch.float64),
        )

    return run


#: Registry method name -> (peer label, library, fit + apply) for each peer's own implementation
#: of the same map. Keys of maps the registry lacks are skipped; a peer not installed is skipped.
PEER_MAPS: dict[str, tuple[tuple[str, str, PeerMap], ...]] = {
    "ts": (
        ("netcal TemperatureScaling", "netcal", netcal_map("scaling", "TemperatureScaling")),
        (
            "probmetrics TemperatureScaling",
            "probmetrics",
            probmetrics_map("temperature_scaling", "TemperatureScalingCalibrator"),
        ),
        (
            "torch-uncertainty TemperatureScaler",
            "torch_uncertainty",
            torch_uncertainty_map("TemperatureScaler"),
        ),
    ),
    "vector": (
        (
            "probmetrics VectorScaling",
            "probmetrics",
            probmetrics_map("logistic", "VectorScalingCalibrator"),
        ),
    ),
    "matrix": (
        (
            "probmetrics MatrixScaling",
            "probmetrics",
            probmetrics_map("logistic", "MatrixScalingCalibrator"),
        ),
    ),
    "histogram": (("netcal HistogramBinning (top-label)", "netcal", netcal_top_label_histogram),),
    "histogram_ovr": (
        (
            "netcal HistogramBinning",
            "netcal",
            netcal_map("binning", "HistogramBinning", bins=N_BINS),
        ),
        (
            "torch-uncertainty HistogramBinningScaler",
            "torch_uncertainty",
            torch_uncertainty_map("HistogramBinningScaler", num_bins=N_BINS),
        ),
    ),
    "isotonic": (
        ("scikit-learn IsotonicRegression (top-label)", "sklearn", sklearn_top_label_isotonic),
    ),
    "isotonic_ovr": (
        ("netcal IsotonicRegression", "netcal", netcal_map("binning", "IsotonicRegression")),
        (
            "torch-uncertainty IsotonicRegressionScaler (scikit-learn per class)",
            "torch_uncertainty",
            torch_uncertainty_map("IsotonicRegressionScaler"),
        ),
    ),
    "platt": (
        ("netcal LogisticCalibration", "netcal", netcal_map("scaling", "LogisticCalibration")),
    ),
    "beta": (("netcal BetaCalibration", "netcal", netcal_map("scaling", "BetaCalibration")),),
    "dirichlet": (
        (
            "probmetrics DirichletCalibrator",
            "probmetrics",
            probmetrics_map("logistic", "DirichletCalibrator"),
        ),
    ),
    "bbq": (
        ("netcal BBQ (top-label)", "netcal", netcal_top_label_bbq),
        (
            "torch-uncertainty BBQScaler (top-label)",
            "torch_uncertainty",
            torch_uncertainty_top_label_bbq,
        ),
    ),
    "ets": (
        (
            "probmetrics ETSCalibrator (NLL)",
            "probmetrics",
            probmetrics_map("temperature_scaling", "ETSCalibrator", loss="ce"),
        ),
    ),
    "venn_abers": (
        (
            "probmetrics VennAbersCalibrator (venn-abers, one-vs-all)",
            "probmetrics",
            probmetrics_map("nonparametric", "VennAbersCalibrator"),
        ),
    ),
}
#: The libraries the peer maps come from.
MAP_PEERS = ("netcal", "probmetrics", "sklearn", "torch_uncertainty")

#: The ODIR strength of the fixed-strength Dirichlet row (λ = μ; curvcal's CV grid point 1e-2).
FIXED_STRENGTH = 1e-2


#: A solver's path: (CPU seconds of the fitting thread since the fit began, objective) at
#: every point where it evaluated its objective.
Path = list[tuple[float, float]]


class FitStopped(Exception):
    """Raised from a traced fit's trace once it has run past its CPU-second cap."""


def curvcal_fixed(
    method: str, strength: float
) -> Callable[[torch.Tensor, torch.Tensor, Path | None, float | None], torch.Tensor | None]:
    """curvcal's ``method`` (matrix or dirichlet) at the fixed ODIR strength λ_od = λ_b =
    ``strength`` (:func:`~curvcal.calibration.linear.fit_linear`, no cross-validation), applied
    to the same logits: N×K float64 probabilities. When given a list ``path``, the fit's trace
    appends (``time.thread_time()`` since the call began, objective) to it at every objective
    the solver evaluates (the fit runs in this thread, one thread: its CPU time). With ``cap``
    (CPU seconds) the fit is stopped at the first evaluation past it and ``None`` is returned:
    the path up to there still times curvcal to a peer's objective, where the fit to curvcal's
    own convergence test would take far longer (a fit that nearly interpolates)."""
    from curvcal.calibration.linear import fit_linear

    def run(
        logits: torch.Tensor,
        labels: torch.Tensor,
        path: Path | None = None,
        cap: float | None = None,
    ) -> torch.Tensor | None:
        began = time.thread_time()
        trace = None
        if path is not None:

            def trace(objective: float, _point: Callable[[], torch.Tensor]) -> None:
                spent = time.thread_time() - began
                path.append((spent, objective))
                if cap is not None and spent > cap:
                    raise FitStopped

        try:
            fit = fit_linear(
                logits, labels, method, l2_off_diagonal=strength, l2_bias=strength, trace=trace
            )
        except FitStopped:
            return None
        return fit.calibrator.probabilities(logits, "logits", "logits")

    return run


def full_map_objective(
    method: str,
    strength: float,
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor,
) -> float:
    """The objective of the fixed rows in float64 on the fit rows, for any map (W, b): mean
    NLL of softmax(W x + b) (x = z for ``matrix``, log_softmax z for ``dirichlet``) +
    λ Σ_{i≠j} W_ij² / (K(K−1)) + λ Σ_j b_j² / K with λ = ``strength`` (curvcal's ODIR;
    torch-uncertainty's ``DirichletScaler`` loss term for term)."""
    z = logits.to(torch.float64)
    x = torch.log_softmax(z, dim=1) if method == "dirichlet" else z
    k = x.shape[1]
    total = 0.0
    for start in range(0, x.shape[0], 4096):
        logq = torch.log_softmax(x[start : start + 4096] @ weights.T + bias, dim=1)
        chunk = labels[start : start + 4096]
        total -= float(logq[torch.arange(chunk.shape[0]), chunk].sum())
    off_diagonal = float((weights**2).sum() - (weights.diagonal() ** 2).sum())
    penalty = strength * off_diagonal / max(k * (k - 1), 1) + strength * float((bias**2).sum()) / k
    return total / x.shape[0] + penalty


def seconds_to_objective(paths: list[Path], target: float) -> float | None:
    """The least CPU seconds, over the repeats' ``paths``, at which a path first reached an
    objective ≤ ``target`` (``None``: none did)."""
    reached = [next((t for t, value in path if value <= target), None) for path in paths]
    times = [t for t in reached if t is not None]
    return min(times) if times else None


#: Rows outside the registry: curvcal's full maps at the strength a peer fixes (the registry's
#: ``matrix`` and ``dirichlet`` rows choose theirs by cross-validation, which no peer does, so
#: they are timed as rows of their own). Name -> (registry map whose ``skip_reason`` applies,
#: curvcal's task label, curvcal's fit + apply, the peers of the same objective).
#:
#: - ``matrix_unregularised``: s = W z + b by mean NLL alone (λ = 0), the definition of
#:   probmetrics' ``MatrixScalingCalibrator`` and torch-uncertainty's ``MatrixScaler``;
#: - ``dirichlet_fixed``: s = W log p + b by mean NLL + λ Σ_{i≠j} W_ij² / (K(K−1)) + μ Σ_j
#:   b_j² / K, which is torch-uncertainty's ``DirichletScaler(lambda_reg=λ, mu_reg=μ)``
#:   (``CrossEntropyLoss`` is the mean over the N rows; it divides the off-diagonal sum by
#:   K(K−1) and takes the mean of b², as curvcal's ODIR does), here λ = μ =
#:   :data:`FIXED_STRENGTH`.
#:
#: torch-uncertainty's ``VectorScaler`` is w ⊙ z without the bias curvcal's (and probmetrics')
#: vector scaling has: another map, not a row.
FIXED_MAPS: dict[
    str,
    tuple[
        str,
        str,
        Callable[[torch.Tensor, torch.Tensor, Path | None, float | None], torch.Tensor | None],
        tuple[Any, ...],
    ],
] = {
    "matrix_unregularised": (
        "matrix",
        "curvcal matrix λ = 0",
        curvcal_fixed("matrix", 0.0),
        (
            (
                "probmetrics MatrixScaling",
                "probmetrics",
                probmetrics_map("logistic", "MatrixScalingCalibrator", parameters=True),
            ),
            (
                "torch-uncertainty MatrixScaler",
                "torch_uncertainty",
                torch_uncertainty_map("MatrixScaler", classes=True, parameters=True),
            ),
        ),
    ),
    "dirichlet_fixed": (
        "dirichlet",
        f"curvcal Dirichlet ODIR λ = μ = {FIXED_STRENGTH:g}",
        curvcal_fixed("dirichlet", FIXED_STRENGTH),
        (
            (
                f"torch-uncertainty DirichletScaler λ = μ = {FIXED_STRENGTH:g}",
                "torch_uncertainty",
                torch_uncertainty_map(
                    "DirichletScaler",
                    classes=True,
                    parameters=True,
                    lambda_reg=FIXED_STRENGTH,
                    mu_reg=FIXED_STRENGTH,
                ),
            ),
        ),
    ),
}


#: The objective of each fixed row (method, λ), on which the peers' final objectives are
#: evaluated and curvcal's path is timed to reach them (:func:`full_map_objective`).
FIXED_OBJECTIVES: dict[str, tuple[str, float]] = {
    "matrix_unregularised": ("matrix", 0.0),
    "dirichlet_fixed": ("dirichlet", FIXED_STRENGTH),
}

#: Maps whose peers calibrate the top-label confidence alone (they return N values).
TOP_LABEL_MAPS = ("histogram", "isotonic", "bbq")


def _max_difference(ours: torch.Tensor, theirs: Any, top_label: bool = False) -> float | None:
    """max |p_curvcal - p_peer| over all entries when both are N×K probabilities; a peer that
    returns N values is compared with curvcal's top-class probability (``top_label``) or, for
    K = 2, with its probability of class 1 (netcal's binary output)."""
    peer = torch.as_tensor(np.asarray(theirs) if not torch.is_tensor(theirs) else theirs)
    if peer.ndim == 1 and peer.shape[0] == ours.shape[0]:
        if top_label:
            ours = ours.max(dim=1).values
        elif ours.shape[1] == 2:
            ours = ours[:, 1]
    if peer.shape != ours.shape:
        return None
    return float((ours - peer.to(torch.float64)).abs().max())


def bench_maps(
    n: int,
    k: int,
    repeats: int,
    libraries: dict[str, Any],
    names: tuple[str, ...] | None = None,
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    fixed_cap: float | None = None,
) -> dict[str, Any]:
    """Fit + apply of every registry map that applies at N × K, then the fixed-strength rows
    of :data:`FIXED_MAPS` (``names``: only those), each interleaved with its peers
    (``libraries``: the installed ones by name; others skipped). ``progress`` is called with
    the size's result so far after every map (so a long run that is stopped keeps its rows).
    ``fixed_cap``: stop curvcal's fixed-row fits after that many CPU seconds (the row says
    ``stopped_at_cap``; its whole-fit ratios are then left out, the to-objective ones kept)."""
    from curvcal.calibration.registry import MAPS

    logits, labels = synthetic_logits(n, k, seed)
    probs, y = probabilities(logits), labels.numpy()
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    result = {"n": n, "k": k, "rows": rows, "skipped": skipped, "peak_rss_mb": peak_rss_mb()}
    stages: list[tuple[str, str, Callable[[], Any], tuple[Any, ...], str | None]] = []
    for stage, kind in MAPS.items():
        registry_task = functools.partial(lambda s: curvcal_map(s)(logits, labels), stage)
        stages.append(
            (stage, f"curvcal {kind.title}", registry_task, PEER_MAPS.get(stage, ()), stage)
        )
    paths: dict[str, list[Path]] = {stage: [] for stage in FIXED_MAPS}

    def traced(fit: Callable[..., torch.Tensor], stage: str) -> torch.Tensor:
        paths[stage].append([])
        return fit(logits, labels, paths[stage][-1], fixed_cap)

    for stage, (like, label, fit, peers) in FIXED_MAPS.items():
        fixed_task = functools.partial(traced, fit, stage)
        stages.append((stage, label, fixed_task, peers, like if like in MAPS else None))
    for stage, ours_label, ours_task, peers, like in stages:
        if names is not None and stage not in names:
            continue
        reason = None if like is None else MAPS[like].skip_reason(k, False)
        if reason is not None:
            skipped[stage] = reason
            continue
        tasks: list[tuple[str, str | None, Callable[[], Any]]] = [(ours_label, None, ours_task)]
        for label, library, peer in peers:
            if libraries.get(library) is None:
                continue
            tasks.append((label, library, lambda p=peer: p(logits, labels, probs, y)))
        seconds: dict[str, float] = {}
        cpu_seconds: dict[str, float] = {}
        memory: dict[str, float] = {}
        values: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for _ in range(repeats):
            for label, _library, task in tasks:
                if label in failed:
                    continue
                try:
                    elapsed, cpu, values[label], peak = measure_cpu(task)
                except Exception as error:  # a peer that cannot run this size is reported
                    failed[label] = f"{type(error).__name__}: {error}"[:200]
                    continue
                print(
                    f"  {label}: {elapsed:.3f} s ({cpu:.3f} CPU s), +{peak:.0f} MB", file=sys.stderr
                )
                seconds[label] = min(seconds.get(label, math.inf), elapsed)
                cpu_seconds[label] = min(cpu_seconds.get(label, math.inf), cpu)
                memory[label] = max(memory.get(label, 0.0), peak)
        ours = values.get(ours_label)
        stopped = stage in FIXED_MAPS and ours_label in seconds and ours is None
        objectives: dict[str, float] = {}
        if stage in FIXED_OBJECTIVES and ours_label in seconds:
            method, strength = FIXED_OBJECTIVES[stage]
            objectives[ours_label] = paths[stage][-1][-1][1]  # the last point is the fitted map
            for label, value in values.items():
                if isinstance(value, FullMapFit):
                    objectives[label] = full_map_objective(
                        method, strength, logits, labels, value.weights, value.bias
                    )
                    values[label] = value.probabilities
        for label, library, _task in tasks:
            row: dict[str, Any] = {
                "map": stage,
                "task": label,
                "library": library or "curvcal",
                "seconds": seconds.get(label),
                "cpu_seconds": cpu_seconds.get(label),
                "peak_mb": memory.get(label),
                "ratio_to_curvcal": None,
                "cpu_ratio_to_curvcal": None,
                "max_abs_diff_probs": None,
                "error": failed.get(label),
                "objective": objectives.get(label),
                "curvcal_cpu_seconds_to_objective": None,
                "cpu_ratio_at_objective": None,
                "stopped_at_cap": stopped if library is None else None,
            }
            if library is not None and label in objectives:
                to_objective = seconds_to_objective(paths[stage], objectives[label])
                row["curvcal_cpu_seconds_to_objective"] = to_objective
                if to_objective and label in cpu_seconds:
                    row["cpu_ratio_at_objective"] = cpu_seconds[label] / to_objective
            if library is not None and label in seconds and ours_label in seconds and not stopped:
                row["ratio_to_curvcal"] = seconds[label] / seconds[ours_label]
                if cpu_seconds[ours_label] > 0:
                    row["cpu_ratio_to_curvcal"] = cpu_seconds[label] / cpu_seconds[ours_label]
                if ours is not None:
                    row["max_abs_diff_probs"] = _max_difference(
                        ours, values[label], stage in TOP_LABEL_MAPS
                    )
            rows.append(row)
        values.clear()
        gc.collect()
        result["peak_rss_mb"] = peak_rss_mb()
        if progress is not None:
            progress(result)
    return result


def maps_markdown(sizes: list[dict[str, Any]]) -> str:
    """The per-map tables: seconds (minimum of repeats), peer / curvcal, peak memory."""
    lines = []
    for size in sizes:
        lines.append(f"\n### maps at {size['n']:,} × {size['k']:,} (fit + apply)\n")
        lines.append(
            "| map | task | seconds (min) | CPU seconds (min) | peer / curvcal | "
            "peer / curvcal (CPU) | peak MB | max abs diff p |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|")

        def number(value: float | None, form: str) -> str:
            return "" if value is None else format(value, form)

        for r in size["rows"]:
            ratio = number(r["ratio_to_curvcal"], ".2f")
            cpu_ratio = number(r.get("cpu_ratio_to_curvcal"), ".2f")
            diff = number(r["max_abs_diff_probs"], ".1e")
            secs = r["error"] if r["seconds"] is None else f"{r['seconds']:.3f}"
            if r.get("stopped_at_cap"):
                secs += " (stopped at --fixed-cap, not converged)"
            cpu = number(r.get("cpu_seconds"), ".3f")
            peak = number(r["peak_mb"], ".0f")
            lines.append(
                f"| {r['map']} | {r['task']} | {secs} | {cpu} | {ratio} | {cpu_ratio} | {peak} "
                f"| {diff} |"
            )
        at_objective = [r for r in size["rows"] if r.get("objective") is not None]
        if at_objective:
            lines.append(
                "\nTo the peer's objective (fixed rows: the objective evaluated in float64 on the "
                "fit rows for each final map; curvcal's CPU seconds until its solver first "
                "reached the peer's objective, fit only, minimum of repeats):\n"
            )
            lines.append(
                "| map | task | objective | CPU seconds (min) | curvcal CPU s to peer's "
                "objective | peer / curvcal (CPU) at peer's objective |"
            )
            lines.append("|---|---|---:|---:|---:|---:|")
            for r in at_objective:
                to_objective = number(r["curvcal_cpu_seconds_to_objective"], ".3f")
                if r["library"] != "curvcal" and not to_objective:
                    to_objective = "not reached"
                lines.append(
                    f"| {r['map']} | {r['task']} | {r['objective']:.10f} "
                    f"| {number(r.get('cpu_seconds'), '.3f')} | {to_objective} "
                    f"| {number(r['cpu_ratio_at_objective'], '.2f')} |"
                )
        for stage, reason in size["skipped"].items():
            lines.append(f"\n{stage}: skipped ({reason})")
    return "\n".join(lines)


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


def _version(module: str) -> str:
    """An installed library's version (probmetrics has no ``__version__``)."""
    from importlib import metadata

    names = {"sklearn": "scikit-learn", "torch_uncertainty": "torch-uncertainty"}
    try:
        return metadata.version(names.get(module, module))
    except metadata.PackageNotFoundError:
        return "?"


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    """``"2000x10,500x50"`` as ((2000, 10), (500, 50))."""
    return tuple((int(n), int(k)) for n, k in (s.lower().split("x") for s in text.split(",")))


def _one_blas_thread() -> None:
    """One thread for NumPy's BLAS and OpenMP too (the peers compute with NumPy)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1)


def report_markdown(result: dict[str, Any]) -> str:
    """Every table of a run so far (the sizes' tables and conventions, then the maps')."""
    parts = []
    if result["sizes"]:
        parts.append(markdown(result))
        if "conventions" in result:
            parts.append(json.dumps(result["conventions"], indent=2))
    if "maps" in result:
        parts.append(maps_markdown(result["maps"]))
    return "\n".join(parts)


def write_outputs(result: dict[str, Any], json_path: str | None, markdown_path: str | None) -> None:
    """(Re)write the whole JSON and markdown of the run so far, each through a temporary file
    renamed over the old one (a run stopped while writing leaves the previous whole file)."""
    for path, text in (
        (json_path, lambda: json.dumps(result, indent=2)),
        (markdown_path, lambda: report_markdown(result) + "\n"),
    ):
        if path is None:
            continue
        partial = f"{path}.partial"
        with open(partial, "w") as handle:
            handle.write(text())
        os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats (minimum quoted)")
    parser.add_argument(
        "--json", metavar="OUT", help="write the results as JSON to OUT (after every map too)"
    )
    parser.add_argument(
        "--markdown", metavar="OUT", help="write the tables to OUT (after every map too)"
    )
    parser.add_argument(
        "--sizes", metavar="NxK,...", help="override the sizes, e.g. 2000x10,500x50"
    )
    parser.add_argument("--no-peers", action="store_true", help="curvcal only")
    parser.add_argument("--no-focal", action="store_true", help="skip the focal temperature fit")
    parser.add_argument(
        "--maps", action="store_true", help="add the per-map section (fit + apply, peers' maps)"
    )
    parser.add_argument(
        "--only-maps", action="store_true", help="the per-map section alone (implies --maps)"
    )
    parser.add_argument(
        "--map-sizes",
        metavar="NxK,...",
        help="sizes of the per-map section (default 200000x100,50000x1000)",
    )
    parser.add_argument(
        "--fixed-cap",
        type=float,
        metavar="SECONDS",
        help="stop curvcal's fixed-strength fits after SECONDS CPU seconds (timed to the peers' "
        "objectives only; for fits that nearly interpolate)",
    )
    parser.add_argument(
        "--map-names", metavar="NAME,...", help="only these registry maps (e.g. ts,focal_ts)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    _one_blas_thread()
    sizes = _sizes(args.sizes) if args.sizes else QUICK_SIZES if args.quick else FULL_SIZES
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
    if not args.only_maps:
        for n, k in sizes:
            print(f"size {n} x {k} ...", file=sys.stderr)
            result["sizes"].append(bench_size(n, k, args.repeats, peers, focal=not args.no_focal))
            write_outputs(result, args.json, args.markdown)
        recipe_rows = min(RECIPE_ROWS, sizes[0][0])
        result["conventions"] = conventions(peers, recipe_rows)
    if args.maps or args.only_maps:
        libraries = {} if args.no_peers else {name: load_peer(name) for name in MAP_PEERS}
        result["map_peers"] = {
            name: _version(name) if libraries.get(name) else "not installed" for name in MAP_PEERS
        }
        map_sizes = _sizes(args.map_sizes) if args.map_sizes else MAP_SIZES
        names = tuple(args.map_names.split(",")) if args.map_names else None
        result["maps"] = []
        done = len(result["maps"])

        def progress(size: dict[str, Any]) -> None:
            result["maps"][done:] = [size]
            result["peak_rss_mb"] = peak_rss_mb()
            write_outputs(result, args.json, args.markdown)

        for n, k in map_sizes:
            print(f"maps at {n} x {k} ...", file=sys.stderr)
            done = len(result["maps"])
            result["maps"][done:] = [
                bench_maps(
                    n,
                    k,
                    args.repeats,
                    libraries,
                    names,
                    progress=progress,
                    fixed_cap=args.fixed_cap,
                )
            ]
    result["peak_rss_mb"] = peak_rss_mb()
    print(report_markdown(result))
    write_outputs(result, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
