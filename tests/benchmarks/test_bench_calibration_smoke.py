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


def test_per_map_section_times_every_registry_map_that_applies(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from curvcal.calibration.registry import MAPS

    out = tmp_path / "maps.json"
    code = bench.main(
        [
            "--only-maps",
            "--map-sizes",
            "300x4",
            "--map-names",
            "ts,vector",
            "--repeats",
            "2",
            "--no-peers",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["sizes"] == [] and "conventions" not in result
    assert result["map_peers"] == dict.fromkeys(bench.MAP_PEERS, "not installed")
    (size,) = result["maps"]
    assert (size["n"], size["k"]) == (300, 4)
    rows = {row["map"]: row for row in size["rows"]}
    assert set(rows) == {"ts", "vector"}  # only the maps asked for, no peers
    for row in rows.values():
        assert row["library"] == "curvcal" and row["error"] is None
        assert row["seconds"] > 0 and row["peak_mb"] >= 0
        assert row["ratio_to_curvcal"] is None
    assert f"curvcal {MAPS['ts'].title}" == rows["ts"]["task"]
    assert "### maps at 300 × 4" in capsys.readouterr().out


def test_per_map_section_skips_maps_that_do_not_apply(bench: ModuleType, monkeypatch) -> None:
    import dataclasses

    from curvcal.calibration import registry

    binary = dataclasses.replace(registry.MAPS["vector"], skip_reason=registry.binary_only)
    monkeypatch.setitem(registry.MAPS, "vector", binary)
    size = bench.bench_maps(200, 3, 1, {}, names=("ts", "vector"))
    assert [row["map"] for row in size["rows"]] == ["ts"]
    assert size["skipped"] == {
        "vector": "binary problems (K = 2) only; these scores have 3 classes"
    }


def test_peer_table_keys_are_registry_method_names(bench: ModuleType) -> None:
    """Peers keyed by the registry's stage names; entries for maps not (yet) in the registry
    are skipped by the run, not an error."""
    from curvcal.calibration.registry import MAPS

    assert {"ts", "vector", "matrix"} <= set(bench.PEER_MAPS)
    assert set(bench.PEER_MAPS) >= {"histogram", "isotonic", "platt", "beta", "dirichlet"}
    for entries in bench.PEER_MAPS.values():
        assert all(library in bench.MAP_PEERS for _label, library, _run in entries)
    assert set(MAPS) & set(bench.PEER_MAPS) >= {"ts"}


def test_a_peer_map_is_timed_beside_curvcal_with_its_ratio_and_difference(
    bench: ModuleType, monkeypatch
) -> None:
    """A stand-in peer (the exact softmax of the fitted temperature, computed apart) gives a
    ratio in wall and in CPU seconds and a probability difference at rounding level."""
    from curvcal.calibration import fit_temperature

    def peer(logits, labels, probs, y):
        temperature = fit_temperature(logits, labels).temperature
        return torch.softmax(logits.double() / temperature, dim=1)

    monkeypatch.setitem(bench.PEER_MAPS, "ts", (("stand-in TS", "netcal", peer),))
    size = bench.bench_maps(400, 5, 1, {"netcal": object()}, names=("ts",))
    ours, theirs = size["rows"]
    assert ours["task"].startswith("curvcal") and theirs["task"] == "stand-in TS"
    assert theirs["ratio_to_curvcal"] > 0
    assert ours["cpu_seconds"] > 0 and theirs["cpu_seconds"] > 0
    assert theirs["cpu_ratio_to_curvcal"] == pytest.approx(
        theirs["cpu_seconds"] / ours["cpu_seconds"]
    )
    assert theirs["max_abs_diff_probs"] < 1e-12
