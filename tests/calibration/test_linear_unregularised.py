"""Full maps with no regulariser (λ = 0): the mean NLL ignores a common shift of every
class's row of [W, b] (softmax ignores it), so the minimiser is a line, and the fit must
neither wander along it nor stop short of the minimum in the other directions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg
from scipy.special import log_softmax, logsumexp

from curvcal.calibration.linear import fit_linear
from tests.calibration.test_linear_maps import synthetic


def _map(fit) -> np.ndarray:
    """[W, b] of a fitted full map, K×(K+1)."""
    weights = np.array(fit.calibrator.weights)
    return np.hstack([weights, np.array(fit.calibrator.bias)[:, None]])


def reference_probabilities(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin mean NLL of softmax(x Wᵀ + b), written in NumPy: scipy's L-BFGS-B from 0.5·I
    plus noise, then Newton steps by conjugate gradients on exact Hessian-vector products with
    the common-shift direction made definite (it changes no probability); the probabilities."""
    n, k = x.shape
    a = np.hstack([x, np.ones((n, 1))])
    onehot = np.eye(k)[y]
    rng = np.random.default_rng(7)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        s = a @ theta.reshape(k, k + 1).T
        lse = logsumexp(s, axis=1)
        gradient = (np.exp(s - lse[:, None]) - onehot).T @ a / n
        return float(np.mean(lse - s[np.arange(n), y])), gradient.ravel()

    theta = np.hstack([0.5 * np.eye(k), np.zeros((k, 1))]) + 0.01 * rng.standard_normal((k, k + 1))
    options = {"gtol": 1e-8, "ftol": 0.0, "maxiter": 50_000}
    theta = minimize(objective, theta.ravel(), jac=True, method="L-BFGS-B", options=options).x
    for _ in range(12):
        gradient = objective(theta)[1]
        if np.abs(gradient).max() < 1e-12:
            break
        q = np.exp(log_softmax(a @ theta.reshape(k, k + 1).T, axis=1))

        def hessian_times(v: np.ndarray, q: np.ndarray = q) -> np.ndarray:
            dv = v.reshape(k, k + 1)
            ds = a @ dv.T
            r = q * ds - q * (q * ds).sum(1, keepdims=True)
            return (r.T @ a / n + dv.mean(0, keepdims=True)).ravel()

        operator = LinearOperator((theta.size,) * 2, hessian_times, dtype=np.float64)
        theta = theta - cg(operator, gradient, rtol=1e-13, maxiter=10 * theta.size)[0]
    assert np.abs(objective(theta)[1]).max() < 1e-11
    return np.exp(log_softmax(a @ theta.reshape(k, k + 1).T, axis=1))


@pytest.mark.parametrize(("method", "k"), [("matrix", 5), ("dirichlet", 5), ("matrix", 20)])
def test_unregularised_fit_is_the_minimum(method: str, k: int) -> None:
    z, y = synthetic(4000, k, 3.0, seed=k)
    fit = fit_linear(
        torch.from_numpy(z), torch.from_numpy(y), method, l2_off_diagonal=0.0, l2_bias=0.0
    )
    assert fit.converged
    x = z if method == "matrix" else log_softmax(z, axis=1)
    ours = fit.calibrator.probabilities(torch.from_numpy(z)).numpy()
    np.testing.assert_allclose(ours, reference_probabilities(x, y), atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["matrix", "dirichlet"])
def test_unregularised_fit_does_not_move_along_the_common_shift(method: str) -> None:
    """The class mean of [W, b] stays the identity start's (1/K on W's columns, 0 on b): the
    fit changes the map only in directions that change a probability. Before, the steps ran
    along the shift (max |W| 10²–10³ for maps whose probabilities need |W| < 10)."""
    k = 30
    z, y = synthetic(6000, k, 3.0, seed=1)
    fit = fit_linear(
        torch.from_numpy(z), torch.from_numpy(y), method, l2_off_diagonal=0.0, l2_bias=0.0
    )
    assert fit.converged
    v = _map(fit)
    start = np.hstack([np.full(k, 1.0 / k), [0.0]])
    np.testing.assert_allclose(v.mean(0), start, rtol=0, atol=1e-7)  # whitening round trip
    assert np.abs(v).max() < 20.0
