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
    argv = ["--sizes", "300x4", "--repeats", "1", "--tasks", ",".join(bench.TASKS)]
    assert bench.main([*argv, "--json", str(out)]) == 0
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
    assert "| 300 × 4 | cv | curvcal matrix CV |" in capsys.readouterr().out
