"""bench_calibration.py's per-map section keeps what it measured: the JSON and markdown are
rewritten after every map, each row has CPU seconds beside wall seconds, and a peer's row has
its ratio in both."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_calibration")


def test_a_run_stopped_after_the_first_map_keeps_its_rows(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bench.curvcal_map

    def stopping(stage: str):
        if stage == "vector":

            def stop(logits, labels):
                raise KeyboardInterrupt  # a long run killed during its second map

            return stop
        return real(stage)

    monkeypatch.setattr(bench, "curvcal_map", stopping)
    out, table = tmp_path / "maps.json", tmp_path / "maps.md"
    argv = ["--only-maps", "--map-sizes", "300x4", "--map-names", "ts,vector", "--repeats", "1"]
    with pytest.raises(KeyboardInterrupt):
        bench.main([*argv, "--no-peers", "--json", str(out), "--markdown", str(table)])
    (size,) = json.loads(out.read_text())["maps"]
    assert [row["map"] for row in size["rows"]] == ["ts"]
    assert size["rows"][0]["seconds"] > 0 and size["rows"][0]["cpu_seconds"] > 0
    assert "| ts | curvcal" in table.read_text()
    assert not list(tmp_path.glob("*.partial"))


def test_every_map_rewrites_the_whole_file(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "maps.json"
    seen: list[list[str]] = []
    real = bench.write_outputs

    def spy(result, json_path, markdown_path):
        real(result, json_path, markdown_path)
        maps = json.loads(Path(json_path).read_text())["maps"]
        seen.append([row["map"] for size in maps for row in size["rows"]])

    bench.write_outputs = spy
    try:
        argv = ["--only-maps", "--map-sizes", "300x4,200x3", "--map-names", "ts,vector"]
        bench.main([*argv, "--repeats", "1", "--no-peers", "--json", str(out)])
    finally:
        bench.write_outputs = real
    assert seen[:4] == [["ts"], ["ts", "vector"], ["ts", "vector", "ts"], ["ts", "vector"] * 2]
    assert "CPU seconds" in bench.maps_markdown(json.loads(out.read_text())["maps"])


def test_cpu_seconds_count_the_task_not_the_memory_sampler_nor_sleep(bench: ModuleType) -> None:
    def spin_then_sleep() -> int:
        import time

        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        time.sleep(0.3)
        return 7

    wall, cpu, value, _peak = bench.measure_cpu(spin_then_sleep)
    assert value == 7 and wall >= 0.5
    # the 0.2 s of work, not the 0.3 s asleep; the lower bound leaves 5 % for the two clocks'
    # granularity (the process's CPU time less the sampler thread's, read at different moments)
    assert 0.19 <= cpu < 0.45
