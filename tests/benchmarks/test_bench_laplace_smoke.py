"""Smoke test of benchmarks/bench_laplace.py: tiny sizes, both structures, against laplace-torch.

The agreement bounds are those of tests/calibration/test_laplace_peer.py: at the same δ the
``kron`` predictives agree to float64 rounding and the ``full`` ones to laplace-torch's float32
GGN (1e-6); each library's own δ agrees to 1e-2 relative (laplace-torch's 100 Adam steps)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("laplace")


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_laplace")


def test_problem_shapes_and_labels(bench: ModuleType) -> None:
    data = bench.problem(30, 4, 3, 7)
    assert data["fit"].shape == (30, 4) and data["eval"].shape == (7, 4)
    assert data["weight"].shape == (3, 4) and data["bias"].shape == (3,)
    assert data["fit"].dtype == torch.float64
    assert int(data["labels"].min()) >= 0 and int(data["labels"].max()) < 3


def test_quick_run_agrees_with_laplace_torch(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "laplace.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    sizes = bench.parse_sizes(bench.QUICK_SIZES)
    assert {(r["n"], r["d"], r["k"], r["structure"]) for r in rows} == {
        (*size, structure) for size in sizes for structure in ("full", "kron")
    }
    for row in rows:
        assert row["curvcal_seconds"] >= 0 and row["peer_seconds"] >= 0
        assert row["delta_rel_diff"] < 1e-2
        tol = 1e-12 if row["structure"] == "kron" else 1e-6
        assert row["probs_max_diff_same_delta"] < tol
    assert "| 400 × 8 × 3 | kron | 27 |" in capsys.readouterr().out


def test_full_left_out_above_full_max_and_peer_above_its_memory(
    bench: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "laplace.json"
    # one row of the peer's Jacobian: K·P = 3·15 float64 = 360 B, twice that over 500 B
    argv = ["--quick", "--sizes", "60x4x3", "--full-max", "14", "--peer-mb", str(500 / 2**20)]
    assert bench.main([*argv, "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["structure"] == "kron" and "peer_seconds" not in row
    assert "over --peer-mb" in row["peer_skipped"]
    assert bench.predictive_rows(3, 15, 720 / 2**20) == 1
