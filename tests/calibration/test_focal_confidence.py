"""The fused top-label confidence of the focal map against the full map of focal.py."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.calibration.focal import _power_in_place, focal_calibration_map, focal_top_confidence

F64 = torch.float64
FLOOR = -1e7


def masked_rows(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(z.to(F64), dim=1)
    shifted = (logp - logp.max(dim=1, keepdim=True).values).clamp(min=FLOOR)
    masked = shifted.scatter(1, shifted.argmax(dim=1, keepdim=True), FLOOR)
    return shifted, masked


@pytest.mark.parametrize(
    "exponent", [-6.0, -4.0, -2.0, -0.75, -0.5, -0.25, 0.5, 1.0, 2.0, 0.3, -1.7]
)
def test_power_of_the_complement(exponent: float) -> None:
    q = torch.rand(500, dtype=F64, generator=torch.Generator().manual_seed(0)) / 2
    expected = (1 - q) ** exponent
    torch.testing.assert_close(_power_in_place(1 - q, exponent), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 0.3])
def test_matches_the_full_map(gamma: float) -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(400, 7, dtype=F64, generator=g) * 4
    z[0] = torch.tensor([0.0] + [-1e9] * 6)  # one-hot: a fixed point, confidence 1
    z[1] = torch.tensor([2.0, 2.0, 0, 0, 0, 0, 0])  # tied top classes
    shifted, masked = masked_rows(z)
    for s in (0.01, 0.3, 1.0, 5.0, 100.0):
        full = focal_calibration_map(torch.log_softmax(s * shifted, dim=1), gamma)
        expected = full.max(dim=1).values.exp()
        got = focal_top_confidence(masked, s, gamma)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
        assert got[0] == 1.0
        single = focal_top_confidence(masked.to(torch.float32), s, gamma).to(F64)
        assert float((single - expected).abs().max()) < 1e-5  # scaling.FLOAT32_ERROR


def test_scratch_buffers_give_the_same_numbers() -> None:
    _, masked = masked_rows(torch.randn(50, 5, dtype=F64) * 3)
    work = tuple(torch.full((64, 5), math.nan, dtype=F64) for _ in range(3))
    torch.testing.assert_close(
        focal_top_confidence(masked, 0.7, 2.0, work),  # type: ignore[arg-type]
        focal_top_confidence(masked, 0.7, 2.0),
        rtol=0,
        atol=0,
    )
