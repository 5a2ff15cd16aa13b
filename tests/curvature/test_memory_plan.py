"""The memory plan by default: a share of the device's free memory and the cost per sample
measured on the first batch, never a fixed multiple of a gradient pass; batches are split only
where a pass over a whole one does not fit, and the plan says what it chose and why.

The 1B row of the scale guide (docs/guide/scale.md: Llama-3.2-1B's shape with a two-class
head, bfloat16 weights, micro-batches of 4 sequences of 512 tokens, 16 of them per product) is
planned on simulated devices of 8, 24, 80 and 139 GB; the same planner then runs on the CPU
with a real operator and simulated free memory, its products checked against the dense Hessian.
"""

from __future__ import annotations

import pytest
import torch

from curvcal.curvature import operator as operator_module
from curvcal.curvature.memory import (
    GraphSize,
    GraphSizes,
    default_budget,
    free_memory,
    measure_graph,
)
from curvcal.curvature.memory_fit import fit_memory
from curvcal.curvature.operator import HessianOperator
from curvcal.settings.sizes import MemoryBudget

from .cases import dense_hessian, make_data, make_mlp, split

# -- the 1B configuration, from its shape (the guide's assumptions, counted here) -----------------
HIDDEN, LAYERS, FEED_FORWARD, HEADS, KV_HEADS, VOCAB, CLASSES = 2048, 16, 8192, 32, 8, 128_256, 2
TOKENS, SEQUENCES_PER_BATCH, BATCHES = 512, 4, 16


def _one_b_parameters() -> int:
    """Token embedding, per layer q, k, v, o, gate, up, down and two norms, the final norm and
    the score head: 1.236·10⁹."""
    d, kv = HIDDEN, KV_HEADS * HIDDEN // HEADS
    layer = 2 * d * d + 2 * d * kv + 3 * d * FEED_FORWARD + 2 * d
    return VOCAB * d + LAYERS * layer + d + d * CLASSES


def _one_b_gradient_bytes_per_sequence() -> float:
    """A bfloat16 gradient pass saves (34·d + 5·a·T) bytes a token and layer (Korthikanti et
    al. 2022, the T×T scores materialised): 1.24 GB a sequence of 512 tokens."""
    return LAYERS * (34 * HIDDEN + 5 * HEADS * TOKENS) * TOKENS


P = _one_b_parameters()
GRADIENT_PER_SEQUENCE = _one_b_gradient_bytes_per_sequence()
#: a double backward saves about twice a gradient pass (the guide's assumption)
ONE_B = GraphSizes(
    gradient=GraphSize(0.0, GRADIENT_PER_SEQUENCE), double=GraphSize(0.0, 2 * GRADIENT_PER_SEQUENCE)
)
VECTOR_BYTES = 4 * P  # the vectors of a bfloat16 model are float32
WEIGHTS = 2 * P  # resident before the plan is made: not free


def test_the_1b_shape_is_the_guides() -> None:
    assert pytest.approx(1.236e9, rel=1e-3) == P
    # the guide's "activations" column: a double backward over one micro-batch, 9.9 GB
    assert ONE_B.double.at(SEQUENCES_PER_BATCH) / 1e9 == pytest.approx(9.9, abs=0.05)


