"""The Gauss–Newton trace against dense float64 Hessians (torch.func.hessian)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature import build_operator
from curvcal.curvature.gauss_newton import (
    METHOD,
    EngineChoice,
    gauss_newton_problem,
    gauss_newton_sums,
    gauss_newton_trace,
    linearity_check,
    loss_hessians,
    tensor_traces,
)
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError, NumericalError
from curvcal.losses import CrossEntropy, FLSD53Loss, Focal, focal_loss
from curvcal.settings.hessian import HessianSettings

from .cases import BATCH, dense_gauss_newton, dense_hessian, make_cnn, make_data, make_mlp, split


class ResidualNet(nn.Module):
    """Conv + BatchNorm + ReLU, a residual conv block, max-pooling and a linear head: linear in
    each parameter tensor with the activation pattern fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(2)
        self.block = nn.Conv2d(2, 2, 3, padding=1)
        self.head = nn.Linear(2 * 2 * 2, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.norm(self.stem(x)))
        h = torch.relu(h + self.block(h))
        return self.head(nn.functional.max_pool2d(h, 2).flatten(1))


class TwiceUsed(nn.Module):
    """The same linear layer applied twice: the logits are quadratic in its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(5, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.shared(torch.relu(self.shared(x))))


class Unused(nn.Module):
    """A parameter the forward never touches."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
        self.spare = nn.Parameter(torch.ones(2))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def _relu_mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def _residual() -> nn.Module:
    torch.manual_seed(4)
    model = ResidualNet().double()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-0.5, 0.5)
        model.norm.running_var.uniform_(0.5, 2.0)
    return model


def _mean(loss: object) -> object:
    return lambda z, t: loss.sum(z, t) / z.shape[0]  # type: ignore[attr-defined]


def _block_traces(hessian: Tensor, model: nn.Module, names: list[str]) -> dict[str, float]:
    sizes = [dict(model.named_parameters())[n].numel() for n in names]
    diagonal = hessian.diagonal().split(sizes)
    return {n: float(d.sum()) for n, d in zip(names, diagonal, strict=True)}


@pytest.mark.parametrize("loss", [CrossEntropy(), Focal(2.0), FLSD53Loss()], ids=str)
@pytest.mark.parametrize("kind", ["relu-mlp", "cnn", "residual"])
def test_trace_equals_the_dense_hessians_trace(kind: str, loss: object) -> None:
    if kind == "relu-mlp":
        model, (x, y) = _relu_mlp().double(), make_data("mlp")
    elif kind == "cnn":
        model, (x, y) = make_cnn(), make_data("cnn")
    else:
        model, (x, y) = _residual(), make_data("cnn")
    names = [n for n, _ in model.named_parameters()]
    dense = dense_hessian(model, x, y, _mean(loss))  # type: ignore[arg-type]
    operator = build_operator(model, loss, split(x, y, BATCH))  # type: ignore[arg-type]
    result = gauss_newton_trace(operator)
    assert result.method == METHOD and result.matvecs == 0 and result.converged
    assert result.estimate == pytest.approx(float(dense.trace()), rel=1e-10, abs=1e-12)
    truth = float(dense.trace())
    low, high = result.ci95
    assert low <= truth <= high and high - low <= 1e-12 * (1 + abs(truth))  # rounding only
    # every tensor's share is its diagonal block's trace
    shares = tensor_traces(operator).traces
    for name, value in _block_traces(dense, model, names).items():
        assert shares[name] == pytest.approx(value, rel=1e-10, abs=1e-12)


def test_a_selected_block_in_which_the_logits_are_linear_is_exact_in_a_tanh_network() -> None:
    model, (x, y) = make_mlp(), make_data("mlp")  # tanh after the first layer
    names = ["2.weight", "2.bias"]
    dense = dense_hessian(model, x, y, names=names)
    operator = build_operator(
        model, CrossEntropy(), split(x, y, BATCH), HessianSettings(params=("2.*",))
    )
    assert gauss_newton_trace(operator).estimate == pytest.approx(float(dense.trace()), rel=1e-10)


