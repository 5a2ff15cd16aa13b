"""Products through kept gradient graphs against dense float64 Hessians (torch.func.hessian)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature import hessian_eigenvalues
from curvcal.curvature import operator as operator_module
from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.kept import (
    chunk_rows,
    kept_bytes,
    kept_pass_bytes,
    kept_prefix,
)
from curvcal.curvature.memory import GraphSize, GraphSizes, pass_bytes
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError

from .cases import BATCH, dense_hessian, make_cnn, make_data, make_mlp, split

Case = tuple[nn.Module, Tensor, Tensor, Tensor]


def _vectors(n: int, m: int, seed: int = 5) -> Tensor:
    return torch.randn(n, m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("case", ["mlp_case", "cnn_case"])
def test_kept_products_equal_dense_hessian_and_read_the_data_once(
    case: str, request: pytest.FixtureRequest
) -> None:
    model, x, y, hessian = request.getfixturevalue(case)
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always", probe_batch=3)
    assert operator.graphs_kept
    vectors = _vectors(hessian.shape[0], 5)
    for _ in range(2):  # the second round runs through the graph the first one built
        assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert operator.n_matvecs == 10
    assert operator.n_data_passes == 1  # built once: 8 batches of the 50 samples, one pass
    assert operator.engine == "autograd"


def test_auto_keeps_what_fits_and_rebuilds_what_does_not(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    roomy = HessianOperator(model, split(x, y, BATCH))
    assert roomy.graphs_kept and roomy.kept_estimate is not None
    assert roomy.memory_graphs is not None and roomy.memory_plan is not None
    param_bytes = roomy.shape[0] * 8
    chunks = chunk_rows([BATCH] * 7 + [1], None)
    held = kept_bytes(roomy.memory_graphs, param_bytes, chunks, 0.0)
    assert roomy.kept_estimate == pytest.approx(held, abs=1)
    assert roomy.kept_rows == 50
    # below one chunk's graph, the summed gradient and a one-vector product: nothing kept
    graphs = roomy.memory_graphs
    least = param_bytes + graphs.double.at(BATCH) + kept_pass_bytes(graphs, param_bytes, BATCH, 1)
    tight = HessianOperator(model, split(x, y, BATCH), memory_budget=int(least) - 1)
    assert not tight.graphs_kept and tight.kept_rows is None
    exact = HessianOperator(
        model,
        split(x, y, BATCH),
        memory_budget=int(held + kept_pass_bytes(graphs, param_bytes, BATCH, 1)) + 1,
    )
    assert exact.graphs_kept and exact.probe_batch == 1  # room for the graphs and one vector
    vectors = _vectors(75, 3)
    for operator in (tight, exact, tight, exact):
        assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    # rebuilt: a pass per probe_batch vectors, twice; kept: the graphs built once
    assert tight.n_data_passes == 2 * math.ceil(3 / tight.probe_batch)
    assert exact.n_data_passes == 1


def test_auto_keeps_the_leading_chunks_that_fit_and_rebuilds_the_others(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    roomy = HessianOperator(model, split(x, y, BATCH))
    graphs = roomy.memory_graphs
    assert graphs is not None
    param_bytes = roomy.shape[0] * 8
    # room for the summed gradient and three chunks' graphs beside either kind of product
    three = param_bytes + 3 * graphs.double.at(BATCH)
    room = three + max(
        kept_pass_bytes(graphs, param_bytes, BATCH, 1),
        pass_bytes(graphs, param_bytes, BATCH, 1, False),
    )
    operator = HessianOperator(model, split(x, y, BATCH), memory_budget=int(room) + 1)
    assert operator.graphs_kept and operator.kept_rows == 3 * BATCH
    vectors = _vectors(75, 3)
    for round_ in range(1, 3):  # the second round runs through the graphs the first one built
        assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
        # the graphs once, then one pass over the other chunks per pass of products
        assert operator.n_data_passes == 1 + round_ * math.ceil(3 / operator.probe_batch)
    assert operator.engine == "autograd"
    spectrum = hessian_eigenvalues(model, split(x, y, BATCH), tol=1e-8, memory_budget=int(room) + 1)
    assert spectrum.eigenvalues[0] == pytest.approx(
        float(torch.linalg.eigvalsh(hessian)[-1]), rel=1e-8
    )


def test_the_kept_prefix_is_the_most_chunks_then_the_most_vectors() -> None:
    graphs = GraphSizes(GraphSize(100.0, 10.0), GraphSize(1000.0, 50.0))
    chunks = [4, 4, 4, 2]
    per_chunk = 1000.0 + 50.0 * 4  # the double-backward graph of 4 rows
    rebuilt = per_chunk + 400 * (1 + 3 * 1)  # a one-vector pass over 4 rows
    through = per_chunk + 400 * (1 + 2 * 1)  # a one-vector product through kept graphs

    def prefix(budget: float, partial: bool = True) -> tuple[int, int]:
        return kept_prefix(
            graphs,
            param_bytes=400,
            chunks=chunks,
            input_row_bytes=0.0,
            width=2,
            budget=budget,
            partial=partial,
        )

    one = 400 + per_chunk + max(rebuilt, through)
    assert prefix(one - 1) == (0, 0)
    assert prefix(one) == (1, 1)
    assert prefix(one + per_chunk) == (2, 1)
    # the last 2-row chunk rebuilt costs less than a 4-row one: three chunks kept at the
    # same price per chunk, then all four with the product through them alone
    assert prefix(one + 2 * per_chunk) == (3, 1)
    everything = kept_bytes(graphs, 400, chunks, 0.0) + through
    assert prefix(everything) == (4, 1)
    assert prefix(everything + 800) == (4, 2)  # a second vector: 2·P·s more
    # all or nothing when partial keeping is off
    assert prefix(one + 2 * per_chunk, partial=False) == (0, 0)
    assert prefix(everything, partial=False) == (4, 1)
    assert kept_prefix(
        graphs, param_bytes=400, chunks=[], input_row_bytes=0.0, width=2, budget=1e9
    ) == (0, 0)


def test_never_and_func_rebuild_every_product(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    vectors = _vectors(75, 2)
    for keep, engine in (("never", "auto"), ("auto", "func"), ("always", "func")):
        operator = HessianOperator(model, split(x, y, BATCH), keep_graphs=keep, hvp=engine)
        assert not operator.graphs_kept
        for _ in range(2):
            assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
        assert operator.n_data_passes == 2


def test_a_changed_parameter_rebuilds_the_graph() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")
    vectors = _vectors(75, 2)
    operator.matmat(vectors)
    with torch.no_grad():
        model[0].weight.mul_(1.5)  # an in-place change, as an optimiser step makes
    expected = dense_hessian(model, x, y) @ vectors
    assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
    assert operator.n_data_passes == 2


def test_a_changed_running_statistic_rebuilds_the_graph_in_eval_mode() -> None:
    model = make_cnn()
    x, y = make_data("cnn")
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")
    vectors = _vectors(operator.shape[0], 1)
    operator.matmat(vectors)
    with torch.no_grad():
        model.norm.running_var.mul_(3.0)
    expected = dense_hessian(model, x, y) @ vectors
    assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
    assert operator.n_data_passes == 2


def test_train_mode_rebuilds_the_graphs() -> None:
    """BatchNorm's train-mode graph saves the running statistics, which the operator restores
    in place after every product: a kept graph would be stale, so train mode never keeps."""
    model = make_cnn()
    x, y = make_data("cnn")
    before = [b.clone() for b in model.buffers()]
    operator = HessianOperator(model, split(x, y, BATCH), mode="train", keep_graphs="always")
    assert not operator.graphs_kept
    vectors = _vectors(operator.shape[0], 2)
    first = operator.matmat(vectors)
    assert torch.equal(operator.matmat(vectors), first)
    assert operator.n_data_passes == 2
    assert all(torch.equal(b, a) for b, a in zip(model.buffers(), before, strict=True))


def test_blocks_share_the_kept_graph(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")
    operator.matmat(_vectors(75, 1))
    block = operator.restrict(["0.*"])  # the first layer: 48 parameters
    assert block.graphs_kept
    vectors = _vectors(48, 3)
    assert torch.allclose(block.matmat(vectors), hessian[:48, :48] @ vectors, rtol=0, atol=1e-10)
    assert operator.total_data_passes == 1


def test_a_block_outside_the_kept_parameters_rebuilds(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), params=["2.*"], keep_graphs="always")
    other = operator.restrict(["0.bias"])
    assert operator.graphs_kept and not other.graphs_kept
    vectors = _vectors(8, 2)
    assert torch.allclose(
        other.matmat(vectors), hessian[40:48, 40:48] @ vectors, rtol=0, atol=1e-10
    )


def test_parameters_the_loss_ignores_get_zero_products() -> None:
    """Border: a parameter outside the graph (unused by the forward) has no gradient piece."""

    class WithSpare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(5, 3)
            self.spare = nn.Parameter(torch.ones(2))

        def forward(self, inputs: Tensor) -> Tensor:
            return self.linear(inputs)

    torch.manual_seed(0)
    model = WithSpare().double()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")
    vectors = _vectors(20, 2)
    result = operator.matmat(vectors)
    dense = dense_hessian(model, x, y, names=["linear.weight", "linear.bias"])
    # own parameters come first in named_parameters(): spare (2 values), then the linear layer
    assert torch.equal(result[:2], torch.zeros(2, 2, dtype=torch.float64))
    assert torch.allclose(result[2:], dense @ vectors[2:], rtol=0, atol=1e-10)


def test_out_of_memory_drops_the_kept_graph_and_goes_on(
    mlp_case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")

    def exhausted(*_args: object) -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(operator_module, "kept_hvp", exhausted)
    vectors = _vectors(75, 2)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert not operator.graphs_kept
    assert operator.graphs_dropped is not None and "out of memory" in operator.graphs_dropped


def test_out_of_memory_beside_partly_kept_graphs_drops_them_and_redoes_the_product(
    mlp_case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x, y, hessian = mlp_case
    need = HessianOperator(model, split(x, y, BATCH)).kept_need
    assert need is not None
    operator = HessianOperator(model, split(x, y, BATCH), memory_budget=need - 1)
    assert operator.kept_rows == 7 * BATCH  # the last, one-row chunk rebuilt per product
    rebuilt = operator._batch_hvp_autograd
    calls = [0]

    def once_exhausted(*args: Any) -> tuple[Tensor, ...]:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return rebuilt(*args)

    monkeypatch.setattr(operator, "_batch_hvp_autograd", once_exhausted)
    vectors = _vectors(75, 2)
    for _ in range(2):
        assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert not operator.graphs_kept and operator.kept_rows is None
    assert operator.graphs_dropped is not None and "beside the kept" in operator.graphs_dropped
    # the failed chunk, then every chunk of both products, a pass per probe_batch vectors
    assert calls[0] == 1 + 2 * 8 * math.ceil(2 / operator.probe_batch)


def test_other_errors_are_not_swallowed(mlp_case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, y, _ = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")

    def broken(*_args: object) -> None:
        raise RuntimeError("illegal memory access")

    monkeypatch.setattr(operator_module, "kept_hvp", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        operator.matvec(_vectors(75, 1)[:, 0])


def test_unknown_choice_is_refused(mlp_case: Case) -> None:
    model, x, y, _ = mlp_case
    with pytest.raises(InputError, match="keep_graphs"):
        HessianOperator(model, split(x, y, BATCH), keep_graphs="sometimes")
    with pytest.raises(InputError, match="keep_graphs"):
        HessianSettings(keep_graphs="yes")


@pytest.mark.parametrize(("trace_method", "passes"), [("hutchpp", 2), ("auto", 6)])
def test_analysis_reports_the_kept_graphs(mlp_case: Case, trace_method: str, passes: int) -> None:
    model, x, y, hessian = mlp_case
    settings = HessianSettings(
        top_k=1, probes=10, tol=1e-8, per_layer=True, trace_method=trace_method
    )
    kept = analyse_batches(model, split(x, y, BATCH), settings)
    assert kept.operator["graphs_kept"] is True and kept.operator["graphs_dropped"] is None
    # the mean loss reads the data once, the graphs once; every stage's products use them.
    # auto takes the split trace on this tanh network: one pass to check linearity on every
    # sample, one for the Gauss–Newton part, one for the graphs of the linearised loss (the
    # loss's own are freed meanwhile), and one to build those again for the per-module blocks
    assert kept.operator["n_data_passes"] == passes
    rebuilt = analyse_batches(
        model, split(x, y, BATCH), dataclasses.replace(settings, keep_graphs="never")
    )
    assert rebuilt.operator["graphs_kept"] is False
    assert rebuilt.operator["n_data_passes"] > 10
    top = float(torch.linalg.eigvalsh(hessian)[-1])
    assert kept.lambda_max == pytest.approx(top, rel=1e-8)
    assert rebuilt.lambda_max == pytest.approx(kept.lambda_max, rel=1e-12)


def test_chunks_follow_the_micro_batch_limit() -> None:
    assert chunk_rows([7, 7, 1], None) == [7, 7, 1]
    assert chunk_rows([7, 7, 1], 3) == [3, 3, 1, 3, 3, 1, 1]
    assert chunk_rows([6], 3) == [3, 3]
    assert chunk_rows([], 3) == []


def test_all_kept_takes_the_widest_width_that_fits_exactly() -> None:
    graphs = GraphSizes(GraphSize(100.0, 10.0), GraphSize(1000.0, 50.0))
    chunks = [4, 4, 2]
    held = 3 * 1000.0 + 10 * (50.0 + 8.0) + 400  # graphs, inputs held, summed gradient
    assert kept_bytes(graphs, 400, chunks, 8.0) == held
    per_width = [held + (1000.0 + 50.0 * 4) + 400 * (1 + 2 * m) for m in (1, 2, 3)]
    assert [
        kept_prefix(
            graphs,
            param_bytes=400,
            chunks=chunks,
            input_row_bytes=8.0,
            width=3,
            budget=b,
            partial=False,
        )
        for b in (per_width[0] - 1, per_width[0], per_width[1], per_width[2] + 1e9)
    ] == [(0, 0), (3, 1), (3, 2), (3, 3)]


def test_the_default_budget_keeps_what_a_share_of_the_free_memory_holds(
    mlp_case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default budget is half the free memory, so graphs that fit in it are kept with no
    note to raise the budget, and graphs that do not are rebuilt with the reason in the plan."""
    model, x, y, hessian = mlp_case
    need = HessianOperator(model, split(x, y, BATCH)).kept_need
    assert need is not None
    top = float(torch.linalg.eigvalsh(hessian)[-1])
    for free, kept in ((4 * need, True), (need, False)):
        monkeypatch.setattr(operator_module, "free_memory", lambda _device, f=free: f)
        notes: list[str] = []
        result = analyse_batches(
            model, split(x, y, BATCH), HessianSettings(tol=1e-8, trace=False), on_note=notes.append
        )
        plan = result.operator["memory_plan"]
        assert plan["budget_bytes"] == free // 2
        assert notes == []
        if kept:
            assert plan["graphs"] == "kept" and result.operator["kept_rows"] == 7 * BATCH + 1
        else:  # half of ``need`` holds the leading chunks' graphs at most
            assert plan["graphs"] == "partly kept" and "more than the budget" in plan["graphs_why"]
            assert result.operator["kept_rows"] < 7 * BATCH + 1
        assert result.lambda_max == pytest.approx(top, rel=1e-8)


