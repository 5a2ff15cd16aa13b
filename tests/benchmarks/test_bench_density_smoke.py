"""Smoke test of benchmarks/bench_density.py: both SLQ variants on the synthetic outlier case."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_density")


def test_rows_json_and_exactness_at_many_steps(bench: ModuleType, tmp_path: Path, capsys) -> None:
    """At 80 steps both variants reproduce the smoothed measure of their probes to rounding, and
    the three-term recurrence shows its ghost copies of λ1 (more than one per run)."""
    out = tmp_path / "density.json"
    report = bench.main(["--cases", "outliers", "--steps", "80", "--runs", "2", "--json", str(out)])
    (case,) = report["cases"]
    rows = case["steps"][80]
    for row in rows.values():
        assert row["l1_error"] < 1e-10 and row["moment_error"] < 1e-12
    assert rows["basis kept"]["top_copies_per_run"] == 1.0
    assert rows["three-term"]["top_copies_per_run"] > 1.0
    assert json.loads(out.read_text())["cases"][0]["case"] == "outliers"
    assert "| outliers | 2,000 | 80 | three-term |" in capsys.readouterr().out


def test_probes_are_the_ones_the_density_draws(bench: ModuleType) -> None:
    """The exact measure uses the density's own probes: the first quadrature moment of a run is
    v_rᵀAv_r for the probe ``probes`` returns."""
    from curvcal.curvature.density import spectral_density

    matrix = bench.outliers(n=50, seed=2)
    result = spectral_density(matrix, runs=3, steps=5, seed=7)
    columns = bench.probes(50, 3, 7)
    for run in range(3):
        first = sum(w * t for t, w in zip(result.nodes[run], result.weights[run], strict=True))
        assert first == pytest.approx(float(columns[:, run] @ matrix @ columns[:, run]), abs=1e-12)
    assert torch.allclose(columns.abs(), torch.full_like(columns, 50**-0.5))