def test_the_norms_taken_are_one_per_sample_and_kept_eigenpair() -> None:
    model, (x, y) = _relu_mlp().double(), make_data("mlp")
    operator = build_operator(model, CrossEntropy(), split(x, y, BATCH))
    # cross-entropy's Λ_n has rank C − 1 = 2 (the all-ones vector is its null space)
    assert gauss_newton_trace(operator).n_probes == 2 * x.shape[0]


def test_loss_hessian_of_cross_entropy_matches_autograd_row_by_row() -> None:
    logits = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 2])
    found = loss_hessians(CrossEntropy(), logits, labels)
    for row in range(2):

        def one(z: Tensor, row: int = row) -> Tensor:
            return nn.functional.cross_entropy(z.unsqueeze(0), labels[row : row + 1])

        expected = torch.autograd.functional.hessian(one, logits[row])
        torch.testing.assert_close(found[row], expected)
    # the all-ones direction is in the null space (softmax is shift-invariant)
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(found @ ones, torch.zeros(2, 3, dtype=torch.float64))


def test_loss_hessian_of_the_focal_loss_matches_autograd_row_by_row() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.3, 0.1], [-0.5, 1.5, 0.0, 3.0]], dtype=torch.float64)
    labels = torch.tensor([1, 3])
    found = loss_hessians(Focal(3.0), logits, labels)
    for row in range(2):

        def one(z: Tensor, row: int = row) -> Tensor:
            return focal_loss(z.unsqueeze(0), labels[row : row + 1], 3.0, reduction="sum")

        expected = torch.autograd.functional.hessian(one, logits[row])
        torch.testing.assert_close(found[row], expected)


def test_tanh_layers_are_named_as_nonlinear() -> None:
    model, (x, y) = make_mlp(), make_data("mlp")
    operator = build_operator(model, CrossEntropy(), split(x, y, BATCH))
    problem = gauss_newton_problem(operator)
    assert "not linear in 0.weight, 0.bias" in problem and "2.weight" not in problem
    with pytest.raises(InputError, match="Gauss–Newton trace is not exact here"):
        gauss_newton_trace(operator)
    assert operator.total_matvecs == 0


def test_a_weight_used_twice_is_nonlinear() -> None:
    torch.manual_seed(5)
    model, (x, _) = TwiceUsed().double(), make_data("mlp")
    names = [n for n, _ in model.named_parameters()]
    check = linearity_check(model, names, list(model.parameters()), x[:2])
    # W·relu(W x + b) + b is quadratic in W but still (piecewise) linear in b
    assert check.nonlinear == ("shared.weight",) and not check.linear


def test_a_parameter_the_logits_do_not_reach_is_not_shown_linear() -> None:
    torch.manual_seed(6)
    model, (x, _) = Unused().double(), make_data("mlp")
    names = [n for n, _ in model.named_parameters()]
    check = linearity_check(model, names, list(model.parameters()), x[:2])
    assert check.unreached == ("spare",) and "do not depend on spare" in check.reason()


def test_train_mode_is_refused() -> None:
    x, y = make_data("cnn")
    operator = build_operator(
        make_cnn(), CrossEntropy(), split(x, y, BATCH), HessianSettings(mode="train")
    )
    assert "train mode" in gauss_newton_problem(operator)
    with pytest.raises(InputError, match="train mode"):
        gauss_newton_trace(operator)


def test_one_sample_and_a_single_parameter_tensor() -> None:
    model, (x, y) = _relu_mlp().double(), make_data("mlp", n=1)
    dense = dense_hessian(model, x, y, names=["4.bias"])
    operator = build_operator(model, CrossEntropy(), [(x, y)], HessianSettings(params=("4.bias",)))
    assert gauss_newton_trace(operator).estimate == pytest.approx(float(dense.trace()), rel=1e-12)


def test_a_nan_weight_is_a_numerical_error() -> None:
    model, (x, y) = _relu_mlp().double(), make_data("mlp")
    with torch.no_grad():
        model[4].bias[0] = math.nan
    operator = HessianOperator(model, split(x, y, BATCH))
    with pytest.raises(NumericalError, match="Gauss–Newton trace"):
        tensor_traces(operator)


