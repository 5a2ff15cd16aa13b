"""Smooth ECE against a brute-force integral of the reflected-Gaussian definition."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.integrate import quad

from curvcal.calibration.smooth import smooth_ece, smooth_ece_at

F64 = torch.float64
CONF = torch.tensor([0.55, 0.62, 0.7, 0.91, 0.97, 0.33], dtype=F64)
CORRECT = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=F64)


def reflected_gaussian(t: float, f: float, sigma: float) -> float:
    total = 0.0
    for k in range(-6, 7):
        for x in (t - f + 2 * k, t + f - 2 * k):
            total += math.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    return total


def brute_force(conf: torch.Tensor, correct: torch.Tensor, sigma: float) -> float:
    residual = (correct - conf).tolist()
    fs = conf.tolist()

    def integrand(t: float) -> float:
        return abs(
            sum(r * reflected_gaussian(t, f, sigma) for r, f in zip(residual, fs, strict=True))
        ) / len(fs)

    value, _ = quad(integrand, 0.0, 1.0, limit=400, epsabs=1e-12, points=fs)
    return value


@pytest.mark.parametrize("sigma", [0.03, 0.1, 0.4])
def test_fixed_bandwidth_matches_the_integral(sigma: float) -> None:
    assert smooth_ece_at(CONF, CORRECT, sigma) == pytest.approx(
        brute_force(CONF, CORRECT, sigma), abs=2e-5
    )


def test_fixed_point_bandwidth_equals_the_value() -> None:
    result = smooth_ece(CONF, CORRECT)
    assert result.bandwidth == pytest.approx(result.value, abs=1e-9)
    assert result.value == pytest.approx(brute_force(CONF, CORRECT, result.bandwidth), abs=2e-5)
    assert "gaussian" in result.kernel and "reflected" in result.kernel


def test_decreases_with_bandwidth() -> None:
    values = [smooth_ece_at(CONF, CORRECT, s) for s in (0.01, 0.05, 0.2, 0.6)]
    assert values == sorted(values, reverse=True)


def test_one_signed_residuals_give_the_mean_gap_for_every_bandwidth() -> None:
    correct = torch.ones_like(CONF)
    gap = float((1 - CONF).mean())
    for sigma in (0.005, 0.1, 0.9):
        assert smooth_ece_at(CONF, correct, sigma) == pytest.approx(gap, abs=1e-12)
    result = smooth_ece(CONF, correct)
    assert result.value == pytest.approx(gap, abs=1e-9) and result.bandwidth == pytest.approx(
        gap, abs=1e-9
    )


def test_zero_residuals_give_zero() -> None:
    conf = torch.tensor([0.0, 1.0, 1.0], dtype=F64)
    result = smooth_ece(conf, conf.clone())
    assert result.value == 0.0 and result.bandwidth > 0


def test_single_sample_and_edges() -> None:
    for f, y in ((1.0, 0.0), (0.0, 1.0), (0.5, 1.0)):
        result = smooth_ece(torch.tensor([f], dtype=F64), torch.tensor([y], dtype=F64))
        assert result.value == pytest.approx(abs(y - f), abs=1e-9)
