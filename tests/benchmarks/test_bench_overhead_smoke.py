"""Smoke test of benchmarks/bench_overhead.py: the quick cases, the run's λmax against ARPACK on
curvcal's float64 operator, and the figures the table is made of."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_overhead")


@pytest.mark.slow  # two cases of kernels and λmax runs, and an ARPACK reference: about 35 s of CPU
def test_quick_run_reports_the_run_beside_its_kernel(
    bench: ModuleType,
    load_bench: Callable[[str], ModuleType],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "o.json"
    report = bench.main(
        ["--quick", "--cases", "digits-cnn,llama", "--repeats", "1", "--json", str(out)]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    digits, llama = report["rows"]
    for row in (digits, llama):
        run = row["run"]
        assert run["converged"] and run["products"] >= 2
        assert 0 < run["product_seconds"] < run["seconds"]
        assert row["run_s_per_product"] == pytest.approx(run["seconds"] / run["products"])
        assert row["run_per_kernel"] == pytest.approx(row["run_s_per_product"] / row["kernel_s"])
        assert row["kernel_cpu_s"] > 0 and row["run_per_kernel_cpu"] == pytest.approx(
            min(r["cpu_seconds"] / r["products"] for r in row["runs"]) / row["kernel_cpu_s"]
        )
        assert 0 < row["outside_products_share"] < 1
        assert row["kernel_per_gradient"] > 0 and row["rebuilt_per_gradient"] > 0
        assert row["run_per_gradient"] == pytest.approx(
            row["run_s_per_product"] / row["gradient_s"]
        )
        # the plan of a small model on this host keeps every graph and an unrestarted basis
        assert run["graphs"] == "kept" and run["basis_rows"] >= 8
        # full reorthogonalisation, run in the same rounds, reads 2m + 4 rows at step m (the
        # two latest, then the whole basis: 2(m+1)·(m+2)/2 over the run, m counted from 1);
        # partial reads 4 on most steps and never more
        full = row["full"]["run"]
        assert full["converged"] and full["value"] == pytest.approx(run["value"], rel=1e-3)
        steps = full["steps"]
        assert full["rows_read_per_step"] >= (2 * sum(range(1, steps + 1)) + 2 * steps) / steps
        assert run["rows_read_per_step"] < full["rows_read_per_step"]
    # the λmax the run reports is the Hessian's (ARPACK on the float64 operator)
    load = bench.workload("digits-cnn", quick=True)
    reference, _second, _used = load_bench("bench_hessian").arpack_reference(
        load.model, load.batches
    )
    assert digits["run"]["value"] == pytest.approx(reference, rel=1e-3)
    table = capsys.readouterr().out
    assert "| digits-cnn | 0.01 M |" in table and "| llama |" in table


def test_no_full_leaves_the_full_reorthogonalisation_runs_out(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    report = bench.main(["--quick", "--cases", "digits-cnn", "--repeats", "1", "--no-full"])
    (row,) = report["rows"]
    assert row["run"]["converged"] and row["full"]["runs"] == []
    assert math.isnan(row["full"]["run_per_kernel_cpu"])
    assert math.isnan(row["full"]["outside_s_per_product"])
    assert "| digits-cnn |" in capsys.readouterr().out
