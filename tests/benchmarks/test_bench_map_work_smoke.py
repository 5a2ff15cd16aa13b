"""Smoke test of benchmarks/bench_map_work.py: the maps' fit and apply apart on tiny
probabilities with the floor and peak memory, and one whole CLI run beside its peer's."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_map_work")


def test_fit_and_apply_apart_with_floor_and_memory(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    markdown = tmp_path / "w.md"
    result = bench.main(
        [
            "--sizes", "2000x10", "--maps", "histogram_ovr,isotonic", "--repeats", "1",
            "--no-peers", "--json", str(out), "--markdown", str(markdown),
        ]
    )  # fmt: skip
    assert json.loads(out.read_text()) == result
    assert result["bandwidth_gb_s"] > 0.1
    (size,) = result["sizes"]
    assert (size["n"], size["k"]) == (2000, 10)
    assert size["floor_apply_s"] == pytest.approx(2 * size["floor_fit_s"])
    assert size["floor_fit_s"] == pytest.approx(2000 * 10 * 8 / (result["bandwidth_gb_s"] * 1e9))
    tasks = {row["task"]: row for row in size["rows"]}
    assert set(tasks) == {
        "curvcal histogram-ovr",
        "curvcal isotonic",
        "curvcal isotonic: its one-dimensional part (N values)",
    }
    for name in ("curvcal histogram-ovr", "curvcal isotonic"):
        row = tasks[name]
        assert row["error"] is None
        assert row["fit_cpu_s"] > 0 and row["apply_cpu_s"] >= 0
        assert row["total_cpu_s"] == pytest.approx(row["fit_cpu_s"] + row["apply_cpu_s"])
        assert row["fit_peak_over_input"] >= 0 and math.isfinite(row["apply_peak_over_input"])
    assert "### 2,000 × 10" in markdown.read_text()


def test_curvcal_parts_are_the_registry_map_on_probabilities(bench: ModuleType) -> None:
    """The timed fit and apply are the map a user gets: equal-width bins for histograms."""
    import torch

    logits, labels = bench.synthetic_logits(500, 4)
    probs = torch.softmax(logits.double(), 1).numpy()
    fit, apply = bench.curvcal_parts("histogram_ovr", probs, labels)
    calibrator = fit()
    assert calibrator.scheme == "equal-width" and len(calibrator.values[0]) == bench.N_BINS
    rows = apply(calibrator)
    assert rows.shape == (500, 4)
    assert torch.allclose(rows.sum(1), torch.ones(500, dtype=torch.float64))


@pytest.mark.slow  # two processes that import torch (and netcal): 10-15 s
def test_whole_cli_run_beside_its_peer(bench: ModuleType) -> None:
    """One CLI run and (when netcal is installed) the peer's run, each in its own process."""
    libraries = {"netcal": bench.load_peer("netcal")}
    rows = bench.bench_cli(1500, 5, ("histogram_ovr",), 1, libraries)
    ours = rows[0]
    assert ours["task"] == "curvcal metrics --method histogram-ovr"
    assert ours["returncode"] == 0, ours["stderr_tail"]
    assert ours["cpu_s"] > 0 and ours["peak_mb"] > 0
    if libraries["netcal"] is None:
        assert len(rows) == 1
    else:
        peer = rows[1]
        assert peer["returncode"] == 0, peer["stderr_tail"]
        assert peer["peer_over_curvcal"] == pytest.approx(peer["cpu_s"] / ours["cpu_s"])


def test_unknown_map_is_refused(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "100x3", "--maps", "nope"])
