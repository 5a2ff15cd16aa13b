"""Smoke test of benchmarks/bench_coverage.py: both tables run at a tiny size and print one row
per cell with a rate and its binomial standard error."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


def test_the_coverage_and_gate_tables_run(
    load_bench: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_coverage")
    assert (
        bench.main(["--datasets", "2", "--resamples", "20", "--sizes", "200", "--classes", "2"])
        == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 4  # one per model
    assert all(line.count(" ± ") == 6 for line in rows)
    # the gate's model hits its target population ECE exactly (a one-signed linear gap)
    assert bench.gate_model(0.04).ece() == pytest.approx(0.04, abs=1e-10)


def test_the_ranking_table_runs(
    load_bench: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_coverage")
    argv = ["--ranking", "--datasets", "2", "--resamples", "10", "--sizes", "200"]
    argv += ["--classes", "2", "--models", "over-confident"]
    assert bench.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 1 and rows[0].count(" ± ") == 2


def test_the_nll_table_runs_on_the_whole_tables_draws(
    load_bench: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("bench_coverage")
    argv = ["--nll", "--datasets", "3", "--sizes", "200", "--classes", "2", "--models"]
    assert bench.main([*argv, "calibrated"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 1 and rows[0].count(" ± ") == 1
