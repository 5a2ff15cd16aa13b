"""focal_loss as a training loss: its gradient and FLSD-53's switch against the textbook formula."""

from __future__ import annotations

import math

import pytest
import torch

import curvcal
from curvcal.calibration.focal import focal_loss

F64 = torch.float64


def textbook(logits: torch.Tensor, labels: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:
    """Lin et al. 2017: mean over samples of −(1 − p_y)^γ log p_y, p = softmax(z), written
    directly from the definition."""
    p = torch.softmax(logits, dim=1)
    p_y = p[torch.arange(len(labels)), labels]
    return (-((1 - p_y) ** gammas) * torch.log(p_y)).mean()


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0, 5.0])
def test_gradient_matches_autograd_of_the_textbook_formula(gamma: float) -> None:
    generator = torch.Generator().manual_seed(int(gamma * 10))
    z = (2 * torch.randn(8, 4, generator=generator, dtype=F64)).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    (grad,) = torch.autograd.grad(curvcal.focal_loss(z, y, gamma), z)
    (expected,) = torch.autograd.grad(textbook(z, y, torch.full((8,), gamma, dtype=F64)), z)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-13)


def test_gamma_zero_gradient_is_the_cross_entropy_gradient() -> None:
    z = torch.randn(6, 3, dtype=F64, requires_grad=True)
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    (grad,) = torch.autograd.grad(focal_loss(z, y, 0.0), z)
    (expected,) = torch.autograd.grad(torch.nn.functional.cross_entropy(z, y), z)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def _logits_with_p_y(p_y: float) -> torch.Tensor:
    """Two-class logits whose class-0 probability is ``p_y``."""
    return torch.tensor([[math.log(p_y), math.log(1 - p_y)]], dtype=F64)


@pytest.mark.parametrize(
    ("p_y", "gamma"), [(0.19, 5.0), (0.2 - 1e-9, 5.0), (0.2 + 1e-9, 3.0), (0.21, 3.0), (0.9, 3.0)]
)
def test_flsd53_switches_gamma_at_one_fifth(p_y: float, gamma: float) -> None:
    z = _logits_with_p_y(p_y).requires_grad_(True)
    y = torch.tensor([0])
    loss = focal_loss(z, y, "flsd53")
    expected = -((1 - p_y) ** gamma) * math.log(p_y)
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    (grad,) = torch.autograd.grad(loss, z)
    (reference,) = torch.autograd.grad(textbook(z, y, torch.tensor([gamma], dtype=F64)), z)
    torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-14)


def test_flsd53_boundary_sample_uses_gamma_three() -> None:
    # p_y ≥ 0.2 takes γ = 3 (Mukhoti et al.: γ = 5 on [0, 0.2), 3 on [0.2, 1]).
    z = torch.tensor([[0.0, math.log(4.0)]], dtype=F64)  # p_0 = 1/5 up to rounding
    p_y = torch.softmax(z, 1)[0, 0].item()
    gamma = 5.0 if p_y < 0.2 else 3.0
    expected = -((1 - p_y) ** gamma) * math.log(p_y)
    assert focal_loss(z, torch.tensor([0]), "FLSD53").item() == pytest.approx(expected, rel=1e-12)
