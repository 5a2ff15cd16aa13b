"""Smoke test of benchmarks/bench_central_steps.py: one model's row in float32 and float64, its
products compared with exact double backward, the passes a product and λmax's error."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_row_of_the_tanh_mlp(load_bench, dtype: str) -> None:  # type: ignore[no-untyped-def]
    import torch

    bench = load_bench("bench_central_steps")
    row = bench.measure("tanh-mlp", getattr(torch, dtype), gaussian=3)
    assert row["model"] == "tanh-mlp" and row["dtype"] == dtype
    assert row["lanczos"] > 3 and row["products"] == row["lanczos"] + 3
    assert row["within_bound"] == row["lanczos"]  # every eigenvalue-stage product within b‖H‖‖v‖
    assert row["worst_over_bound"] <= 1.0
    assert row["within_own"] == 3  # every Gaussian product within its own b‖Hv‖
    assert row["predicted_over_own"] == 0
    assert 2.0 <= row["passes_per_product"] < 3.0  # mostly three points, the start included
    assert row["gaussian_passes_per_product"] >= 2.0
    assert row["lambda_max_error"] < 1e-4
    assert sum(row["rules"].values()) == row["products"]
    assert bench.seconds("tanh-mlp", getattr(torch, dtype)) > 0


def test_the_command_prints_its_table(load_bench, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The README's command, on one model: the header and a row per dtype."""
    bench = load_bench("bench_central_steps")
    arguments = [
        "bench_central_steps.py",
        "--gaussian",
        "2",
        "--repeats",
        "1",
        "--models",
        "tanh-mlp",
    ]
    monkeypatch.setattr("sys.argv", arguments)
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| model | dtype | eigenvalue products within b‖H‖‖v‖")
    assert [line.split(" | ")[1] for line in lines[2:]] == ["float32", "float64"]
