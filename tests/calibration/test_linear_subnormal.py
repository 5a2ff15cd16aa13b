"""The full maps' Hessian product where the fit nearly interpolates: probabilities far below
float32's resolution are flushed to zero and the product is taken of a unit-sized vector, so
that no subnormal number (which a CPU computes about 100× slower) enters it. Checked against
the dense Hessian of the whitened objective (float64, autograd) and the fit against a dense
Newton minimisation of the same objective."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import curvcal.calibration.linear as linear
from curvcal.calibration.linear import _flush_tiny, _FullProblem, fit_linear, penalty_weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flush_tiny_zeroes_only_what_lies_below_the_square_root_of_the_smallest_normal(
    dtype: torch.dtype,
) -> None:
    tiny = torch.finfo(dtype).tiny
    floor = math.sqrt(tiny)
    values = [0.0, tiny / 8, tiny, floor / 2, floor, 2 * floor, 1e-3, 0.5, 1.0]
    q = torch.tensor(values, dtype=dtype)
    kept = q.clone()
    out = _flush_tiny(q)
    assert out is q  # in place
    expected = kept.where(kept >= floor, torch.zeros((), dtype=dtype))
    assert torch.equal(out, expected)
    assert bool((out[4:] == kept[4:]).all())  # from the floor up, bit for bit
    assert not bool(((out > 0) & (out < tiny)).any())


def _interpolating(
    n: int = 60, k: int = 5, seed: int = 3, spread: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Well-separated logits (the label's N(0, 1) score raised by 6, all times ``spread``): a
    map 10× the identity puts the labels 50–200 nats ahead, so most probabilities there lie
    between float32's subnormals and 1e-19."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    z = torch.randn(n, k, generator=generator, dtype=torch.float64)
    z[torch.arange(n), y] += 6.0
    return spread * z, y


def _whitened_objective(
    problem: _FullProblem, penalty: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    k, a, p, y = problem.k, problem.a, problem.p, problem.y

    def objective(theta: torch.Tensor) -> torch.Tensor:
        vt = theta.view(k, k + 1)
        logq = torch.log_softmax(a @ vt.T, dim=1)
        v = vt @ p
        return -logq[torch.arange(len(y)), y].mean() + (penalty * v * v).sum()

    return objective


def test_the_product_matches_the_dense_hessian_at_an_interpolating_point_for_any_vector_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    z, y = _interpolating()
    x = torch.log_softmax(z, dim=1)
    k = x.shape[1]
    problem = _FullProblem(x, y)
    penalty = penalty_weights("odir", k, 1e-2, 1e-2)
    # 10× the identity with off-diagonal weights that the regulariser pulls back (a gradient
    # that is not already zero)
    start = linear._identity(k)
    start[:, :k] = 10.0 * torch.eye(k) + 0.3 * torch.ones(k, k)
    captured: dict[str, object] = {}

    def capture(times: object, *args: object, **kwargs: object) -> None:
        captured["times"] = times
        raise StopIteration

    monkeypatch.setattr(linear, "_steihaug", capture)
    with pytest.raises(StopIteration):
        problem.solve(penalty, start, 1e-8, 100)
    times = captured["times"]
    assert callable(times)
    theta = torch.from_numpy(problem.to_whitened(start))
    q = torch.softmax(problem.a @ theta.view(k, k + 1).T, dim=1)
    assert bool(((q > 0) & (q < 1e-19)).any()), "the case must hold probabilities to flush"
    dense = torch.autograd.functional.hessian(_whitened_objective(problem, penalty), theta)
    rng = np.random.default_rng(0)
    for _ in range(3):
        v = rng.standard_normal(theta.numel())
        exact = dense.numpy() @ v
        for size in (1.0, 1e-40, 1e30):
            got = times(v * size) / size
            assert np.linalg.norm(got - exact) <= 1e-5 * np.linalg.norm(exact)
    assert not np.any(times(np.zeros(theta.numel())))


def _dense_newton(
    x: torch.Tensor, y: torch.Tensor, penalty: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """min of mean NLL + Σ penalty ⊙ V² over V = [W, b] by scipy's trust-exact with the dense
    float64 Hessian (autograd), from V = 0; returns the objective and V."""
    k = x.shape[1]
    a = torch.cat([x, torch.ones(len(y), 1, dtype=torch.float64)], 1)

    def objective(theta: torch.Tensor) -> torch.Tensor:
        v = theta.view(k, k + 1)
        logq = torch.log_softmax(a @ v.T, dim=1)
        return -logq[torch.arange(len(y)), y].mean() + (penalty * v * v).sum()

    def fun(t: np.ndarray) -> tuple[float, np.ndarray]:
        theta = torch.from_numpy(t).requires_grad_(True)
        value = objective(theta)
        (grad,) = torch.autograd.grad(value, theta)
        return float(value.detach()), grad.numpy()

    def hess(t: np.ndarray) -> np.ndarray:
        return torch.autograd.functional.hessian(objective, torch.from_numpy(t)).numpy()

    result = minimize(
        fun,
        np.zeros(k * (k + 1)),
        jac=True,
        hess=hess,
        method="trust-exact",
        options={"gtol": 1e-13, "maxiter": 2000},
    )
    assert np.abs(result.jac).max() < 1e-10
    return float(result.fun), torch.from_numpy(result.x).view(k, k + 1)


def test_a_nearly_interpolating_dirichlet_fit_reaches_the_dense_newton_minimum() -> None:
    # L2 on every weight (ODIR leaves the diagonal free, and on separable rows its objective
    # then has no minimum): a weak one, so the minimum lies where the rows nearly interpolate
    z, y = _interpolating(n=40, k=4, seed=5, spread=12.0)
    strength = 1e-6
    fit = fit_linear(z, y, "dirichlet", l2_off_diagonal=strength, regulariser="l2")
    assert fit.converged
    x = torch.log_softmax(z, dim=1)
    penalty = penalty_weights("l2", 4, strength, strength)
    value, v = _dense_newton(x, y, penalty)
    assert fit.objective_after == pytest.approx(value, rel=1e-9)
    ours = fit.calibrator.probabilities(z)
    reference = torch.softmax(x @ v[:, :4].T + v[:, 4], dim=1)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    # the case is one the flush acts on: probabilities below 1e-19 at the minimum
    assert bool((reference < 1e-19).any())
