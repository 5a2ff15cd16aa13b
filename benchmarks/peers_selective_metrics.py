"""MMCE and AURC against the peers' own implementations, and the cost of the new metrics.

Run where the peers are installed (netcal 1.4 for MMCE, torch-uncertainty 0.13 for AURC; neither
is a dependency of curvcal):

    python benchmarks/peers_selective_metrics.py

netcal's MMCE is the N×N double sum of Kumar et al. (root form, exp(-2.5 |Δ|)), so it is run at
N ≤ 5000 only. torch-uncertainty's AURC is the trapezoid over coverages k/N, k = 1..N, divided
by 1 - 1/N; curvcal's is Geifman et al.'s mean of the N risks. Without ties they are related
exactly by AURC_tu = (N·AURC - (risk_1 + risk_N)/2)/(N - 1), which is what is checked. Prints
one JSON line per case.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import torch

from curvcal.calibration import binfree, selective
from curvcal.calibration.metrics import calibration_metrics


def _torch_uncertainty_aurc() -> type:
    """torch-uncertainty's AURC class, loaded from its module file (its package imports
    lightning, which this comparison does not need)."""
    spec = importlib.util.find_spec("torch_uncertainty")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "metrics/classification/risk_coverage.py"
    module_spec = importlib.util.spec_from_file_location("tu_risk_coverage", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.AURC  # type: ignore[no-any-return]


def _scores(n: int, k: int, sharpen: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(w), scores sharpen·w (over-confident when sharpen > 1)."""
    generator = torch.Generator().manual_seed(seed)
    w = 1.5 * torch.randn(n, k, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(w, dim=1), 1, generator=generator)[:, 0]
    return sharpen * w, labels


def main() -> None:
    from netcal.metrics import MMCE

    aurc_class = _torch_uncertainty_aurc()
    for n, k, sharpen in ((500, 2, 3.0), (5000, 10, 3.0), (5000, 100, 0.5), (5000, 10, 1.0)):
        z, y = _scores(n, k, sharpen, seed=n + k)
        p = torch.softmax(z, dim=1)
        conf, pred = p.max(dim=1)
        correct = (pred == y).to(torch.float64)
        ours_mmce = binfree.mmce(conf, correct)
        netcal_mmce = float(MMCE().measure(p.numpy(), y.numpy()))
        curve = selective.risk_coverage_curve(conf, correct)
        metric = aurc_class()
        metric.update(p, y)
        tu_aurc = float(metric.compute())
        risk = curve.risk
        predicted_tu = (n * curve.aurc - float(risk[0] + risk[-1]) / 2) / (n - 1)
        print(
            json.dumps(
                {
                    "n": n,
                    "k": k,
                    "sharpen": sharpen,
                    "mmce": ours_mmce,
                    "mmce_netcal": netcal_mmce,
                    "mmce_rel_diff": abs(ours_mmce - netcal_mmce) / netcal_mmce,
                    "aurc": curve.aurc,
                    "aurc_torch_uncertainty": tu_aurc,
                    "aurc_tu_from_ours": predicted_tu,
                    "aurc_tu_abs_diff": abs(predicted_tu - tu_aurc),
                }
            )
        )
    # cost of the new metrics inside one calibration_metrics pass at 200k×100
    z, y = _scores(200_000, 100, 3.0, seed=0)
    z32 = z.to(torch.float32)
    calibration_metrics(z32, y)
    start = time.perf_counter()
    m = calibration_metrics(z32, y)
    whole = time.perf_counter() - start
    p = torch.softmax(z, dim=1)
    conf, pred = p.max(dim=1)
    correct = (pred == y).to(torch.float64)
    start = time.perf_counter()
    for _ in range(5):
        binfree.ks_calibration_error(conf, correct)
        binfree.kuiper_statistic(conf, correct)
        binfree.mmce(conf, correct)
        selective.risk_coverage_curve(conf, correct)
    new = (time.perf_counter() - start) / 5
    print(
        json.dumps(
            {
                "n": 200_000,
                "k": 100,
                "calibration_metrics_s": whole,
                "new_metrics_s": new,
                "mmce": m.mmce,
                "aurc": m.aurc,
                "numpy": np.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
