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


def test_a_loss_by_name_refuses_by_field_in_the_readers_words() -> None:
    """``loss_from_name`` names the settings at fault by field (``loss``, ``gamma``; formerly
    ``criterion``), which the command line words as its options."""
    from curvcal.errors import SettingsError, as_option, wording
    from curvcal.losses import loss_from_name

    with pytest.raises(SettingsError, match=r"^loss: unknown loss 'mse'") as unknown:
        loss_from_name("mse", None)
    assert unknown.value.field == "loss"
    with pytest.raises(SettingsError, match=r"^gamma: 2\.0 is only used by loss focal"):
        loss_from_name("ce", 2.0)
    with wording(as_option), pytest.raises(SettingsError) as typed:
        loss_from_name("flsd53", 2.0)
    assert typed.value.message == "--gamma: 2.0 is only used by --loss focal (pass --loss focal)"
