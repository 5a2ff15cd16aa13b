"""Smoke test of benchmarks/bench_laplace_prior.py: a small synthetic head, both structures and
predictives, the previous search against the descent, and a two-head agreement study."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_laplace_prior")


def test_quick_run_chooses_the_same_delta_asking_fewer(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prior.json"
    assert bench.main(["--quick", "--agreement", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {(r["structure"], r["predictive"]) for r in rows} == {
        (s, p) for s in ("full", "kron") for p in ("probit", "mc (20)")
    }
    for row in rows:
        assert row["same_grid_point"] and row["delta_rel_diff"] < 1e-5
        assert row["after_evaluations"] < row["before_evaluations"]
        assert row["before_seconds"] >= 0 and row["after_seconds"] >= 0
    study = result["agreement"]
    assert study["heads"] == sum(study["heads_by_draws"].values()) <= 2
    assert study["asked_mean"] < study["asked_before_mean"]
    assert "| full | mc (20) |" in capsys.readouterr().out


def test_previous_search_is_the_grid_minimum_then_bounded_brent(bench: ModuleType) -> None:
    grid = tuple(10.0 ** (i / 4) for i in range(-8, 9))
    found = bench.previous_search(lambda d: (d - 2.0) ** 2, grid)
    assert found.grid_choice == 10**0.25 and abs(found.prior_precision - 2.0) < 1e-7
    assert found.asked > len(grid)
