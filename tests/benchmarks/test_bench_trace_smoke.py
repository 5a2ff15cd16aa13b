"""Smoke test of benchmarks/bench_trace.py: a few seeded runs on a synthetic flat spectrum."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_trace")


def test_study_rows_and_json(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "trace.json"
    report = bench.main(["--cases", "flat", "--runs", "4", "--products", "40", "--json", str(out)])
    (case,) = report["cases"]
    assert case["trace"] == pytest.approx(2000.0, rel=1e-12)  # 2000 values evenly in [0.5, 1.5]
    assert set(case["estimators"]) == {"hutchpp", "xtrace", "hutchinson"}
    for row in case["estimators"].values():
        assert 0.0 < row["mean_rel_error"] < 0.05 and 0.0 <= row["coverage"] <= 1.0
    assert json.loads(out.read_text())["cases"][0]["case"] == "flat"
    assert "| flat | 2000 | hutchpp |" in capsys.readouterr().out


def test_synthetic_matrix_has_the_given_spectrum(bench: ModuleType) -> None:
    values = torch.tensor([3.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    matrix = bench.synthetic(values, seed=4)
    assert torch.allclose(torch.linalg.eigvalsh(matrix), values.sort().values, atol=1e-12)


def test_variant_study_checks_itself_and_both_product_modes_agree(
    bench: ModuleType, capsys
) -> None:
    options = ["--study", "--cases", "decaying", "--runs", "3", "--products", "40"]
    report = bench.main([*options, "--timing-seeds", "1"])
    (case,) = report["cases"]
    # seed 0: every variant spent 40 products; Hutchinson, Hutch++, XTrace equal curvcal's
    assert case["check_difference"] < 1e-12
    rows = case["variants"]
    assert {"hutchpp s=13 (default)", "adaptive hutchpp", "xtrace jackknife"} <= set(rows)
    assert rows["xtrace"]["mean_rel_error"] == rows["xtrace jackknife"]["mean_rel_error"]
    assert rows["hutchpp s=20"]["coverage"] != rows["hutchpp s=20"]["coverage"]  # no interval
    span = bench.main([*options, "--span", "--timing-seeds", "1"])["cases"][0]["variants"]
    for name, row in rows.items():
        assert span[name]["mean_rel_error"] == pytest.approx(row["mean_rel_error"], rel=1e-4)
    assert "| decaying | xtrace jackknife |" in capsys.readouterr().out


def test_jackknife_values_are_xtrace_without_each_probe(bench: ModuleType) -> None:
    import trace_study

    matrix = bench.synthetic(torch.linspace(-1.0, 3.0, 60, dtype=torch.float64), seed=3)
    probes = trace_study.pool_of(60, 24, seed=5)

    def apply(columns: torch.Tensor) -> torch.Tensor:
        return matrix @ columns

    plain, jackknife = trace_study.xtrace_runs(apply, probes, 24)
    without = []
    for j in range(12):
        kept = torch.cat([probes[:, :j], probes[:, j + 1 : 12]], dim=1)
        without.append(trace_study.xtrace_runs(apply, kept, 22)[0].estimate)
    values = torch.tensor(without, dtype=torch.float64)
    variance = 11 / 12 * float(((values - values.mean()) ** 2).sum())
    half = 2.2010 * variance**0.5  # t(0.975, 11)
    assert jackknife.estimate == plain.estimate
    assert (jackknife.high - jackknife.low) / 2 == pytest.approx(half, rel=1e-4)


def test_split_study_against_tr_h(bench: ModuleType) -> None:
    hessian = bench.synthetic(torch.linspace(0.5, 1.5, 80, dtype=torch.float64), seed=6)
    # a zero R: the split is tr(G) = tr(H) exactly, whatever the estimator on R
    found = bench.study_split(hessian, torch.zeros_like(hessian), 40, 3, 5)
    methods = ("hutchpp", "xtrace", "hutchinson")
    # 3 classes: the exact part's 2 gradient norms per sample leave 38 of 40 products for R
    assert set(found) == {f"{m} on H (40)" for m in methods} | {
        f"tr(G) + {m} on R (38)" for m in methods
    }
    for name, row in found.items():
        if name.startswith("tr(G)"):
            assert row["max_rel_error"] < 1e-14 and row["coverage"] == 1.0
        else:
            assert 0.0 < row["mean_rel_error"] < 0.05 and row["runs_over_1pct"] <= 5
