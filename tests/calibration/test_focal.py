"""Focal calibration map and focal loss against their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from curvcal.calibration.focal import focal_calibration_map, focal_loss
from curvcal.errors import InputError

F64 = torch.float64


def focal_minimiser(q: np.ndarray, gamma: float) -> np.ndarray:
    """argmin_p Σ_k q_k·(-(1 - p_k)^γ log p_k) over the simplex, via softmax parameters."""

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        logits = np.concatenate([[0.0], theta])
        logp = logits - np.logaddexp.reduce(logits)
        p = np.exp(logp)
        value = float(np.sum(q * -((1 - p) ** gamma) * logp))
        d_p = q * (gamma * (1 - p) ** (gamma - 1) * logp - (1 - p) ** gamma / p)
        d_logits = p * d_p - p * np.sum(p * d_p)
        return value, d_logits[1:]

    start = np.log(q[1:] / q[0])
    result = minimize(
        objective, start, jac=True, method="BFGS", options={"gtol": 1e-14, "maxiter": 10_000}
    )
    logits = np.concatenate([[0.0], result.x])
    return logits - np.logaddexp.reduce(logits)


@pytest.mark.parametrize("gamma", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_map_inverts_the_focal_loss_minimiser(gamma: float, seed: int) -> None:
    q = torch.softmax(
        torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 1.5, 0
    ).numpy()
    log_p_star = focal_minimiser(q, gamma)
    assert not np.allclose(np.exp(log_p_star), q, atol=1e-3)  # the minimiser is not q itself
    mapped = focal_calibration_map(torch.tensor(log_p_star)[None], gamma).exp()[0].numpy()
    np.testing.assert_allclose(mapped, q, atol=1e-6)


def test_matches_the_direct_formula_on_moderate_rows() -> None:
    q = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=F64)
    gamma = 2.5
    g = (1 - q) ** gamma / q - gamma * (1 - q) ** (gamma - 1) * torch.log(q)
    expected = (1 / g) / (1 / g).sum(dim=1, keepdim=True)
    torch.testing.assert_close(
        focal_calibration_map(q.log(), gamma).exp(), expected, rtol=1e-12, atol=1e-14
    )


def test_gamma_zero_is_the_identity() -> None:
    logp = torch.log_softmax(torch.randn(5, 4, dtype=F64), 1)
    assert torch.equal(focal_calibration_map(logp, 0.0), logp)


@pytest.mark.parametrize("gamma", [1.0, 2.0, 3.0])
def test_binary_map_is_a_temperature_near_one_half_and_for_confident_rows(gamma: float) -> None:
    def log_odds(ell: float) -> float:
        out = focal_calibration_map(
            torch.log_softmax(torch.tensor([[ell, 0.0]], dtype=F64), 1), gamma
        )[0]
        return float(out[0] - out[1])

    h = 1e-4
    near_half = (log_odds(h) - log_odds(-h)) / (2 * h)
    expected = (1 + 2 * gamma + gamma * (gamma - 1) * math.log(2)) / (1 + gamma * math.log(2))
    assert near_half == pytest.approx(expected, rel=1e-7)
    assert (log_odds(40 + h) - log_odds(40 - h)) / (2 * h) == pytest.approx(gamma + 1, rel=1e-7)


def test_saturated_rows_stay_finite() -> None:
    z = torch.tensor(
        [[0.0, -60.0, -80.0], [0.0, -1e3, -2e3], [100.0, 0.0, 0.0]], dtype=torch.float32
    )
    for gamma in (0.5, 1.0, 3.0, 7.0):
        out = focal_calibration_map(torch.log_softmax(z.double(), 1), gamma)
        assert not torch.isnan(out).any()
        torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(3, dtype=F64))
        assert (out.argmax(dim=1) == 0).all()


def test_exact_zeros_and_one_hot_rows() -> None:
    logp = torch.log(torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=F64))
    out = focal_calibration_map(logp, 3.0).exp()
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=F64))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-300, 300), min_size=1, max_size=6),
    st.floats(0, 8),
)
@example([-1.991279312057294e-16, 0.0, -0.03125], 0.2616)  # a tie to one ulp of log-softmax
def test_map_returns_a_probability_vector_in_class_order(logits: list[float], gamma: float) -> None:
    logp = torch.log_softmax(torch.tensor([logits], dtype=F64), 1)
    out = focal_calibration_map(logp, gamma).exp()[0]
    assert torch.isfinite(out).all() and (out >= 0).all()
    # the prediction is kept: the predicted class maps to the largest value, up to the same
    # rounding the order check below allows (logits one ulp apart may map to equal values)
    assert float(out[int(logp.argmax())]) >= float(out.max()) - 1e-15
    assert float(out.sum()) == pytest.approx(1.0, abs=1e-12)
    order = torch.argsort(logp[0], stable=True)
    assert (out[order].diff() >= -1e-15).all()  # φ_γ preserves the order of the classes


def test_bad_gamma() -> None:
    for gamma in (-1.0, math.nan, math.inf):
        with pytest.raises(InputError):
            focal_calibration_map(torch.zeros(1, 2), gamma)


# ---- focal loss -------------------------------------------------------------------------------


def test_focal_loss_gamma_zero_is_cross_entropy() -> None:
    z = torch.randn(7, 3, dtype=F64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    torch.testing.assert_close(focal_loss(z, y, 0.0), torch.nn.functional.cross_entropy(z, y))


def test_focal_loss_formula() -> None:
    z = torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=F64)
    y = torch.tensor([0, 0])
    p = torch.softmax(z, 1)[:, 0]
    expected = -((1 - p) ** 2) * torch.log(p)
    torch.testing.assert_close(focal_loss(z, y, 2.0, reduction="none"), expected)
    torch.testing.assert_close(focal_loss(z, y, 2.0, reduction="sum"), expected.sum())


def test_flsd53_picks_gamma_per_sample_and_treats_it_as_constant() -> None:
    z = torch.tensor([[3.0, 0.0], [0.0, 3.0], [0.5, 0.0]], dtype=F64, requires_grad=True)
    y = torch.tensor([0, 0, 0])
    p = torch.softmax(z.detach(), 1)[:, 0]  # 0.95, 0.047, 0.62 -> γ = 3, 5, 3
    gammas = torch.tensor([3.0, 5.0, 3.0], dtype=F64)
    loss = focal_loss(z, y, "flsd53")
    ref_z = z.detach().clone().requires_grad_(True)
    ref_p = torch.softmax(ref_z, 1)[:, 0]
    reference = (-((1 - ref_p) ** gammas) * torch.log(ref_p)).mean()
    torch.testing.assert_close(loss, reference)
    (grad,) = torch.autograd.grad(loss, z)
    (ref_grad,) = torch.autograd.grad(reference, ref_z)
    torch.testing.assert_close(grad, ref_grad)
    assert p[1] < 0.2 < p[2]


def test_focal_loss_is_finite_on_saturated_logits() -> None:
    z = torch.tensor([[60.0, 0.0]], requires_grad=True)
    loss = focal_loss(z, torch.tensor([0]), 2.0)
    (grad,) = torch.autograd.grad(loss, z)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_focal_loss_bad_inputs() -> None:
    z, y = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(InputError, match="flsd53"):
        focal_loss(z, y, "flsd99")
    with pytest.raises(InputError):
        focal_loss(z, y, -2.0)
    with pytest.raises(InputError):
        focal_loss(z[0], y, 1.0)
    with pytest.raises(InputError):
        focal_loss(z, y, 1.0, reduction="max")