@pytest.mark.parametrize("capacity_gb", [8, 24, 80, 139])
def test_the_1b_product_is_chunked_only_where_a_whole_micro_batch_does_not_fit(
    capacity_gb: int,
) -> None:
    free = capacity_gb * 10**9 - WEIGHTS
    fit = fit_memory(
        ONE_B,
        param_bytes=VECTOR_BYTES,
        batch_sizes=[SEQUENCES_PER_BATCH] * BATCHES,
        rows=SEQUENCES_PER_BATCH,
        width=1,
        requested=None,
        free=free,
        vmapped=False,
        sharded=False,
        keep_graphs="never",
        input_row_bytes=0.0,
        device=torch.device("cuda"),
    )
    # by hand: a one-vector pass over 4 sequences holds their double-backward graph (9.9 GB),
    # the gradient and, for the vector, its tangent, batch product and running total: 4 × 4P
    whole_pass = 2 * GRADIENT_PER_SEQUENCE * SEQUENCES_PER_BATCH + VECTOR_BYTES * (1 + 3)
    assert whole_pass / 1e9 == pytest.approx(29.7, abs=0.1)
    fits = whole_pass <= free / 2  # the default budget: half the free memory
    assert fits is (capacity_gb >= 80)
    choice = fit.choice
    assert choice is not None
    assert choice.budget_bytes == free // 2
    assert "50% of the" in choice.budget_source and "mem_get_info" in choice.budget_source
    assert choice.sample_bytes == 2 * GRADIENT_PER_SEQUENCE
    if fits:
        assert fit.limit is None and not choice.micro_batched
        assert choice.pass_rows == SEQUENCES_PER_BATCH and "fits the budget" in choice.rows_why
    else:
        # 8 and 24 GB: the vectors alone (4 × 4.9 GB) are more than half of what is free
        assert free / 2 < VECTOR_BYTES * 4
        assert fit.limit == 1 and choice.micro_batched and not fit.plan.fits
        assert "not even one row fits" in choice.rows_why
    # the former default, twice a gradient pass over the micro-batch, split it on every device
    former = 2 * (GRADIENT_PER_SEQUENCE * SEQUENCES_PER_BATCH + VECTOR_BYTES)
    assert former < whole_pass


def test_without_a_free_memory_reading_the_fixed_rule_stands_in_and_says_so() -> None:
    fit = fit_memory(
        ONE_B,
        param_bytes=VECTOR_BYTES,
        batch_sizes=[SEQUENCES_PER_BATCH],
        rows=SEQUENCES_PER_BATCH,
        width=1,
        requested=None,
        free=None,
        vmapped=False,
        sharded=False,
        keep_graphs="never",
        input_row_bytes=0.0,
    )
    assert fit.choice is not None
    assert fit.plan.budget == default_budget(ONE_B, VECTOR_BYTES, SEQUENCES_PER_BATCH, None)
    assert "unreadable" in fit.choice.budget_source
    assert fit.choice.micro_batched  # 2 × a gradient pass does not hold a product's pass


# -- the same planner on the CPU, with a real operator --------------------------------------------


def _single_batch_case() -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = make_mlp()
    x, y = make_data("mlp")
    return model, split(x, y, int(y.shape[0]))  # one batch of every sample


def test_the_cpu_default_budget_is_half_the_available_memory() -> None:
    model, batches = _single_batch_case()
    operator = HessianOperator(model, batches)
    choice = operator.memory_choice
    assert choice is not None
    free = free_memory(torch.device("cpu"))
    assert free is not None  # Linux: MemAvailable of /proc/meminfo
    # read again here: the host's available memory moves a little between two readings
    assert choice.budget_bytes == pytest.approx(free / 2, rel=0.1)
    assert "MemAvailable" in choice.budget_source
    assert not choice.micro_batched and operator.micro_batch is None
    assert choice.graphs == "kept" and operator.graphs_kept


