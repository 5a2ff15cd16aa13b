"""One Parameter used in several places: the Gauss–Newton trace, the split estimators, the
per-module blocks and ``auto`` against dense float64 matrices built independently (H by
torch.func.hessian, G = (1/N) Σ JᵀΛJ from the logits' Jacobians).

Before the per-sample hooks accounted for every use, each of these models' tr(G) came out 20–35%
low with an interval of rounding width: only the first module listing the Parameter was hooked.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.gauss_newton import (
    gauss_newton_problem,
    gauss_newton_trace,
    tensor_traces,
)
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.per_sample import layer_plan
from curvcal.curvature.residual import split_trace
from curvcal.losses import CrossEntropy

from .cases import TiedParallel, dense_gauss_newton, dense_hessian


class TiedSeries(nn.Module):
    """Two linear layers sharing one square weight, one after the other: quadratic in it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 3)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.b(torch.relu(self.a(x)))))


class SharedClassifier(nn.Module):
    """Two classifier heads, nn.Linear each, sharing their weight (biases apart), summed."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(5, 6), nn.Linear(5, 6)
        self.head_left, self.head_right = nn.Linear(6, 3), nn.Linear(6, 3)
        self.head_right.weight = self.head_left.weight

    def forward(self, x: Tensor) -> Tensor:
        left = self.head_left(torch.relu(self.left(x)))
        return left + self.head_right(torch.relu(self.right(x)))


class FunctionalReuse(nn.Module):
    """A layer's weight also passed to ``F.linear`` elsewhere: a use no hook sees."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        again = functional.linear(x.flip(1), self.a.weight)
        return self.head(torch.relu(self.a(x)) + torch.relu(again))


class CalledTwice(nn.Module):
    """One linear layer called on two inputs, side by side: linear in its parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.a(x)) + torch.relu(self.a(2 * x.flip(1))))


class CalledTwiceInSeries(nn.Module):
    """One square linear layer applied twice in a row: quadratic in its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.a(torch.relu(self.a(x)))))


LINEAR = [TiedParallel, SharedClassifier, FunctionalReuse, CalledTwice]
NONLINEAR = [TiedSeries, CalledTwiceInSeries]
ALL = LINEAR + NONLINEAR


def _case(kind: type[nn.Module]) -> tuple[nn.Module, Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
    torch.manual_seed(7)
    model = kind().double().eval()
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(19, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (19,), generator=generator)
    return model, x, y, [(x[:6], y[:6]), (x[6:13], y[6:13]), (x[13:], y[13:])]


def _blocks(matrix: Tensor, model: nn.Module) -> dict[str, float]:
    """The trace of each tensor's diagonal block of ``matrix`` (tensors as named_parameters)."""
    named = list(model.named_parameters())
    diagonal = matrix.diagonal().split([p.numel() for _, p in named])
    return {name: float(d.sum()) for (name, _), d in zip(named, diagonal, strict=True)}


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_the_gauss_newton_part_counts_every_use(kind: type[nn.Module]) -> None:
    model, x, y, batches = _case(kind)
    dense = dense_gauss_newton(model, x, y, CrossEntropy())
    found = tensor_traces(HessianOperator(model, batches))
    assert found.total == pytest.approx(float(dense.trace()), rel=1e-10)
    for name, value in _blocks(dense, model).items():
        assert found.traces[name] == pytest.approx(value, rel=1e-10, abs=1e-13)


@pytest.mark.parametrize("kind", LINEAR, ids=lambda k: k.__name__)
def test_the_exact_trace_is_the_dense_hessians(kind: type[nn.Module]) -> None:
    model, x, y, batches = _case(kind)
    truth = float(dense_hessian(model, x, y).trace())
    operator = HessianOperator(model, batches)
    assert gauss_newton_problem(operator) == ""
    result = gauss_newton_trace(operator)
    low, high = result.ci95
    assert result.estimate == pytest.approx(truth, rel=1e-10)
    assert low <= truth <= high


def test_tied_layers_are_hooked_together_and_a_functional_use_falls_back_and_says_so() -> None:
    model, _, _, batches = _case(TiedParallel)
    plan = layer_plan(model, [n for n, _ in model.named_parameters()])
    assert isinstance(plan, dict) and plan["b"].names["weight"] == "a.weight"
    assert tensor_traces(HessianOperator(model, batches)).note == ""
    model, _, _, batches = _case(FunctionalReuse)
    result = gauss_newton_trace(HessianOperator(model, batches))
    assert "did not see every use of a.weight" in result.interval
    assert "one backward per sample" in result.interval


@pytest.mark.parametrize("kind", NONLINEAR, ids=lambda k: k.__name__)
def test_series_uses_are_nonlinear_and_the_split_trace_is_right(kind: type[nn.Module]) -> None:
    model, x, y, batches = _case(kind)
    hessian = dense_hessian(model, x, y)
    gauss_newton = dense_gauss_newton(model, x, y, CrossEntropy())
    operator = HessianOperator(model, batches)
    assert "not linear in a.weight" in gauss_newton_problem(operator)
    # P ≤ 100: 400 products let the sketch of R span the space, so the split is exact
    for method in ("gauss-newton+hutchpp", "gauss-newton+xtrace"):
        result = split_trace(operator, method, 400, seed=1)
        assert result.parts is not None
        assert result.parts["gauss_newton"] == pytest.approx(float(gauss_newton.trace()), rel=1e-10)
        assert result.estimate == pytest.approx(float(hessian.trace()), rel=1e-9)


@pytest.mark.parametrize("kind", NONLINEAR, ids=lambda k: k.__name__)
def test_the_split_interval_covers_the_trace_over_seeds(kind: type[nn.Module]) -> None:
    model, x, y, batches = _case(kind)
    truth = float(dense_hessian(model, x, y).trace())
    operator = HessianOperator(model, batches)
    covered = 0
    for seed in range(20):
        low, high = split_trace(operator, "gauss-newton+hutchpp", 24, seed=seed).ci95
        covered += low <= truth <= high
    assert covered >= 16  # a 95% interval


@pytest.mark.parametrize("kind", LINEAR, ids=lambda k: k.__name__)
def test_per_module_blocks_from_the_gauss_newton_shares_are_the_dense_blocks(
    kind: type[nn.Module],
) -> None:
    model, x, y, batches = _case(kind)
    hessian = dense_hessian(model, x, y)
    operator = HessianOperator(model, batches)
    layers = layer_curvature(operator, gauss_newton=tensor_traces(operator))
    blocks = _blocks(hessian, model)
    for layer in layers:
        want = sum(blocks[name] for name in layer.parameters)
        assert layer.trace.estimate == pytest.approx(want, rel=1e-10, abs=1e-13)


@pytest.mark.parametrize("kind", ALL, ids=lambda k: k.__name__)
def test_auto_picks_an_honest_method_and_its_interval_covers_the_trace(
    kind: type[nn.Module],
) -> None:
    model, x, y, batches = _case(kind)
    truth = float(dense_hessian(model, x, y).trace())
    result = analyse_batches(model, batches, HessianSettings(probes=300, seed=3))
    assert result.trace is not None
    want = "gauss-newton" if kind in LINEAR else "gauss-newton+hutchpp"
    assert result.trace.method == want
    low, high = result.trace.ci95
    assert low <= truth <= high
    assert result.trace.estimate == pytest.approx(truth, rel=1e-6)
