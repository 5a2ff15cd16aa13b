"""The structural linearity proof read off a batch's autograd graph, against hand-known cases and
dense float64 second derivatives (torch.func.hessian of wᵀz in each tensor alone): every tensor
the graph proves has a zero block; the hand-known nonlinear ones are not proven, and their
blocks are not zero. Then the check as a whole: proven tensors take no double backward, the
rest are decided numerically on every batch, and the trace stays the dense Hessian's."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.gauss_newton import gauss_newton_problem, linearity_check
from curvcal.curvature.graph_linearity import proven_linear
from curvcal.curvature.operator import HessianOperator

from .cases import dense_hessian


class ReluCNN(nn.Module):
    """Convolutions, eval BatchNorm, ReLU, max and average pooling, a residual sum, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = torch.relu(self.bn(self.conv(x)))
        hidden = nn.functional.max_pool2d(hidden + self.conv2(hidden), 2)
        return self.head(nn.functional.avg_pool2d(hidden, 2).flatten(1))


class TiedSeries(nn.Module):
    """One layer applied twice in a row: the output is quadratic in its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.a(torch.relu(self.a(x)))))


class Attention(nn.Module):
    """Single-head self-attention over 3 tokens of 4 features, softmax(q·kᵀ/2)·v, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out, self.head = nn.Linear(4, 12), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x.reshape(-1, 3, 4)).chunk(3, dim=-1)
        mixed = torch.softmax(q @ k.transpose(1, 2) / 2, dim=-1) @ v
        return self.head(self.out(mixed).mean(1))


class Bilinear(nn.Module):
    """(a ⊙ b)·x: quadratic in (a, b) together, linear in each on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(3, 5)), nn.Parameter(torch.randn(3, 5))

    def forward(self, x: Tensor) -> Tensor:
        return x @ (self.a * self.b).T


class Divided(nn.Module):
    """A layer's output divided by a function of another tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.scale = nn.Linear(5, 3), nn.Parameter(torch.tensor([1.5, 2.0, 0.7]))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x) / self.scale


class Identity(torch.autograd.Function):
    """The identity, as a node type the structural proof does not know."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor) -> Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def, override]
        pass

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[no-untyped-def, override]
        return grad.clone()

    @staticmethod
    def jvp(ctx, tangent: Tensor) -> Tensor:  # type: ignore[no-untyped-def, override]
        return tangent.clone()


class Opaque(nn.Module):
    """A ReLU network with an identity the graph cannot read: linear, shown only numerically."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(Identity.apply(torch.relu(self.fc(x))))


class BranchOnData(nn.Module):
    """Python control flow: a tanh only in the batches whose first value is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc(x)
        hidden = torch.tanh(hidden) if float(x[0, 0]) > 0 else torch.relu(hidden)
        return self.head(hidden)


def _block_size(model: nn.Module, name: str, x: Tensor) -> float:
    """max |∇²_{tt}(wᵀz)| for the tensor ``name`` alone, by torch.func.hessian in float64."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    weights = torch.randn(model(x).shape, generator=torch.Generator().manual_seed(5)).double()

    def score(value: Tensor) -> Tensor:
        out = torch.func.functional_call(model, {**params, name: value}, (x,))
        return (out * weights).sum()

    return float(torch.func.hessian(score)(params[name]).abs().max())


def _proven(model: nn.Module, x: Tensor) -> dict[str, bool]:
    names, params = zip(*model.named_parameters(), strict=True)
    with torch.enable_grad():
        flags = proven_linear(model(x), params)
    return dict(zip(names, flags, strict=True))


def _inputs(model: nn.Module, rows: int = 6) -> Tensor:
    shape = (
        (rows, 2, 8, 8)
        if isinstance(model, ReluCNN)
        else (rows, 12 if isinstance(model, Attention) else 5)
    )
    return torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


