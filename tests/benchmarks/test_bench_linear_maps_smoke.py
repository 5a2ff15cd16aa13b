"""Smoke test of benchmarks/bench_linear_maps.py: every task group on tiny logits, with the
installed peers; curvcal's objective is checked against a value worked out apart."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_linear_maps")


def test_objective_is_the_mean_nll_plus_the_penalty(bench: ModuleType) -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0])
    w, b = torch.eye(2), torch.tensor([0.5, 0.0])
    # Row 0: scores (2.5, 0); row 1: (0.5, 1); label 0 both times.
    nll = (math.log1p(math.exp(-2.5)) + (math.log(math.exp(0.5) + math.e) - 0.5)) / 2
    assert bench.objective(logits, labels, w, b, "logits", None) == pytest.approx(nll, rel=1e-12)
    penalty = torch.full((2, 3), 0.1, dtype=torch.float64)
    extra = 0.1 * (1 + 1 + 0.25)
    assert bench.objective(logits, labels, w, b, "logits", penalty) == pytest.approx(
        nll + extra, rel=1e-12
    )


def test_every_group_runs_and_curvcal_reaches_the_lowest_objective_of_its_definition(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "linear.json"
    assert bench.QUICK_SIZES == "300x4"
    assert bench.main(["--quick", "--json", str(out)]) == 0  # every group, one repeat
    rows = json.loads(out.read_text())
    groups = {row["group"] for row in rows}
    assert groups == set(bench.TASKS)
    for row in rows:
        if row["library"] == "curvcal":
            assert row["error"] is None and row["seconds"] >= 0
            assert math.isfinite(row["objective"])
    by_task = {row["task"]: row for row in rows}
    ours = by_task[f"curvcal dirichlet ODIR λ={bench.STRENGTH:g}"]["objective"]
    peer = by_task.get(f"torch-uncertainty DirichletScaler λ=μ={bench.STRENGTH:g}")
    if peer is not None and peer["objective"] is not None:  # the same objective: never below
        assert ours <= peer["objective"] + 1e-9
        # curvcal's path reached the peer's objective no later than its own whole fit
        assert 0 <= peer["to_peer_objective"] <= peer["curvcal_seconds"]
    unregularised = by_task["curvcal dirichlet λ=0"]["objective"]
    for name in (
        "probmetrics MatrixScalingCalibrator on log p",
        "torch-uncertainty DirichletScaler (no regulariser)",
    ):
        row = by_task.get(name)
        if row is not None and row["objective"] is not None:
            assert unregularised <= row["objective"] + 1e-9
            assert row["to_peer_objective"] is not None
    assert "| 300 × 4 | cv | curvcal matrix CV |" in capsys.readouterr().out


@pytest.mark.parametrize(("target", "seconds"), [(5.0, 0.0), (2.0, 2.0), (1.5, 3.0), (0.5, None)])
def test_first_reached_is_the_first_point_at_or_under_the_target(
    bench: ModuleType, target: float, seconds: float | None
) -> None:
    path = [(0.0, 3.0), (1.0, 2.5), (2.0, 2.0), (3.0, 1.0), (4.0, 1.5)]
    assert bench.first_reached(path, target) == seconds


def test_the_cap_stops_curvcals_fit_and_keeps_its_last_map(
    bench: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "c.json"
    argv = ["--sizes", "300x4", "--repeats", "1", "--tasks", "dirichlet", "--cap", "0"]
    try:
        assert bench.main([*argv, "--json", str(out)]) == 0
    finally:
        bench.CAP[0] = math.inf
    ours = next(row for row in json.loads(out.read_text()) if row["library"] == "curvcal")
    assert ours["capped"] and ours["error"] is None
    # stopped at the first objective evaluated: the identity map's
    assert ours["objective"] == pytest.approx(bench.PATHS[ours["task"]][0][1], rel=1e-12)
