"""benchmarks/bench_block_lanczos.py: its block Lanczos against dense float64 eigenvalues (a
matrix of known spectrum, a small MLP's Hessian formed entry by entry), its border cases (a
block as wide as the space, a repeated top eigenvalue, a product budget), bad block sizes, and
the script's smoke run."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import curvcal
from curvcal.curvature.eigen import lanczos


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("timm")  # bench_warm_start's model, imported by the script
    return load_bench("bench_block_lanczos")


def known_spectrum(values: list[float], seed: int = 0) -> torch.Tensor:
    """V diag(values) Vᵀ in float64, V Haar-random orthogonal."""
    generator = torch.Generator().manual_seed(seed)
    n = len(values)
    rotation, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return (rotation * torch.tensor(values, dtype=torch.float64)) @ rotation.T


@pytest.mark.parametrize("block", [1, 2, 3, 8])
def test_lambda_max_of_a_known_spectrum(bench: ModuleType, block: int) -> None:
    # λmax = 5 stands apart from a bulk in [−1, 2] (an indefinite matrix, as Hessians are)
    values = [5.0, *torch.linspace(-1.0, 2.0, 119).tolist()]
    found = bench.block_lanczos(known_spectrum(values), block, tol=1e-6, seed=3)
    assert found.converged and found.stopped_by == "tol"
    # a residual ≤ 1e-6 relative leaves the value within residual² / gap of λmax
    assert found.value == pytest.approx(5.0, rel=1e-9)
    assert found.residual <= 1e-6
    # b products a block step (the space is not exhausted) and one a verification
    assert found.products == block * found.block_steps + found.verifications
    assert found.verifications >= 1 and found.basis_size == block * found.block_steps


def test_lambda_max_of_an_mlp_hessian_formed_entry_by_entry(bench: ModuleType) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x = torch.randn(40, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (40,))
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    flat = torch.cat([p.detach().reshape(-1) for p in params])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        pieces, at = [], 0
        for shape in shapes:
            count = math.prod(shape)
            pieces.append(theta[at : at + count].reshape(shape))
            at += count
        names = [name for name, _ in model.named_parameters()]
        logits = torch.func.functional_call(model, dict(zip(names, pieces, strict=True)), (x,))
        return nn.functional.cross_entropy(logits, y)

    dense = torch.autograd.functional.hessian(loss, flat)
    exact = float(torch.linalg.eigvalsh((dense + dense.T) / 2)[-1])
    operator = curvcal.hessian_operator(model, [(x, y)])
    for block in (1, 4):
        found = bench.block_lanczos(operator, block, tol=1e-8, seed=0)
        assert found.converged
        assert found.value == pytest.approx(exact, rel=1e-10)


@pytest.mark.parametrize("block", [12, 15])
def test_a_block_as_wide_as_the_space_is_exact_in_one_step(bench: ModuleType, block: int) -> None:
    values = torch.linspace(-3.0, 7.0, 12).tolist()
    found = bench.block_lanczos(known_spectrum(values, seed=1), block, tol=1e-4)
    # the first block spans R^12: its Rayleigh–Ritz step is the eigendecomposition
    assert (found.block_steps, found.basis_size, found.products) == (1, 12, 13)
    assert found.stopped_by == "tol" and found.change == 0.0
    assert found.value == pytest.approx(7.0, rel=1e-13) and found.residual < 1e-12


def test_the_last_block_is_cut_to_what_the_space_has_left(bench: ModuleType) -> None:
    values = torch.linspace(-3.0, 7.0, 10).tolist()
    found = bench.block_lanczos(known_spectrum(values, seed=2), 4, tol=1e-12)
    # 4 + 4 + 2 columns span R^10; λmax is then exact, whatever the tol
    assert found.basis_size <= 10 and found.products <= 4 + 4 + 2 + found.verifications
    assert found.value == pytest.approx(7.0, rel=1e-12)


def test_a_repeated_top_eigenvalue(bench: ModuleType) -> None:
    values = [2.0, 2.0, 2.0, *torch.linspace(0.0, 1.8, 197).tolist()]
    matrix = known_spectrum(values, seed=4)
    for block in (1, 2, 4):
        found = bench.block_lanczos(matrix, block, tol=1e-6, seed=0)
        assert found.converged and found.value == pytest.approx(2.0, rel=1e-9)
    # b = 1 is Lanczos with full reorthogonalisation: the products curvcal's own run counts
    # (float64 products; a step either side allowed for rounding in the stopping tests)
    single = bench.block_lanczos(matrix, 1, tol=1e-6, seed=0)
    reference = lanczos(matrix, 1, tol=1e-6, seed=0, reorthogonalisation="full")
    assert abs(single.products - reference.matvecs) <= 1


def test_a_product_budget_stops_the_run_with_what_it_reached(bench: ModuleType) -> None:
    values = [1.0, 0.999, 0.998, *torch.linspace(0.0, 0.9, 197).tolist()]
    found = bench.block_lanczos(known_spectrum(values, seed=5), 4, tol=1e-8, max_products=13)
    assert found.products <= 13 and found.block_steps == 3
    assert not found.converged and found.stopped_by == "max_products"
    # a Ritz value lies inside the spectrum (interlacing), its measured residual above tol
    assert 1e-8 < found.residual < math.inf and 0.0 < found.value <= 1.0 + 1e-12


@pytest.mark.parametrize("block", [0, -2, 2.0, True, "4"])
def test_bad_block_sizes_are_refused(bench: ModuleType, block: object) -> None:
    with pytest.raises(ValueError, match="block size must be an integer ≥ 1"):
        bench.block_lanczos(torch.eye(4, dtype=torch.float64), block)


def test_bad_budgets_and_tolerances_are_refused(bench: ModuleType) -> None:
    matrix = torch.eye(6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"max_products: must be ≥ block \+ 1 = 3"):
        bench.block_lanczos(matrix, 2, max_products=2)
    for tol in (0.0, -1e-4, math.nan):
        with pytest.raises(ValueError, match="tol"):
            bench.block_lanczos(matrix, 2, tol=tol)


def test_per_vector_costs_time_matmat_against_matvecs(bench: ModuleType) -> None:
    operator = curvcal.curvature.operators.DenseOperator(known_spectrum([1.0] * 30))
    costs = bench.per_vector_costs(operator, (1, 2, 4), repeats=2)
    assert list(costs) == [1, 2, 4]
    for cells in costs.values():
        assert cells["matmat_s"] > 0 and cells["matvecs_s"] > 0
        assert cells["per_vector"] == cells["matmat_s"] / cells["matvecs_s"]
    # warm-up (1 + 4 columns), then per repeat 1 + 2 + 4 columns by matmat and again by matvec
    assert operator.n_matvecs == 5 + 2 * 2 * 7


def test_smoke_rows_json_table_and_merge(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "block.json"
    report = bench.main(["--smoke", "--json", str(out)])
    rows = report["rows"]
    keys = {(r["case"], r["tol"], r["strategy"]) for r in rows}
    assert keys == {
        (case, tol, strategy)
        for case in ("vit", "repeated", "cluster")
        for tol in (1e-3, 1e-4)
        for strategy in ("single", "block 2", "block 4")
    }
    for row in rows:
        assert row["converged"] and row["agrees"]
        single = next(
            r["products"] for r in rows
            if (r["case"], r["tol"], r["block"]) == (row["case"], row["tol"], 1)
        )  # fmt: skip
        assert row["break_even"] == pytest.approx(single / row["products"])
        if row["case"] == "vit":  # units = products × the measured per-vector cost
            assert set(row["units"]) == {"default", "rebuilt", "func"}
            for variant, units in row["units"].items():
                costs = report["costs"][variant]
                factor = 1.0 if row["block"] == 1 else costs[row["block"]]["per_vector"]
                assert units == pytest.approx(row["products"] * factor)
        else:
            assert row["units"] == {}
    for run in report["runs"]:
        if run["block"] > 1:
            assert run["products"] == run["block"] * run["block_steps"] + run["verifications"]
    assert report["operators"]["rebuilt"]["graphs_kept"] is False
    assert report["operators"]["func"]["engine"] == "func"
    table = capsys.readouterr().out
    assert "| vit | 0.0001 | block 4 |" in table and "| default (autograd, graphs " in table
    # the report read back and merged gives the same rows
    merged = bench.main(["--merge", str(out), "--smoke"])
    assert merged["rows"] == json.loads(out.read_text())["rows"]


def test_bad_options_are_refused(bench: ModuleType) -> None:
    for argv in (["--max-block", "3"], ["--parts", "timings"], ["--seeds", "0"],
                 ["--repeats", "0"], ["--samples", "1"], ["--dense-size", "10"]):  # fmt: skip
        with pytest.raises(SystemExit):
            bench.main(argv)