def test_the_cpu_plan_splits_only_what_does_not_fit_and_keeps_graphs_that_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, batches = _single_batch_case()
    n_samples = int(batches[0][1].shape[0])
    roomy = HessianOperator(model, batches, keep_graphs="never")
    graphs = roomy.memory_graphs
    assert graphs is not None and roomy.memory_choice is not None
    param_bytes = roomy.shape[0] * 8
    # a device whose half holds a one-vector pass over 20 rows, not over the whole batch
    half = graphs.double.at(20) + param_bytes * 4
    assert graphs.double.at(n_samples) + param_bytes * 4 > half
    monkeypatch.setattr(operator_module, "free_memory", lambda _device: int(2 * half))
    tight = HessianOperator(model, batches, keep_graphs="never")
    assert tight.micro_batch == 20 and tight.memory_choice is not None
    assert tight.memory_choice.micro_batched and "chunks of 20 rows" in tight.memory_choice.rows_why
    assert roomy.micro_batch is None and not roomy.memory_choice.micro_batched
    assert tight.memory_choice.graphs == "rebuilt"
    assert tight.memory_choice.graphs_why == "keep_graphs never"
    # kept graphs by the same measured memory: with the whole device, every graph is kept
    monkeypatch.setattr(operator_module, "free_memory", lambda _device: 2**34)
    kept = HessianOperator(model, batches)
    assert kept.graphs_kept and kept.memory_choice is not None
    assert kept.memory_choice.graphs == "kept" and f"all {n_samples} samples" in (
        kept.memory_choice.graphs_why
    )
    # every plan multiplies by the same Hessian
    vectors = torch.randn(roomy.shape[0], 3, generator=torch.Generator().manual_seed(1)).double()
    x, y = batches[0]
    expected = dense_hessian(model, x, y) @ vectors
    for operator in (roomy, tight, kept):
        assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)


def test_graphs_that_cannot_be_kept_say_why() -> None:
    model, batches = _single_batch_case()
    choice = HessianOperator(model, batches, hvp="func").memory_choice
    assert choice is not None and choice.graphs == "rebuilt"
    assert choice.graphs_why.startswith("hvp func")


def _saved_by_a_gradient_pass(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the distinct tensors a plain gradient pass saves (inputs and parameters left
    out), counted by a pass of its own: the reference the one-pass measurement must equal."""
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded.add(x.untyped_storage().data_ptr())
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.untyped_storage().data_ptr() not in excluded and key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        torch.autograd.grad(loss, list(model.parameters()))
    return total


def test_one_double_backward_measures_the_gradient_pass_too() -> None:
    torch.manual_seed(0)
    model = make_mlp()
    x, y = make_data("mlp")

    def loss(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(xs), ys, reduction="sum")

    graphs = measure_graph(loss, list(model.parameters()), x, y)
    for rows in (4, 8):
        assert graphs.gradient.at(rows) == pytest.approx(
            _saved_by_a_gradient_pass(model, x[:rows], y[:rows]), abs=1e-6
        )
    assert graphs.double.per_row > graphs.gradient.per_row


def test_cuda_free_memory_counts_the_allocators_unused_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What torch's caching allocator holds but does not use is free to this process, though
    the driver counts it as taken: 1,000 free + (300 reserved − 100 allocated) = 1,200."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _device: (1_000, 5_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda _device: 300)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda _device: 100)
    assert free_memory(torch.device("cuda")) == 1_200


@pytest.mark.parametrize("sharded", [False, True])
def test_graphs_that_do_not_fit_a_given_budget_are_rebuilt_and_the_plan_says_why(
    sharded: bool,
) -> None:
    # by hand: a pass over 10 rows holds 300·10 + 400·(1 + 3) = 4,600 bytes, within 5,000; the
    # first chunk's kept graph (400 + 3,000) with a product through it (3,000 + 400·3) needs
    # 7,600, beyond it
    graphs = GraphSizes(gradient=GraphSize(0.0, 100.0), double=GraphSize(0.0, 300.0))
    fit = fit_memory(
        graphs,
        param_bytes=400,
        batch_sizes=[10] * 4,
        rows=10,
        width=1,
        requested=MemoryBudget(bytes=5_000),
        free=None,
        vmapped=False,
        sharded=sharded,
        keep_graphs="auto",
        input_row_bytes=0.0,
    )
    choice = fit.choice
    assert choice is not None and not fit.keep and fit.limit is None
    assert (
        choice.budget_bytes == 5_000 and choice.budget_source == "memory_budget 4.88 KiB, as given"
    )
    assert choice.graphs == "rebuilt" and choice.kept_bytes is None
    assert fit.kept_need == 400 + 4 * 3_000 + 3_000 + 400 * 3
    reason = "all or none" if sharded else "not even the first chunk's"
    assert reason in choice.graphs_why and "of all 40 samples" in choice.graphs_why
