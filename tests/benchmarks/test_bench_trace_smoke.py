"""Smoke test of benchmarks/bench_trace.py: a few seeded runs on a synthetic flat spectrum."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trace.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_trace", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_trace"] = module
    spec.loader.exec_module(module)
    return module


def test_study_rows_and_json(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "trace.json"
    report = bench.main(["--cases", "flat", "--runs", "4", "--products", "40", "--json", str(out)])
    (case,) = report["cases"]
    assert case["trace"] == pytest.approx(2000.0, rel=1e-12)  # 2000 values evenly in [0.5, 1.5]
    assert set(case["estimators"]) == {"hutch++", "xtrace", "hutchinson"}
    for row in case["estimators"].values():
        assert 0.0 < row["mean_rel_error"] < 0.05 and 0.0 <= row["coverage"] <= 1.0
    assert json.loads(out.read_text())["cases"][0]["case"] == "flat"
    assert "| flat | 2000 | hutch++ |" in capsys.readouterr().out


def test_synthetic_matrix_has_the_given_spectrum(bench: ModuleType) -> None:
    values = torch.tensor([3.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    matrix = bench.synthetic(values, seed=4)
    assert torch.allclose(torch.linalg.eigvalsh(matrix), values.sort().values, atol=1e-12)
