"""The criteria whose Hessian is measured, against hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.losses import cross_entropy_sum, focal_loss_sum


def test_focal_loss_hand_worked() -> None:
    # logits (0, ln 3): p = (1/4, 3/4)
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], dtype=torch.float64)
    labels = torch.tensor([1, 0])
    expected = -(0.25**2) * math.log(0.75) - (0.75**2) * math.log(0.25)
    assert float(focal_loss_sum(logits, labels, 2.0)) == pytest.approx(expected, abs=1e-14)
    assert float(cross_entropy_sum(logits, labels)) == pytest.approx(
        -math.log(0.75) - math.log(0.25), abs=1e-14
    )


def test_focal_with_gamma_zero_is_cross_entropy_and_saturation_is_finite() -> None:
    logits = torch.tensor([[40.0, 0.0, -3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    assert float(focal_loss_sum(logits, labels, 0.0)) == pytest.approx(
        float(cross_entropy_sum(logits, labels))
    )
    value = focal_loss_sum(logits[:1], labels[:1], 0.5)
    assert torch.isfinite(value) and float(value) >= 0.0