CASES = [
    # model, the tensors the graph must prove, the tensors it must not
    (ReluCNN, {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "conv2.weight", "conv2.bias", "head.weight", "head.bias"}, set()),
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)), {"2.weight", "2.bias"}, {"0.weight", "0.bias"}),
    (TiedSeries, {"head.weight", "head.bias", "a.bias"}, {"a.weight"}),  # b alone: W·relu(Wx + b) + b
    (Attention, {"out.weight", "out.bias", "head.weight", "head.bias"}, {"qkv.weight"}),
    (Bilinear, {"a", "b"}, set()),
    (Divided, {"fc.weight", "fc.bias"}, {"scale"}),
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.GELU(), nn.Linear(4, 3)), {"2.weight"}, {"0.weight"}),
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)), {"1.weight", "1.bias", "2.weight"}, {"0.weight"}),
]  # fmt: skip


@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_graph_proves_the_linear_tensors_and_no_other(index: int) -> None:
    build, linear, nonlinear = CASES[index]
    torch.manual_seed(index)
    model = build().double().eval()
    x = _inputs(model)
    proven = _proven(model, x)
    for name in linear:
        assert proven[name], name
    for name in nonlinear:
        assert not proven[name], name
        assert _block_size(model, name, x) > 1e-6, name  # hand-known: truly nonlinear
    for name, shown in proven.items():  # soundness: whatever is proven has a zero block
        if shown:
            assert _block_size(model, name, x) < 1e-12, name


def test_batch_norm_in_train_mode_is_not_proven_for_the_layers_before_it() -> None:
    torch.manual_seed(1)
    model = ReluCNN().double().train()
    proven = _proven(model, _inputs(model))
    assert not proven["conv.weight"] and not proven["conv.bias"]
    assert proven["head.weight"] and proven["head.bias"]


def test_the_graph_is_read_on_the_rows_that_built_it() -> None:
    torch.manual_seed(2)
    model = BranchOnData().double().eval()
    x = _inputs(model)
    x[0, 0] = -1.0
    assert _proven(model, x)["fc.weight"]
    x[0, 0] = 1.0
    assert not _proven(model, x)["fc.weight"]


@pytest.mark.parametrize("tanh_batch", [0, 2])
def test_a_branch_taken_only_in_one_batch_is_found_whichever_it_is(tanh_batch: int) -> None:
    torch.manual_seed(4)
    model = BranchOnData().double().eval()
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(18, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (18,), generator=generator)
    x[:, 0] = -x[:, 0].abs() - 0.1
    x[6 * tanh_batch, 0] = 1.0  # that batch of 6 takes the tanh, the others the ReLU
    batches = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 18, 6)]
    problem = gauss_newton_problem(HessianOperator(model, batches))
    assert "not linear in fc.weight" in problem and "head" not in problem


def test_proven_tensors_take_no_double_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(5)
    model = ReluCNN().double().eval()
    names, params = zip(*model.named_parameters(), strict=True)
    graphs_kept = []
    grad = torch.autograd.grad

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        graphs_kept.append(bool(kwargs.get("create_graph")))
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counted)
    check = linearity_check(model, names, params, _inputs(model))
    assert check.linear and check.numerical == ()
    assert graphs_kept == [False]  # one plain backward, for which tensors the rows reach


def test_an_unknown_node_is_decided_numerically_and_the_trace_is_the_dense_one() -> None:
    torch.manual_seed(7)
    model = Opaque().double().eval()
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(14, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (14,), generator=generator)
    names, params = zip(*model.named_parameters(), strict=True)
    check = linearity_check(model, names, params, x)
    assert check.linear and set(check.numerical) == {"fc.weight", "fc.bias"}
    batches = [(x[i : i + 6], y[i : i + 6]) for i in range(0, 14, 6)]
    result = analyse_batches(model, batches, HessianSettings(probes=8))
    assert result.trace is not None and result.trace.method == "gauss-newton"
    choice = result.operator["trace_choice"]
    assert "checked on all 14 samples" in choice
    assert "structurally on every batch's autograd graph" in choice and "numerically" in choice
    assert "structurally on every batch's autograd graph" in result.trace.interval
    assert result.trace.estimate == pytest.approx(
        float(dense_hessian(model, x, y).trace()), rel=1e-10
    )
