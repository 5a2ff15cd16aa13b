"""Smoke test of benchmarks/bench_half_accuracy.py: one seed of the MLP, the table's rows."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_half_accuracy")


def test_mlp_rows_and_table(bench: ModuleType, capsys) -> None:
    rows = bench.main(["--only", "mlp", "--seeds", "1"])
    assert [(row["steps"], row["lr"]) for row in rows] == list(bench.RECIPES)
    for row in rows:
        assert row["bound"] == 8 and row["held"] and 0 <= row["worst"] <= row["bound"]
    assert "| mlp | 0 | 8 |" in capsys.readouterr().out


def test_transformers_count_their_normalisers(bench: ModuleType) -> None:
    from curvcal.curvature.precision import normalisers

    assert normalisers(bench.ARCHITECTURES["transformer-2"][0]()) == 7
    assert normalisers(bench.ARCHITECTURES["transformer-1"][0]()) == 4
    assert normalisers(bench.ARCHITECTURES["mlp+layernorm"][0]()) == 2
    result = bench.measure("mlp", 0, 5, 0.01, torch.float16)
    assert result["normalisers"] == 0 and result["error"] < result["bound"]
