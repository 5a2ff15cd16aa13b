"""Vector, matrix and Dirichlet scaling: one fit of curvcal against each peer's one fit, and the
cost of curvcal's cross-validated strength choice as a multiple of one fit.

On the synthetic over-confident logits of ``bench_calibration.py`` (float32, fixed seed), one
thread, tasks interleaved, minimum over ``--repeats`` of the CPU seconds (``--memory``: wall
seconds and the peak resident memory each task added, sampled every millisecond):

- ``vector``: curvcal's unregularised fit against probmetrics ``VectorScalingCalibrator``
  (torchmin BFGS, float32), torch-uncertainty ``VectorScaler`` (torch LBFGS, ``max_iter`` 200)
  and netcal ``LogisticCalibration`` (vector scaling of log p, SciPy);
- ``matrix``: curvcal unregularised (λ = 0) and at ODIR λ = 0.01 against probmetrics
  ``MatrixScalingCalibrator`` (BFGS, L-BFGS above 1000 parameters) and torch-uncertainty
  ``MatrixScaler`` (both unregularised);
- ``dirichlet`` (ODIR λ = 0.01): against torch-uncertainty ``DirichletScaler(lambda_reg=λ,
  mu_reg=λ)``, whose objective is the same (mean NLL + λ Σ_{i≠j} W_ij²/(K(K−1)) + λ Σ b²/K);
- ``dirichlet_unregularised`` (λ = 0): against probmetrics ``MatrixScalingCalibrator`` handed
  log p (its map z·itemp + bias, unregularised, is then Dirichlet calibration: the same
  objective) and torch-uncertainty ``DirichletScaler()`` (no regulariser);
- ``dirichlet_l2`` (λ = 0.01): no installed peer (probmetrics' ``DirichletCalibrator`` needs
  the ``dirichletcal`` package);
- ``cv``: :func:`~curvcal.calibration.linear.fit_matrix_odir` (7 strengths × 5 folds + the
  final fit) for matrix, dirichlet and dirichlet_l2. No installed peer chooses a strength.

Every row gives the objective its fit reached on the fit split (mean NLL + the regulariser of
its own definition), so a fast peer that stops early is seen as such, and the peak resident
memory the task added. Where a peer minimises the same objective as a curvcal row of its
group (``dirichlet``, ``dirichlet_unregularised``, ``matrix`` λ = 0), the row also gives the
CPU seconds curvcal's solver took to first reach the peer's final objective (from the
solver's trace in the timed run; ``to_peer_objective``). ``--cap SECONDS`` stops curvcal's
traced fits at that CPU time (the row then says ``capped``; the time to a peer's objective is
still read from the path). ``--quick`` runs every group at a tiny size in seconds.

    python benchmarks/bench_linear_maps.py --sizes 20000x100,5000x1000 --repeats 2
    python benchmarks/bench_linear_maps.py --quick
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibration import (
    _one_blas_thread,
    load_peer,
    measure,
    probmetrics_calibrator,
    synthetic_logits,
)

from curvcal.calibration.linear import (
    fit_linear,
    fit_matrix_odir,
    penalty_weights,
)

STRENGTH = 1e-2
TASKS = ("vector", "matrix", "dirichlet", "dirichlet_unregularised", "dirichlet_l2", "cv")
QUICK_SIZES = "300x4"
#: The curvcal task of a group whose objective its peers minimise too (time to their objective).
SAME_OBJECTIVE = {
    "matrix": "curvcal matrix λ=0",
    "dirichlet": f"curvcal dirichlet ODIR λ={STRENGTH:g}",
    "dirichlet_unregularised": "curvcal dirichlet λ=0",
}
#: The (CPU seconds, objective) path of curvcal's last traced fit of each task, and whether
#: the cap stopped it.
PATHS: dict[str, list[tuple[float, float]]] = {}
CAPPED: set[str] = set()
CAP = [math.inf]


class _Capped(Exception):
    """Raised in the trace to stop a fit at the CPU cap."""


#: A task: (label, library, group, fit) where fit returns (weights W or w, bias b, x the map
#: multiplies, the regulariser's weights or None).
Fit = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, str, Any]]


def objective(
    logits: torch.Tensor, labels: torch.Tensor, w: Any, b: Any, scale: str, penalty: Any
) -> float:
    """Mean NLL of softmax(W x + b) (or w ⊙ x + b) in float64, plus Σ penalty ⊙ [W, b]²."""
    z = logits.double()
    x = torch.log_softmax(z, 1) if scale == "logp" else z
    w = torch.as_tensor(w).double().detach()
    b = torch.as_tensor(b).double().detach()
    s = x * w + b if w.ndim == 1 else x @ w.T + b
    nll = -float(torch.log_softmax(s, 1)[torch.arange(len(labels)), labels].mean())
    if penalty is not None:
        nll += float((penalty * torch.cat([w, b[:, None]], 1) ** 2).sum())
    return nll


def curvcal_fit(method: str, strength: float, regulariser: str = "odir", label: str = "") -> Fit:
    """curvcal's fit; the full maps' traced (the path kept in :data:`PATHS` under ``label``,
    stopped at the CPU cap: the last map seen is then the result)."""

    def run(logits: torch.Tensor, labels: torch.Tensor) -> Any:
        k = logits.shape[1]
        penalty = (
            None if method == "vector" else penalty_weights(regulariser, k, strength, strength)
        )
        if method == "vector":
            fit = fit_linear(logits, labels, method)
            m = fit.calibrator
            return torch.tensor(m.weights), torch.tensor(m.bias), _scale(method), penalty
        path: list[tuple[float, float]] = []
        last: list[torch.Tensor] = []
        start = time.process_time()

        def trace(value: float, current: Callable[[], torch.Tensor]) -> None:
            seconds = time.process_time() - start
            path.append((seconds, value))
            if seconds > CAP[0]:
                last.append(current())
                raise _Capped

        PATHS[label] = path
        CAPPED.discard(label)
        try:
            fit = fit_linear(
                logits,
                labels,
                method,
                l2_off_diagonal=strength,
                l2_bias=strength,
                regulariser=regulariser,
                trace=trace,
            )
        except _Capped:
            CAPPED.add(label)
            v = last[-1]
            return v[:, :k], v[:, k], _scale(method), penalty
        m = fit.calibrator
        return torch.tensor(m.weights), torch.tensor(m.bias), _scale(method), penalty

    return run


def first_reached(path: list[tuple[float, float]], target: float) -> float | None:
    """The CPU seconds at which the ``path`` of (seconds, objective) first reached
    ``target`` (None: never)."""
    for seconds, value in path:
        if value <= target:
            return seconds
    return None


def curvcal_cv(method: str, regulariser: str = "odir") -> Fit:
    def run(logits: torch.Tensor, labels: torch.Tensor) -> Any:
        fit = fit_matrix_odir(logits, labels, method=method, regulariser=regulariser)
        m = fit.calibrator
        k = m.n_classes
        penalty = penalty_weights(regulariser, k, fit.l2_off_diagonal, fit.l2_bias)
        return torch.tensor(m.weights), torch.tensor(m.bias), _scale(method), penalty

    return run


def _scale(method: str) -> str:
    return "logp" if method == "dirichlet" else "logits"


def probmetrics_fit(name: str, log_probabilities: bool = False) -> Fit:
    """probmetrics' ``name`` fitted on the logits, or (``log_probabilities``) on log p, the
    float32 log_softmax of the logits, which makes its unregularised matrix scaling Dirichlet
    calibration (its log_softmax is part of the timed task)."""

    def run(logits: torch.Tensor, labels: torch.Tensor) -> Any:
        from probmetrics.distributions import CategoricalLogits

        scores = torch.log_softmax(logits, 1) if log_probabilities else logits
        model = probmetrics_calibrator("logistic", name)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit_torch(CategoricalLogits(scores), labels)
        scale = "logp" if log_probabilities else "logits"
        if name == "VectorScalingCalibrator":
            return 1.0 / model.temp_, model.bias_, scale, None
        return model.itemp_.T, model.bias_, scale, None

    return run


def torch_uncertainty_fit(name: str, strength: float | None = None) -> Fit:
    def run(logits: torch.Tensor, labels: torch.Tensor) -> Any:
        import logging

        calibration = importlib.import_module("torch_uncertainty.post_processing.calibration")
        k = logits.shape[1]
        options: dict[str, Any] = {}
        if strength is not None:
            options = {"lambda_reg": strength, "mu_reg": strength}
        scaler = getattr(calibration, name)(num_classes=k, **options)
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(logits, labels), batch_size=len(labels)
        )
        logging.disable(logging.WARNING)
        try:
            scaler.fit(loader, progress=False)
        finally:
            logging.disable(logging.NOTSET)
        if name == "VectorScaler":
            return scaler.inv_temp, torch.zeros(k), "logits", None  # no bias in its map
        penalty = None
        if strength is not None:
            penalty = penalty_weights("odir", k, strength, strength)
        scale = "logp" if name == "DirichletScaler" else "logits"
        return scaler.inv_temperature_weight, scaler.inv_temperature_bias, scale, penalty

    return run


def netcal_vector(logits: torch.Tensor, labels: torch.Tensor) -> Any:
    from netcal.scaling import LogisticCalibration

    probs = torch.softmax(logits.double(), 1).numpy()
    model = LogisticCalibration()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(probs, labels.numpy(), tensorboard=False)
    return (
        torch.as_tensor(np.asarray(model.weights)),
        torch.as_tensor(np.asarray(model.intercept)),
        "logp",
        None,
    )


def tasks_for(group: str) -> list[tuple[str, str, Fit]]:
    if group == "vector":
        return [
            ("curvcal vector", "curvcal", curvcal_fit("vector", 0.0)),
            (
                "probmetrics VectorScalingCalibrator",
                "probmetrics",
                probmetrics_fit("VectorScalingCalibrator"),
            ),
            (
                "torch-uncertainty VectorScaler",
                "torch_uncertainty",
                torch_uncertainty_fit("VectorScaler"),
            ),
            ("netcal LogisticCalibration (log p)", "netcal", netcal_vector),
        ]
    if group == "matrix":
        return [
            (
                "curvcal matrix λ=0",
                "curvcal",
                curvcal_fit("matrix", 0.0, label="curvcal matrix λ=0"),
            ),
            (
                f"curvcal matrix ODIR λ={STRENGTH:g}",
                "curvcal",
                curvcal_fit("matrix", STRENGTH, label=f"curvcal matrix ODIR λ={STRENGTH:g}"),
            ),
            (
                "probmetrics MatrixScalingCalibrator",
                "probmetrics",
                probmetrics_fit("MatrixScalingCalibrator"),
            ),
            (
                "torch-uncertainty MatrixScaler",
                "torch_uncertainty",
                torch_uncertainty_fit("MatrixScaler"),
            ),
        ]
    if group == "dirichlet":
        return [
            (
                f"curvcal dirichlet ODIR λ={STRENGTH:g}",
                "curvcal",
                curvcal_fit("dirichlet", STRENGTH, label=f"curvcal dirichlet ODIR λ={STRENGTH:g}"),
            ),
            (
                f"torch-uncertainty DirichletScaler λ=μ={STRENGTH:g}",
                "torch_uncertainty",
                torch_uncertainty_fit("DirichletScaler", STRENGTH),
            ),
        ]
    if group == "dirichlet_unregularised":
        return [
            (
                "curvcal dirichlet λ=0",
                "curvcal",
                curvcal_fit("dirichlet", 0.0, label="curvcal dirichlet λ=0"),
            ),
            (
                "probmetrics MatrixScalingCalibrator on log p",
                "probmetrics",
                probmetrics_fit("MatrixScalingCalibrator", log_probabilities=True),
            ),
            (
                "torch-uncertainty DirichletScaler (no regulariser)",
                "torch_uncertainty",
                torch_uncertainty_fit("DirichletScaler"),
            ),
        ]
    if group == "dirichlet_l2":
        return [
            (
                f"curvcal dirichlet L2 λ={STRENGTH:g}",
                "curvcal",
                curvcal_fit(
                    "dirichlet", STRENGTH, "l2", label=f"curvcal dirichlet L2 λ={STRENGTH:g}"
                ),
            ),
        ]
    return [
        ("curvcal matrix CV", "curvcal", curvcal_cv("matrix")),
        ("curvcal dirichlet CV", "curvcal", curvcal_cv("dirichlet")),
        ("curvcal dirichlet L2 CV", "curvcal", curvcal_cv("dirichlet", "l2")),
    ]


def cpu_seconds(task: Callable[[], Any]) -> tuple[float, Any, float]:
    """``(CPU seconds, value, nan)`` of one run of ``task`` (one thread: CPU time is the time
    the task computed, not the time other jobs on the machine took from it)."""
    gc.collect()
    start = time.process_time()
    value = task()
    return time.process_time() - start, value, math.nan


def bench(
    n: int, k: int, repeats: int, groups: tuple[str, ...], memory: bool = False
) -> list[dict[str, Any]]:
    logits, labels = synthetic_logits(n, k)
    rows = []
    for group in groups:
        tasks = [t for t in tasks_for(group) if t[1] == "curvcal" or load_peer(t[1]) is not None]
        best: dict[str, float] = {}
        peak: dict[str, float] = {}
        value: dict[str, float] = {}
        error: dict[str, str] = {}
        for _ in range(repeats):
            for label, _library, fit in tasks:
                if label in error:
                    continue
                try:
                    if memory:
                        seconds, result, mb = measure(lambda f=fit: f(logits, labels))
                    else:
                        seconds, result, mb = cpu_seconds(lambda f=fit: f(logits, labels))
                except Exception as failure:
                    error[label] = f"{type(failure).__name__}: {failure}"[:160]
                    continue
                print(f"  {n}x{k} {label}: {seconds:.3f} s", file=sys.stderr)
                best[label] = min(best.get(label, math.inf), seconds)
                if memory:
                    peak[label] = max(peak.get(label, 0.0), mb)
                value[label] = objective(logits, labels, *result)
        reference = SAME_OBJECTIVE.get(group)
        path = PATHS.get(reference or "", [])
        for label, library, _fit in tasks:
            to_peer = None
            if library != "curvcal" and reference in value and label in value:
                to_peer = first_reached(path, value[label])
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "group": group,
                    "task": label,
                    "library": library,
                    "seconds": best.get(label),
                    "peak_mb": peak.get(label),
                    "objective": value.get(label),
                    "error": error.get(label),
                    "capped": label in CAPPED,
                    "to_peer_objective": to_peer,
                    "curvcal_seconds": best.get(reference or ""),
                }
            )
    return rows


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or not denominator > 0:
        return ""
    return f"{numerator / denominator:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000x100,5000x1000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help=f"every group at {QUICK_SIZES}, one repeat (smoke)"
    )
    parser.add_argument(
        "--cap",
        type=float,
        default=math.inf,
        help="stop curvcal's full-map fits at this many CPU seconds (their paths are kept)",
    )
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--json")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="wall seconds and peak memory (sampled every ms) instead of CPU seconds",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = QUICK_SIZES, 1
    CAP[0] = args.cap
    torch.set_num_threads(1)
    _one_blas_thread()
    rows = []
    for size in args.sizes.split(","):
        n, k = (int(v) for v in size.lower().split("x"))
        rows += bench(n, k, args.repeats, tuple(args.tasks.split(",")), args.memory)
    unit = "wall s" if args.memory else "CPU s"
    print(
        f"| N × K | map | task | {unit} (min) | peak MB | objective | curvcal {unit} to this "
        "objective | peer / curvcal, whole fit | peer / curvcal at the peer's objective |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        secs = r["error"] if r["seconds"] is None else f"{r['seconds']:.3f}"
        if r["capped"]:
            secs += " (capped)"
        peak = "" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
        obj = "" if r["objective"] is None else f"{r['objective']:.10f}"
        to_peer = "" if r["to_peer_objective"] is None else f"{r['to_peer_objective']:.3f}"
        whole = "" if r["library"] == "curvcal" else _ratio(r["seconds"], r["curvcal_seconds"])
        at_peer = _ratio(r["seconds"], r["to_peer_objective"])
        print(
            f"| {r['n']:,} × {r['k']:,} | {r['group']} | {r['task']} | {secs} | {peak} | {obj} "
            f"| {to_peer} | {whole} | {at_peer} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