def test_the_api_functions_take_keep_graphs(mlp_case: Case) -> None:
    model, x, y, hessian = mlp_case
    top = float(torch.linalg.eigvalsh(hessian)[-1])
    for keep in ("always", "never"):
        spectrum = hessian_eigenvalues(model, split(x, y, BATCH), tol=1e-8, keep_graphs=keep)
        assert spectrum.eigenvalues[0] == pytest.approx(top, rel=1e-8)
    with pytest.raises(InputError, match="keep_graphs"):
        hessian_eigenvalues(model, split(x, y, BATCH), keep_graphs="perhaps")


def _counting_forwards(model: nn.Module) -> list[int]:
    """The rows of every forward ``model`` runs from now on (a forward hook)."""
    rows: list[int] = []
    model.register_forward_hook(lambda _module, inputs, _output: rows.append(inputs[0].shape[0]))
    return rows


@pytest.mark.parametrize("batch", [BATCH, 12])
def test_the_measured_first_batch_graph_is_the_first_kept_one(batch: int) -> None:
    """Batches of at most 8 rows: the memory plan measures on the whole first batch, and its
    graph is the kept graph's first part (that batch's forward runs once, not twice); larger
    batches are measured on 4 and 8 rows and built whole. Either way every product equals the
    dense float64 Hessian's."""
    model = make_mlp()
    x, y = make_data("mlp")
    vectors = _vectors(75, 2)
    expected = dense_hessian(model, x, y) @ vectors
    forwards = _counting_forwards(model)
    operator = HessianOperator(model, split(x, y, batch), keep_graphs="always")
    assert operator.memory_choice is not None
    measured = min(batch, 8)
    assert forwards == [measured // 2, measured]  # the plan's two slices, the smaller first
    adopted = batch <= 8
    assert ("built whole by the measurement" in operator.memory_choice.graphs_why) == adopted
    for _ in range(2):
        assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
    built = [int(labels.shape[0]) for _inputs, labels in split(x, y, batch)]
    assert forwards[2:] == (built[1:] if adopted else built)
    assert operator.n_data_passes == 1


def test_a_parameter_changed_before_the_first_product_rebuilds_the_measured_graph() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="always")
    with torch.no_grad():
        model[0].weight.mul_(1.5)  # after the measurement built the first batch's graph
    vectors = _vectors(75, 2)
    expected = dense_hessian(model, x, y) @ vectors
    forwards = _counting_forwards(model)
    assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
    assert len(forwards) == len(split(x, y, BATCH))  # every batch built again, the first too


def test_batches_split_before_the_first_product_rebuild_the_measured_graph() -> None:
    """The measured graph covers the whole first batch: once batches are halved (an
    out-of-memory retry) the first chunk is half of it, and the kept graph is built whole."""
    model = make_mlp()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, 6), keep_graphs="always")
    operator._batches.halve()
    vectors = _vectors(75, 2)
    expected = dense_hessian(model, x, y) @ vectors
    assert torch.allclose(operator.matmat(vectors), expected, rtol=0, atol=1e-10)
