"""Smoke test of benchmarks/bench_warm_start.py: a tiny ViT, one seed, both strategies' rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("timm")


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_warm_start")


def test_rows_json_and_table(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "warm.json"
    report = bench.main(["--smoke", "--json", str(out)])
    runs = report["runs"]
    assert {(r["strategy"], r["tol"]) for r in runs} == {
        ("random", 1e-3), ("random", 1e-4), ("warm 0.25", 1e-3), ("warm 0.25", 1e-4),
    }  # fmt: skip
    for run in runs:
        # the cost in full-product units: full products plus the sample's share of its own
        share = 0.0 if run["fraction"] is None else run["fraction"]
        assert run["units"] == pytest.approx(run["full_products"] + share * run["warm_products"])
        # the steps and at least one verification product
        assert run["full_products"] > run["steps"] >= 1
    warm = [r for r in runs if r["strategy"] != "random"]
    assert all(r["fraction"] == 8 / 32 and r["warm_products"] >= 2 for r in warm)
    for row in report["rows"]:
        assert row["converged"] and row["agrees"]
        if row["strategy"] == "random":
            assert row["random_over_this"] == 1.0
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert "| warm 0.25 | 0.0001 |" in capsys.readouterr().out


def test_the_sample_is_the_share_asked_for(bench: ModuleType) -> None:
    rows = bench.subsample(256, 1 / 16, seed=4)
    assert rows.numel() == 16 and rows.unique().numel() == 16
    assert rows.tolist() == sorted(rows.tolist()) and rows.min() >= 0 and rows.max() < 256
    assert bench.parse_fractions("1/16, 1/8,0.25") == [0.0625, 0.125, 0.25]


def test_bad_options_are_refused(bench: ModuleType) -> None:
    for argv in (["--fractions", "0"], ["--fractions", "1/1"], ["--fractions", "x"],
                 ["--samples", "1"], ["--seeds", "0"]):  # fmt: skip
        with pytest.raises(SystemExit):
            bench.main(argv)
