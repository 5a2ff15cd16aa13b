"""The full maps' trust-region Newton–CG: the truncated CG step against dense linear algebra,
and the fit far from the minimum (many classes, a weak regulariser), where a plain Newton
step overshoots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration.linear import _steihaug, fit_linear


def _problem(seed: int, size: int = 12, indefinite: bool = False):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((size, size)))
    eigenvalues = np.geomspace(1e-3, 10.0, size)
    if indefinite:
        eigenvalues[0] = -1.0
    h = (q * eigenvalues) @ q.T
    # A preconditioner that is an SPD approximation of H⁻¹ (not exact): M⁻¹ = (H_abs + E)⁻¹.
    e = rng.standard_normal((size, size)) * 0.05
    m = (q * np.abs(eigenvalues)) @ q.T + e @ e.T + 1e-2 * np.eye(size)
    m_inverse = np.linalg.inv(m)
    gradient = rng.standard_normal(size)
    return h, m, m_inverse, gradient


@pytest.mark.parametrize("preconditioned", [True, False])
def test_an_interior_step_solves_the_newton_system(preconditioned: bool) -> None:
    h, _, m_inverse, g = _problem(0)
    precondition = (lambda v: m_inverse @ v) if preconditioned else None
    d, model, length = _steihaug(lambda v: h @ v, precondition, g, 1e6, 1e-12, 200)
    exact = np.linalg.solve(h, -g)
    np.testing.assert_allclose(d, exact, rtol=1e-8, atol=1e-8 * np.abs(exact).max())
    assert model == pytest.approx(g @ d + 0.5 * d @ h @ d, rel=1e-8)
    m = np.linalg.inv(m_inverse) if preconditioned else np.eye(len(g))
    assert length == pytest.approx(np.sqrt(d @ m @ d), rel=1e-8)
    assert length < 1e6


@pytest.mark.parametrize("indefinite", [False, True])
def test_a_boundary_step_lies_on_the_preconditioners_sphere(indefinite: bool) -> None:
    h, m, m_inverse, g = _problem(1, indefinite=indefinite)
    full = np.linalg.solve(h, -g)
    radius = 0.1 * np.sqrt(abs(full @ m @ full))
    d, model, length = _steihaug(lambda v: h @ v, lambda v: m_inverse @ v, g, radius, 1e-12, 200)
    assert length == radius
    # ‖d‖_M from the recurrences, checked with M itself
    assert np.sqrt(d @ m @ d) == pytest.approx(radius, rel=1e-9)
    assert model == pytest.approx(g @ d + 0.5 * d @ h @ d, rel=1e-9)
    assert model < 0.0
    # no worse than the Cauchy point: the model's minimum along −M⁻¹g within the radius
    direction = -(m_inverse @ g)
    t_max = radius / np.sqrt(direction @ m @ direction)
    curvature = direction @ h @ direction
    t = t_max if curvature <= 0 else min(t_max, -(g @ direction) / curvature)
    assert model <= g @ (t * direction) + 0.5 * t * t * curvature + 1e-12


def test_negative_curvature_goes_to_the_boundary() -> None:
    h = _problem(2, indefinite=True)[0]
    rng = np.random.default_rng(3)
    q = np.linalg.eigh(h)[1][:, 0]  # the negative eigenvector
    g = 1e-3 * q + 1e-6 * rng.standard_normal(len(q))
    d, model, length = _steihaug(lambda v: h @ v, None, g, 2.0, 1e-12, 200)
    assert length == 2.0
    assert np.linalg.norm(d) == pytest.approx(2.0, rel=1e-9)
    assert model < -1.0  # ≈ ½ · (−1) · 2², far below what any positive-curvature step gives


def _overconfident(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits 2.5·u with labels drawn from softmax(u), u ~ N(0, (1 + ln(K)/2)²): few samples
    per class, so Dirichlet calibration with a weak regulariser nearly interpolates."""
    rng = np.random.default_rng(seed)
    u = (1.0 + 0.5 * np.log(k)) * rng.standard_normal((n, k))
    labels = (u + rng.gumbel(size=(n, k))).argmax(axis=1)
    return torch.from_numpy(2.5 * u), torch.from_numpy(labels)


def test_far_from_the_minimum_the_first_steps_do_not_overshoot() -> None:
    # K = 200 on 1,000 samples, λ = μ = 0.01: the Newton model is poor far from the minimum.
    # A full Newton step from the identity sent L from 3.01 to 39,534, and the line search's
    # halvings left L at 2.04 after 20 objective evaluations; with the trust region L is about
    # 4e-6 by then and never above 3.5.
    z, y = _overconfident(1000, 200, seed=1)
    seen: list[float] = []

    class Budget(Exception):
        pass

    def trace(objective: float, point: object) -> None:
        seen.append(objective)
        if len(seen) >= 20:
            raise Budget

    with pytest.raises(Budget):
        fit_linear(z, y, "dirichlet", l2_off_diagonal=0.01, l2_bias=0.01, trace=trace)
    assert min(seen) < 0.05 * seen[0]
    assert max(seen) < 1000.0 * seen[0]


def test_the_model_floor_stops_the_step_where_the_model_reaches_it() -> None:
    h, m, m_inverse, g = _problem(4)
    full = np.linalg.solve(h, -g)
    floor = 0.5 * (g @ full + 0.5 * full @ h @ full)  # half the model's whole decrease
    d, model, length = _steihaug(
        lambda v: h @ v, lambda v: m_inverse @ v, g, np.inf, 1e-12, 200, floor
    )
    assert model == floor
    assert g @ d + 0.5 * d @ h @ d == pytest.approx(floor, rel=1e-9)
    assert length == pytest.approx(np.sqrt(d @ m @ d), rel=1e-9)
