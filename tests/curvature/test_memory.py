"""The memory budget: parsing, the pass it plans, and micro-batched products against whole ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvcal.curvature.memory import (
    GraphSize,
    GraphSizes,
    default_budget,
    free_memory,
    measure_graph,
    pass_bytes,
    plan_pass,
)
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.settings.sizes import MemoryBudget, parse_memory_budget

from .cases import BATCH, dense_hessian, make_data, make_mlp, split


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", MemoryBudget(bytes=4 * 2**30)),
        ("512MB", MemoryBudget(bytes=512 * 10**6)),
        ("1.5G", MemoryBudget(bytes=1_500_000_000)),
        ("2000000", MemoryBudget(bytes=2_000_000)),
        (" 64 kib ", MemoryBudget(bytes=65536)),
        ("50%", MemoryBudget(fraction=0.5)),
        ("100%", MemoryBudget(fraction=1.0)),
        (1024, MemoryBudget(bytes=1024)),
    ],
)
def test_budget_strings(text: str | int, expected: MemoryBudget) -> None:
    assert parse_memory_budget(text) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("lots", "cannot read"),
        ("", "cannot read"),
        ("-4GiB", "cannot read"),
        ("4 XB", "unknown unit"),
        ("0%", "a share must be in"),
        ("101%", "a share must be in"),
        ("0", "at least 1 byte"),
        ("0.5B", "at least 1 byte"),
        (0, "at least 1 byte"),
    ],
)
def test_bad_budget_strings(text: str | int, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        parse_memory_budget(text)


def test_a_share_resolves_against_the_free_memory() -> None:
    assert MemoryBudget(fraction=0.25).resolve(4000) == 1000
    assert MemoryBudget(fraction=0.25).resolve(None) is None
    assert MemoryBudget(bytes=7).resolve(None) == 7
    free = free_memory(torch.device("cpu"))
    assert free is None or free > 0


GRAPHS = GraphSizes(gradient=GraphSize(1000.0, 100.0), double=GraphSize(2000.0, 300.0))


def test_plan_fits_the_budget_and_takes_the_most_it_can() -> None:
    param_bytes = 400
    for budget in (3000, 9000, 20_000, 60_000, 10**6):
        for vmapped in (False, True):
            plan = plan_pass(
                GRAPHS, param_bytes=param_bytes, rows=64, width=8, budget=budget, vmapped=vmapped
            )
            assert plan.estimate <= budget or (plan.rows, plan.width, plan.fits) == (1, 1, False)
            assert plan.estimate == pytest.approx(
                pass_bytes(GRAPHS, param_bytes, plan.rows, plan.width, vmapped), abs=1
            )
            # one row more (when the batch had it) or one vector more would not fit
            if plan.rows < 64:
                assert pass_bytes(GRAPHS, param_bytes, plan.rows + 1, 1, vmapped) > budget
            if plan.width < 8 and plan.fits:
                assert pass_bytes(GRAPHS, param_bytes, plan.rows, plan.width + 1, vmapped) > budget
    # worked by hand: G(64) = 2000 + 300·64 = 21,200; + 400·(1 + 3m) ≤ 30,000 → m = 7
    plan = plan_pass(GRAPHS, param_bytes=400, rows=64, width=8, budget=30_000, vmapped=False)
    assert (plan.rows, plan.width, plan.fits) == (64, 7, True)
    # 2000 + 300·r + 1600 ≤ 10,000 → r = 21 rows (9,900), then 1 vector (a second costs 1,200)
    plan = plan_pass(GRAPHS, param_bytes=400, rows=64, width=8, budget=10_000, vmapped=False)
    assert (plan.rows, plan.width, plan.fits) == (21, 1, True)
    plan = plan_pass(GRAPHS, param_bytes=400, rows=64, width=8, budget=100, vmapped=False)
    assert (plan.rows, plan.width, plan.fits) == (1, 1, False)


def test_default_budget_is_half_the_free_memory_and_a_fixed_rule_only_without_it() -> None:
    big = GraphSizes(GraphSize(0.0, 2**30), GraphSize(0.0, 2**31))
    # half of what the device has free, whatever a gradient pass costs
    assert default_budget(big, 2**30, 4, 8 * 2**30) == 4 * 2**30
    assert default_budget(GRAPHS, 400, 64, 139 * 10**9) == 69_500_000_000
    # free memory unreadable: 2 × (1 GiB·4 rows + 1 GiB of gradient) = 10 GiB, at least 256 MiB
    assert default_budget(big, 2**30, 4, None) == 10 * 2**30
    assert default_budget(GRAPHS, 400, 64, None) == 256 * 2**20


def test_measured_graph_is_linear_in_rows_and_the_double_backward_holds_more() -> None:
    torch.manual_seed(0)
    model = make_mlp()
    x, y = make_data("mlp")
    params = list(model.parameters())

    def loss(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(xs), ys, reduction="sum")

    graphs = measure_graph(loss, params, x, y)
    assert graphs.gradient.per_row > 0
    assert graphs.double.per_row >= graphs.gradient.per_row
    assert graphs.double.at(8) > graphs.gradient.at(8)
    # the fit reproduces the 8-row count it was made from, and a 1-row batch gives per-row only
    one = measure_graph(loss, params, x[:1], y[:1])
    assert one.double.fixed == 0 and one.double.per_row > 0


@pytest.mark.parametrize("engine", ["autograd", "func"])
def test_micro_batched_products_equal_whole_batch_products(engine: str) -> None:
    torch.manual_seed(0)
    model = make_mlp()
    x, y = make_data("mlp")
    whole = HessianOperator(model, split(x, y, BATCH), hvp=engine, probe_batch=4)
    assert whole.memory_graphs is not None
    param_bytes = whole.shape[0] * 8
    # room for chunks of 3 rows and one vector: batches of 7 go in chunks of 3, 3 and 1
    budget = int(pass_bytes(whole.memory_graphs, param_bytes, 3, 1, engine == "func")) + 1
    small = HessianOperator(
        model, split(x, y, BATCH), hvp=engine, probe_batch=4, memory_budget=budget
    )
    assert whole.micro_batch is None and whole.probe_batch == 4
    assert small.micro_batch == 3 and small.probe_batch == 1
    assert small.memory_plan is not None and small.memory_plan.estimate <= budget
    vectors = torch.randn(whole.shape[0], 5, dtype=torch.float64)
    expected = dense_hessian(model, x, y) @ vectors
    assert torch.allclose(small.matmat(vectors), whole.matmat(vectors), rtol=0, atol=1e-10)
    assert torch.allclose(small.matmat(vectors), expected, rtol=0, atol=1e-10)


def test_a_tiny_budget_leaves_one_vector_and_one_row_per_pass() -> None:
    torch.manual_seed(0)
    model = make_mlp()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH), probe_batch=8, memory_budget="1B")
    assert operator.probe_batch == 1 and operator.micro_batch == 1
    assert operator.memory_plan is not None and not operator.memory_plan.fits
    vectors = torch.randn(operator.shape[0], 2, dtype=torch.float64)
    expected = dense_hessian(model, x, y) @ vectors
    assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
