"""Smoke test of benchmarks/bench_top_label.py: curvcal's one-dimensional top-label kernels give
the peers' outputs (netcal's equal-width histogram exactly, scikit-learn's isotonic regression to
rounding) on the same confidences, curvcal's BBQ task gives the model average written out
directly, and every task is timed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("netcal")
pytest.importorskip("sklearn")
pytest.importorskip("torch_uncertainty")


def test_every_task_runs_and_agrees_with_the_peer(
    load_bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    bench = load_bench("bench_top_label")
    out = tmp_path / "o.json"
    rows = bench.main(["--n", "3000", "--k", "10", "--repeats", "1", "--json", str(out)])
    by_task = {row["task"]: row for row in rows}
    assert set(by_task) == {"curvcal histogram (equal-width)", "netcal HistogramBinning",
                            "curvcal isotonic", "scikit-learn IsotonicRegression",
                            "curvcal BBQ", "torch-uncertainty BBQScaler", "netcal BBQ"}  # fmt: skip
    assert by_task["netcal HistogramBinning"]["max_abs_diff"] == 0.0
    assert by_task["scikit-learn IsotonicRegression"]["max_abs_diff"] < 1e-12
    assert all(row["cpu_s"] >= 0 for row in rows)
    assert by_task["curvcal BBQ"]["peer_over_curvcal"] is None
    for peer in ("torch-uncertainty BBQScaler", "netcal BBQ"):
        assert by_task[peer]["map"] == "bbq"
        assert by_task[peer]["peer_over_curvcal"] > 0
        assert 0 <= by_task[peer]["max_abs_diff"] < 1  # other estimators (benchmarks/README.md)
    assert out.exists()


def test_curvcal_bbq_task_is_the_weighted_average_of_every_model(
    load_bench: Callable[[str], ModuleType],
) -> None:
    """f(c) = Σ_M w_M θ_{M, b_M(c)} summed over every candidate model, bins (e_b, e_{b+1}]
    found by ``numpy.searchsorted``: the saving cut at 2^-52 moves it by under 1e-13."""
    from curvcal.calibration.bbq import fit_models

    bench = load_bench("bench_top_label")
    rng = np.random.default_rng(3)
    c = np.round(rng.uniform(0.3, 1.0, 4000), 3)  # ties
    c[:300] = 1.0  # saturated rows
    correct = (rng.uniform(size=c.size) < c**2).astype(np.float64)
    mapped = bench.tasks(c, correct)["curvcal BBQ"][1]()
    edges, values, weights, _ = fit_models(c, correct)
    direct = np.zeros_like(c)
    for row_edges, row_values, weight in zip(edges, values, weights, strict=True):
        direct += weight * row_values[np.searchsorted(row_edges[1:-1], c, side="left")]
    assert len(weights) > 10
    assert np.abs(mapped - direct).max() < 1e-13
