"""Smoke test of benchmarks/bench_krylov.py: small sizes, both methods checked against each other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_krylov")


def test_rows_json_and_table(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "krylov.json"
    report = bench.main(
        ["--size", "5000", "--vectors", "3,9", "--repeats", "2", "--json", str(out)]
    )
    assert [row["vectors"] for row in report["rows"]] == [3, 9]
    for row in report["rows"]:
        assert row["block_s"] > 0 and row["vector_by_vector_s"] > 0
        assert row["ratio"] == pytest.approx(row["block_s"] / row["vector_by_vector_s"])
        assert row["float32_rows_ratio"] == pytest.approx(row["float32_rows_s"] / row["block_s"])
        assert 0.0 < row["float32_rows_difference"] < 1e-3
        assert row["relative_difference"] < 1e-10
    assert out.exists() and "| 9 |" in capsys.readouterr().out


def test_the_baseline_is_gram_schmidt(bench: ModuleType) -> None:
    """The baseline against a dense projection: v − QQᵀv and Qᵀv."""
    generator = torch.Generator().manual_seed(1)
    columns = torch.linalg.qr(torch.randn(50, 6, dtype=torch.float64, generator=generator)).Q
    vector = torch.randn(50, dtype=torch.float64, generator=generator)
    remainder, coefficients = bench.vector_by_vector(vector, list(columns.t()))
    assert torch.allclose(remainder, vector - columns @ (columns.t() @ vector), atol=1e-13)
    assert torch.allclose(coefficients, columns.t() @ vector, atol=1e-13)


def test_bad_options_are_refused(bench: ModuleType) -> None:
    for argv in (["--size", "2"], ["--vectors", "1"], ["--size", "10", "--vectors", "10"]):
        with pytest.raises(SystemExit):
            bench.main(argv)
