"""Smoke test of benchmarks/bench_calibration.py: the curvcal part on tiny logits, no peers."""

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
    return load_bench("bench_calibration")


def test_synthetic_logits_are_float32_over_confident_and_seeded(bench: ModuleType) -> None:
    logits, labels = bench.synthetic_logits(4000, 10, seed=3)
    again, _ = bench.synthetic_logits(4000, 10, seed=3)
    assert logits.dtype == torch.float32 and labels.dtype == torch.int64
    assert torch.equal(logits, again)
    assert int(labels.min()) >= 0 and int(labels.max()) < 10
    confidence = torch.softmax(logits.double(), 1).max(1).values.mean()
    accuracy = (logits.argmax(1) == labels).double().mean()
    assert confidence > accuracy + 0.1  # over-confident by construction


def test_missing_peer_is_reported_not_raised(bench: ModuleType) -> None:
    assert bench.load_peer("curvcal_no_such_peer_library") is None


def test_curvcal_only_run_writes_values_and_times(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    code = bench.main(
        [
            "--sizes",
            "600x5,200x30",
            "--repeats",
            "1",
            "--no-peers",
            "--no-focal",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "not installed" in captured.err
    result = json.loads(out.read_text())
    assert result["peers"] == dict.fromkeys(bench.PEERS, "not installed")
    assert [(s["n"], s["k"]) for s in result["sizes"]] == [(600, 5), (200, 30)]
    for size in result["sizes"]:
        assert size["agreement"] == [] and size["peer_totals_seconds"] == {}
        assert all(math.isfinite(v) and v >= 0 for v in size["curvcal"].values())
        assert 0.01 < size["curvcal_ts"]["temperature"] < 100
        assert abs(size["curvcal_ts"]["derivative"]) < 1e-6
        assert size["curvcal_total_seconds"] > 0
    # The hand-checkable convention cases run without peers too (references.md golden case).
    assert result["conventions"]["confidence_one"]["curvcal"] == pytest.approx(0.2, abs=1e-12)
    assert result["conventions"]["equal_mass_ties"]["curvcal_bins_used"] == 2
    assert "### 600 × 5" in captured.out
