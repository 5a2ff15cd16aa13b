"""The full maps' optional trace: it sees the objective at every point the solver evaluates,
and the fit is the same with or without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, logsumexp

from curvcal.calibration.linear import fit_linear
from curvcal.errors import InputError


def _data(n: int = 400, k: int = 5, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident logits whose labels no linear map separates (label noise)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)) * 2.0
    z[np.arange(n), y] += 3.0
    flip = rng.random(n) < 0.3
    y[flip] = rng.integers(0, k, int(flip.sum()))
    return z, y


def _objective(x: np.ndarray, y: np.ndarray, v: np.ndarray, lam: float, mu: float) -> float:
    """mean_n[logsumexp(s_n) − s_{n,y_n}] + λ Σ_{i≠j} W_ij²/(K(K−1)) + μ Σ_j b_j²/K with
    s = x Wᵀ + b, written from the definition in NumPy float64."""
    k = x.shape[1]
    w, b = v[:, :k], v[:, k]
    s = x @ w.T + b
    nll = float(np.mean(logsumexp(s, axis=1) - s[np.arange(len(y)), y]))
    off = float((w**2).sum() - (np.diag(w) ** 2).sum())
    return nll + lam * off / (k * (k - 1)) + mu * float((b**2).sum()) / k


@pytest.mark.parametrize(("method", "strength"), [("matrix", 0.0), ("dirichlet", 1e-2)])
def test_trace_sees_the_objective_and_changes_nothing(method: str, strength: float) -> None:
    z, y = _data()
    zt, yt = torch.from_numpy(z), torch.from_numpy(y)
    plain = fit_linear(zt, yt, method, l2_off_diagonal=strength, l2_bias=strength)
    seen: list[tuple[float, np.ndarray]] = []
    traced = fit_linear(
        zt,
        yt,
        method,
        l2_off_diagonal=strength,
        l2_bias=strength,
        trace=lambda value, point: seen.append((value, point().numpy())),
    )
    assert traced.calibrator == plain.calibrator  # bit for bit
    assert traced.objective_after == plain.objective_after
    assert traced.iterations == plain.iterations
    assert len(seen) > traced.iterations  # every step evaluates at least once
    x = z if method == "matrix" else log_softmax(z, axis=1)
    for value, v in seen:
        assert value == pytest.approx(_objective(x, y, v, strength, strength), rel=1e-12, abs=1e-14)
    # The first point is the start (the identity map, through the whitening and back), the
    # last the fitted map.
    k = z.shape[1]
    np.testing.assert_allclose(seen[0][1], np.hstack([np.eye(k), np.zeros((k, 1))]), atol=1e-12)
    final = np.hstack(
        [np.array(traced.calibrator.weights), np.array(traced.calibrator.bias)[:, None]]
    )
    np.testing.assert_allclose(seen[-1][1], final, rtol=0, atol=1e-12)
    assert seen[-1][0] == traced.objective_after
    # The path ends at its lowest objective (within the rounding of L) and starts above it.
    assert min(value for value, _ in seen) >= traced.objective_after - 1e-12
    assert seen[0][0] > traced.objective_after + 1e-3


def test_trace_is_refused_for_vector_scaling() -> None:
    z, y = _data()
    with pytest.raises(InputError, match="full maps"):
        fit_linear(
            torch.from_numpy(z), torch.from_numpy(y), "vector", trace=lambda value, point: None
        )
