"""The claim that the Gauss–Newton trace is exact is checked on every sample, not assumed; and a
trace that is exact for a positive semi-definite part is never negative.

Ground truth: dense float64 Hessians by torch.func.hessian, and for saturated softmax rows the
cancellation-free form tr(J_nᵀΛ_nJ_n) = Σ_{c<d} p_c p_d ‖∇z_c − ∇z_d‖² from the logits' Jacobians.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.gauss_newton import (
    gauss_newton_problem,
    gauss_newton_trace,
    loss_hessians,
)
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.losses import CrossEntropy

from .cases import dense_hessian


class LateGate(nn.Module):
    """A tanh that acts only on the rows whose first feature is positive: linear in ``fc`` on
    the others."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc(x)
        gated = torch.where(x[:, :1] > 0, torch.tanh(hidden), torch.relu(hidden))
        return self.head(gated)


def _late_gate(order: str = "off first") -> tuple[nn.Module, Tensor, Tensor]:
    """The gate off in the first 12 rows (two batches of 6), on in the 8 after."""
    torch.manual_seed(11)
    model = LateGate().double().eval()
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(20, 4, generator=generator, dtype=torch.float64)
    x[:, 0] = x[:, 0].abs() + 0.1
    x[:12, 0] *= -1
    y = torch.randint(0, 3, (20,), generator=generator)
    if order == "on first":
        x, y = x.flip(0), y.flip(0)
    return model, x, y


def _batches(x: Tensor, y: Tensor, size: int = 6) -> list[tuple[Tensor, Tensor]]:
    return [(x[i : i + size], y[i : i + size]) for i in range(0, x.shape[0], size)]


@pytest.mark.parametrize("order", ["off first", "on first"])
def test_a_gate_off_in_the_first_rows_is_found_whatever_the_order(order: str) -> None:
    model, x, y = _late_gate(order)
    problem = gauss_newton_problem(HessianOperator(model, _batches(x, y)))
    assert "not linear in fc.weight" in problem and "fc.bias" in problem
    assert "head" not in problem  # the head is linear in every row


def test_the_gauss_newton_trace_is_refused_and_auto_splits_and_covers_the_truth() -> None:
    model, x, y = _late_gate()
    truth = float(dense_hessian(model, x, y).trace())
    with pytest.raises(InputError, match=r"not linear in fc\.weight"):
        gauss_newton_trace(HessianOperator(model, _batches(x, y)))
    result = analyse_batches(model, _batches(x, y), HessianSettings(probes=300, seed=2))
    assert result.trace is not None and result.trace.method == "gauss-newton+hutchpp"
    low, high = result.trace.ci95
    assert low <= truth <= high and result.trace.estimate == pytest.approx(truth, rel=1e-6)


def test_the_message_says_what_was_checked() -> None:
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).double().eval()
    generator = torch.Generator().manual_seed(14)
    x = torch.randn(17, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (17,), generator=generator)
    result = analyse_batches(model, _batches(x, y), HessianSettings(probes=8))
    assert result.trace is not None and result.trace.method == "gauss-newton"
    assert "checked on all 17 samples" in result.operator["trace_choice"]
    assert "checked on every sample" in result.trace.interval
    assert result.trace.estimate == pytest.approx(
        float(dense_hessian(model, x, y).trace()), rel=1e-10
    )


def _saturated(seed: int) -> tuple[nn.Module, Tensor, Tensor]:
    """A ReLU network whose softmax rounds to one class: p_max = 1 in float64, the other
    probabilities 1e-60 or so."""
    torch.manual_seed(seed)
    classes = (3, 10)[seed % 2]
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, classes)).double().eval()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(20, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, classes, (20,), generator=generator)
    with torch.no_grad():
        model[2].bias[seed % classes] += 150.0
        model[2].weight[seed % classes] *= 30.0
    return model, x, y


def _cancellation_free_trace(model: nn.Module, x: Tensor) -> float:
    """(1/N) Σ_n Σ_{c<d} p_c p_d ‖∇z_c − ∇z_d‖² = (1/N) Σ_n tr(J_nᵀ Λ_n J_n), every term ≥ 0."""
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]

    def logits(theta: Tensor) -> Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        return torch.func.functional_call(model, values, (x,))

    jacobian = torch.func.jacrev(logits)(flat)  # (N, C, P)
    with torch.no_grad():
        p = torch.softmax(model(x), dim=1)
    total = 0.0
    for c, d in itertools.combinations(range(p.shape[1]), 2):
        gap = (jacobian[:, c] - jacobian[:, d]).pow(2).sum(1)
        total += float((p[:, c] * p[:, d] * gap).sum())
    return total / x.shape[0]


@pytest.mark.parametrize("seed", [6, 8, 13, 34])
def test_a_saturated_models_trace_is_not_negative_and_its_interval_holds_the_truth(
    seed: int,
) -> None:
    model, x, y = _saturated(seed)
    truth = _cancellation_free_trace(model, x)
    assert 0 < truth < 1e-40
    result = gauss_newton_trace(HessianOperator(model, _batches(x, y, 7)))
    low, high = result.ci95
    assert result.estimate >= 0 and low >= 0
    assert result.estimate == pytest.approx(truth, rel=1e-6)
    assert low <= truth <= high or result.estimate == pytest.approx(truth, rel=1e-9)
    assert "positive semi-definite" in result.interval


def test_the_cross_entropy_hessian_of_a_saturated_row_is_positive_semidefinite() -> None:
    logits = torch.tensor([[150.0, 0.0, -3.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    hessians = loss_hessians(CrossEntropy(), logits, torch.tensor([0, 1]))
    p = torch.softmax(logits, dim=1)
    # the diagonal p_i(1 − p_i), with 1 − p_i = Σ_{j≠i} p_j, by hand for the saturated row
    assert float(hessians[0, 0, 0]) == pytest.approx(float(p[0, 1] + p[0, 2]), rel=1e-12)
    assert float(torch.linalg.eigvalsh(hessians[0])[0]) >= -1e-12 * float(hessians[0].abs().max())
