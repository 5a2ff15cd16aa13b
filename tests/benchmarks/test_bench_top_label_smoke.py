"""Smoke test of benchmarks/bench_top_label.py: curvcal's one-dimensional top-label kernels give
the peers' outputs (netcal's equal-width histogram exactly, scikit-learn's isotonic regression to
rounding) on the same confidences, and every task is timed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("netcal")
pytest.importorskip("sklearn")


def test_every_task_runs_and_agrees_with_the_peer(
    load_bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    bench = load_bench("bench_top_label")
    out = tmp_path / "o.json"
    rows = bench.main(["--n", "3000", "--k", "10", "--repeats", "1", "--json", str(out)])
    by_task = {row["task"]: row for row in rows}
    assert set(by_task) == {"curvcal histogram (equal-width)", "netcal HistogramBinning",
                            "curvcal isotonic", "scikit-learn IsotonicRegression"}  # fmt: skip
    assert by_task["netcal HistogramBinning"]["max_abs_diff"] == 0.0
    assert by_task["scikit-learn IsotonicRegression"]["max_abs_diff"] < 1e-12
    assert all(row["cpu_s"] >= 0 for row in rows)
    assert out.exists()
