"""Smoke test of benchmarks/bench_flops.py: the counted arithmetic of a product on a two-layer
MLP against the counts worked out by hand."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_flops")


def test_counts_of_a_two_layer_mlp_match_the_hand_count(bench: ModuleType) -> None:
    """Linear(a, b) → tanh → Linear(b, c) on n rows; a matrix product of m×k by k×n counts 2mkn.
    forward 2n(ab + bc); gradient adds the weight gradients (2nab + 2nbc) and the hidden layer's
    input gradient (2nbc; the input's is not needed): 2n(2ab + 3bc). The second backward
    differentiates the first backward's three products (gW1 = δ1ᵀx in δ1 only: 2nab; δh = δ2W2 and
    gW2 = δ2ᵀh in both factors: 4 × 2nbc) and the forward (2nbc + 2nbc + 2nab): 2n(2ab + 6bc).
    Forward-over-reverse carries a tangent through every product with a dual factor, which is
    every factor but the input: 3 × the gradient exactly."""
    a, b, c = 6, 5, 3
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(a, b), nn.Tanh(), nn.Linear(b, c)).double()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(30, a, generator=generator, dtype=torch.float64)
    y = torch.randint(0, c, (30,), generator=generator)
    batches = [(x[:16], y[:16]), (x[16:], y[16:])]
    n = 30
    row = bench.measure(model, batches)
    flops = row["flops"]
    forward = 2 * n * (a * b + b * c)
    gradient = 2 * n * (2 * a * b + 3 * b * c)
    second = 2 * n * (2 * a * b + 6 * b * c)
    assert flops["forward"] == forward
    assert flops["gradient"] == gradient
    assert flops["second backward"] == second
    assert flops["double backward"] == gradient + second
    assert flops["curvcal rebuilt"] == gradient + second  # no arithmetic beyond the textbook's
    assert flops["curvcal kept"] == second
    assert flops["curvcal func"] == 3 * gradient
    assert row["per_gradient"]["gradient"] == 1.0
    assert row["n_params"] == a * b + b + b * c + c


def test_main_prints_the_table_and_writes_json(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "flops.json"
    report = bench.main(["--cases", "tiny", "--json", str(out)])
    (row,) = report["cases"]
    assert row["per_gradient"]["curvcal rebuilt"] == pytest.approx(30600 / 12600)
    assert json.loads(out.read_text())["cases"][0]["case"] == "tiny"
    assert (
        "| tiny | 53 | 0.000 | 0.43 | 2.43 | 1.43 | 2.43 | 3.00 | 1.43 |" in capsys.readouterr().out
    )


def test_lambda_runs_count_their_products(
    bench: ModuleType,
    load_bench: Callable[[str], ModuleType],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A whole λ1 run counts at least its products through kept graphs (the tiny case keeps them:
    1.43 gradients each) and less than each product rebuilt plus one more (2.43 each)."""
    report = bench.main(["--cases", "tiny", "--lambda-seeds", "0"])
    (row,) = report["cases"]
    curvcal = [run for run in row["lambda"] if run["run"].startswith("curvcal")]
    assert [run["run"] for run in curvcal] == ["curvcal tol 1e-4", "curvcal tol 1e-6"]
    second = row["flops"]["second backward"]
    rebuilt = row["flops"]["double backward"]
    case = load_bench("bench_hessian").build_case("tiny", quick=False, truth=False)
    values, _ = load_bench("bench_hessian").dense_reference(case.model, case.batches)
    for run in curvcal:
        assert run["lambda_max"] == pytest.approx(float(values.max()), rel=1e-4)
        assert run["products"] * second <= run["flops"] < (run["products"] + 1) * rebuilt
    assert curvcal[1]["products"] >= curvcal[0]["products"]
    assert "| tiny | 0 | curvcal tol 1e-6 | 0.745275 |" in capsys.readouterr().out