def test_sharded_sums_go_through_the_all_reduce_hook() -> None:
    model, (x, y) = _relu_mlp().double(), make_data("mlp")
    whole = tensor_traces(HessianOperator(model, split(x, y, BATCH))).total
    # two identical shards: the sample count and every sum double, the mean stays
    operator = HessianOperator(model, split(x, y, BATCH), all_reduce=lambda t: 2 * t)
    found = tensor_traces(operator)
    assert found.total == pytest.approx(whole, rel=1e-12)
    assert found.norms_taken == 2 * 2 * x.shape[0]


def test_the_model_is_left_as_it_was() -> None:
    model, (x, y) = make_cnn(), make_data("cnn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gauss_newton_trace(build_operator(model, CrossEntropy(), split(x, y, BATCH)))
    assert model.training
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())


def _sums(choice: EngineChoice, loss: object) -> tuple[Tensor, float, int]:
    model, (x, y) = _residual().eval(), make_data("cnn")
    names = tuple(n for n, _ in model.named_parameters())
    return gauss_newton_sums(model, loss, names, tuple(model.parameters()), x, y, choice)  # type: ignore[arg-type]


@pytest.mark.parametrize("loss", [CrossEntropy(), Focal(2.0)], ids=str)
def test_the_func_engine_and_the_choice_give_the_loop_engines_sums(loss: object) -> None:
    loop = _sums(EngineChoice(func_usable=False), loss)
    forced = EngineChoice(func_usable=True)
    forced.engine = "func"
    func = _sums(forced, loss)
    torch.testing.assert_close(func[0], loop[0], rtol=1e-12, atol=1e-14)
    assert func[1] == pytest.approx(loop[1], rel=1e-12) and func[2] == loop[2]
    # undecided: two rows by loop, 33 by func, the rest by the faster; every row once
    choice = EngineChoice(func_usable=True)
    chosen = _sums(choice, loss)
    assert choice.engine in ("loop", "func") and choice.ran >= {"autograd", "func"}
    torch.testing.assert_close(chosen[0], loop[0], rtol=1e-12, atol=1e-14)
    assert chosen[2] == loop[2]


class Branchy(nn.Module):
    """A tanh MLP with a free scale (no layer hooks cover it) and a data-dependent branch that
    ``vmap`` cannot run (``float()`` of a tensor), as in Hugging Face's attention masks."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(5, 6)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.second = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = torch.tanh(self.first(x)) * self.scale
        if hidden.detach().abs().max().item() > 1e6:
            hidden = hidden.clamp(-1.0, 1.0)
        return self.second(hidden)


def test_a_model_vmap_cannot_run_stays_on_the_loop_with_every_row_counted() -> None:
    torch.manual_seed(3)
    model = Branchy().double().eval()
    x, y = make_data("mlp", n=12)
    operator = build_operator(model, CrossEntropy(), split(x, y, 12))
    found = tensor_traces(operator)
    assert found.engine == "autograd"
    expected = dense_gauss_newton(model, x, y, CrossEntropy())
    assert found.total == pytest.approx(float(expected.trace()), rel=1e-12)
    assert found.norms_taken == 12 * 2  # every row once: 2 kept eigenpairs of 3 classes


class _Once(torch.autograd.Function):
    """x ↦ x² with a backward that refuses to build a graph (no second derivative)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        if torch.is_grad_enabled():
            raise RuntimeError("this function has no second derivative")
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class OnceDifferentiable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(5, 4)
        self.second = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.second(_Once.apply(self.first(x)))


def test_a_model_without_second_derivatives_is_not_shown_linear() -> None:
    torch.manual_seed(9)
    model, (x, _) = OnceDifferentiable().double(), make_data("mlp")
    names = [n for n, _ in model.named_parameters()]
    check = linearity_check(model, names, list(model.parameters()), x[:2])
    assert check.failed is not None and not check.linear
    assert check.reason() == (
        "the linearity check could not run (this function has no second derivative)"
    )
