"""Vector scaling's Newton solver: the formed Hessian and the product path reach one minimiser.

Up to ``VECTOR_DENSE_CLASSES`` classes the fit forms the 2K×2K Hessian and takes exact Newton
steps (pseudo-inverse); above, conjugate gradients on Hessian-vector products. Both are checked
here against ground truth written independently: a Hessian built from each row's Jacobian, and a
scipy trust-region minimisation in a reduced parametrisation (fixed reference biases, so its
Hessian is definite) driven to a gradient of 1e-12.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import log_softmax, logsumexp, softmax

from curvcal.calibration import linear
from curvcal.calibration.inputs import InputNames
from curvcal.calibration.linear import fit_linear
from curvcal.errors import InputError
from tests.commands.test_metrics import logits_file, one_line_error

PATHS = ("exact", "products")


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with the formed Hessian at every K, then with products at every K."""
    monkeypatch.setattr(linear, "VECTOR_DENSE_CLASSES", 10**9 if request.param == "exact" else 0)
    yield request.param


def synthetic(n: int, k: int, sharpen: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from softmax(u) with class-dependent offsets; scores sharpen·u
    (over-confident for sharpen > 1, under-confident below)."""
    rng = np.random.default_rng(seed)
    u = 1.5 * rng.standard_normal((n, k)) + 0.3 * rng.standard_normal(k)
    p = softmax(u, axis=1)
    labels = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return sharpen * u, labels


def reference_probabilities(
    x: np.ndarray, y: np.ndarray, fixed: tuple[int, ...] = (0,)
) -> np.ndarray:
    """softmax(w ⊙ x + b) at the minimum of the mean NLL, by scipy's ``trust-exact`` from w = ½,
    b = 0 in the parameters (w, b) with b_j = 0 for j in ``fixed`` (b_0 fixes softmax's common
    shift; a constant column j adds b_j), then plain Newton steps until the largest gradient
    component is under 1e-12 (the gradient decides; the Hessian only speeds the way)."""
    n, k = x.shape
    free = [j for j in range(k) if j not in fixed]
    onehot = np.eye(k)[y]

    def unpack(theta: np.ndarray) -> np.ndarray:
        b = np.zeros(k)
        b[free] = theta[k:]
        return x * theta[:k] + b

    def value(theta: np.ndarray) -> float:
        s = unpack(theta)
        return float(np.mean(logsumexp(s, axis=1) - s[np.arange(n), y]))

    def gradient(theta: np.ndarray) -> np.ndarray:
        g = (softmax(unpack(theta), axis=1) - onehot) / n
        return np.concatenate([(g * x).sum(0), g.sum(0)[free]])

    def hessian(theta: np.ndarray) -> np.ndarray:
        q = softmax(unpack(theta), axis=1)
        a = np.concatenate([q * x, q[:, free]], axis=1)
        d = np.concatenate([(q * x * x).sum(0), q.sum(0)[free]])
        h = np.diag(d) - a.T @ a
        h[np.arange(k, k + len(free)), free] += (q * x).sum(0)[free]
        h[free, np.arange(k, k + len(free))] += (q * x).sum(0)[free]
        return h / n

    theta = np.concatenate([np.full(k, 0.5), np.zeros(len(free))])
    theta = minimize(value, theta, jac=gradient, hess=hessian, method="trust-exact").x
    for _ in range(20):
        if np.abs(gradient(theta)).max() < 1e-12:
            break
        theta = theta - np.linalg.solve(hessian(theta), gradient(theta))
    assert np.abs(gradient(theta)).max() < 1e-12
    return softmax(unpack(theta), axis=1)


def fitted_probabilities(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, linear.LinearFit]:
    fit = fit_linear(torch.from_numpy(x), torch.from_numpy(y), "vector")
    return fit.calibrator.probabilities(torch.from_numpy(x)).numpy(), fit


@pytest.mark.parametrize("k", [2, 10, 100])
@pytest.mark.parametrize("sharpen", [3.0, 0.4])
def test_both_paths_reach_the_independent_minimiser(path: str, k: int, sharpen: float) -> None:
    x, y = synthetic(1500 if k < 100 else 1000, k, sharpen, seed=k)
    ours, fit = fitted_probabilities(x, y)
    assert fit.converged and fit.gradient_max < fit.gradient_tol
    np.testing.assert_allclose(ours, reference_probabilities(x, y), atol=1e-8, rtol=0)


def test_formed_hessian_is_the_definition_and_the_products_agree() -> None:
    rng = np.random.default_rng(5)
    n, k = 37, 4
    x = rng.standard_normal((n, k)) * 3.0
    theta = np.concatenate([rng.uniform(0.2, 1.5, k), rng.standard_normal(k)])
    q = softmax(x * theta[:k] + theta[k:], axis=1)
    truth = np.zeros((2 * k, 2 * k))
    for row in range(n):
        jacobian = np.concatenate([np.diag(x[row]), np.eye(k)], axis=1)
        truth += jacobian.T @ (np.diag(q[row]) - np.outer(q[row], q[row])) @ jacobian / n
    formed = linear._vector_hessian(torch.from_numpy(x), torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(formed, truth, atol=1e-13, rtol=0)
    times, _ = linear._vector_products(torch.from_numpy(x), torch.from_numpy(q))
    for _ in range(3):
        v = rng.standard_normal(2 * k)
        np.testing.assert_allclose(times(v), truth @ v, atol=1e-13, rtol=0)
    shift = np.concatenate([np.zeros(k), np.ones(k)])  # b → b + c·1: the softmax's null direction
    np.testing.assert_allclose(formed @ shift, 0.0, atol=1e-14)


def test_value_and_gradient_are_the_definition() -> None:
    rng = np.random.default_rng(6)
    n, k = 53, 6
    x = rng.standard_normal((n, k)) * 4.0
    y = rng.integers(0, k, n)
    theta = np.concatenate([rng.uniform(0.2, 1.5, k), rng.standard_normal(k)])
    s = x * theta[:k] + theta[k:]
    nll = float(np.mean(-log_softmax(s, axis=1)[np.arange(n), y]))
    g = (softmax(s, axis=1) - np.eye(k)[y]) / n
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    labelled = torch.zeros(k, dtype=torch.float64).index_add_(0, yt, xt[torch.arange(n), yt])
    counts = torch.bincount(yt, minlength=k).to(torch.float64)
    q = torch.empty_like(xt)
    value, gradient = linear._vector_value_gradient(xt, labelled, counts, theta, q)
    assert value == pytest.approx(nll, abs=1e-14)
    np.testing.assert_allclose(gradient, np.concatenate([(g * x).sum(0), g.sum(0)]), atol=1e-15)
    np.testing.assert_allclose(q.numpy(), softmax(s, axis=1), atol=1e-15)


def test_pseudo_inverse_leaves_out_exact_null_directions() -> None:
    # H = diag(3, 2, 0) rotated: H⁺ inverts the two non-zero eigenvalues and maps the null
    # direction to 0 (a regularised or plain inverse would not).
    basis, _ = np.linalg.qr(np.random.default_rng(7).standard_normal((3, 3)))
    h = basis @ np.diag([3.0, 2.0, 0.0]) @ basis.T
    solve = linear._pseudo_inverse(torch.from_numpy(h))
    np.testing.assert_allclose(solve(h @ basis[:, 0]), basis[:, 0], atol=1e-14)
    np.testing.assert_allclose(solve(basis[:, 2]), 0.0, atol=1e-14)


def test_a_constant_column_adds_a_null_direction(path: str) -> None:
    # x_·2 ≡ 1.5: (w_2, b_2) along (1, −1.5) leaves every score unchanged, a second exact null
    # direction besides b → b + c·1; the probabilities are still unique.
    x, y = synthetic(800, 5, 2.0, seed=11)
    x[:, 2] = 1.5
    ours, fit = fitted_probabilities(x, y)
    assert fit.converged
    np.testing.assert_allclose(ours, reference_probabilities(x, y, (0, 2)), atol=1e-8, rtol=0)


def test_saturated_rows(path: str) -> None:
    # A fifth of the rows with logit gaps of hundreds: their softmax is exactly one-hot in
    # float64 at the start (w = 1), some of them wrong.
    x, y = synthetic(1000, 10, 3.0, seed=12)
    x[::5] *= 150.0
    start = softmax(x, axis=1)
    assert (start == 1.0).sum() > 100 and (start == 0.0).sum() > 100
    ours, fit = fitted_probabilities(x, y)
    assert fit.converged and np.isfinite(ours).all()
    np.testing.assert_allclose(ours, reference_probabilities(x, y), atol=1e-8, rtol=0)


def test_a_class_without_fit_rows(path: str) -> None:
    # No label is 3: the NLL falls towards its infimum as b_3 → −∞ (no minimiser); the fit stops
    # once the gradient, ≈ mean q_3, is under the tolerance, and the other classes are then the
    # vector scaling of the remaining four classes.
    x, y = synthetic(1200, 5, 2.0, seed=13)
    keep = y != 3
    x, y = x[keep], y[keep]
    ours, fit = fitted_probabilities(x, y)
    assert fit.converged and fit.gradient_max < fit.gradient_tol
    assert ours[:, 3].mean() < fit.gradient_tol
    others = [0, 1, 2, 4]
    remapped = np.searchsorted(others, y)
    np.testing.assert_allclose(
        ours[:, others], reference_probabilities(x[:, others], remapped), atol=1e-7, rtol=0
    )


@pytest.mark.parametrize(
    ("scores", "labels", "needle"),
    [
        (np.array([[0.0, 1.0], [np.nan, 0.0]]), [0, 1], r"NaN or infinity \(first at row 1\)"),
        (np.array([[0.0, np.inf], [1.0, 0.0]]), [0, 1], r"NaN or infinity \(first at row 0\)"),
        (np.zeros((3, 2)), [0, 2, 1], r"labels must lie in \[0, 2\)"),
        (np.zeros((3, 2)), [0, 1], "labels"),
        (np.zeros(4), [0, 1, 0, 1], "fit.npz"),
    ],
)
def test_bad_inputs_are_still_refused(scores: np.ndarray, labels: list[int], needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        fit_linear(
            torch.from_numpy(scores), torch.tensor(labels), "vector", names=InputNames("fit.npz")
        )


def test_infinite_fit_scores_are_one_line_and_touch_nothing(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 50, 3, seed=3)
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((40, 3))
    logits[9, 0] = -np.inf
    fit = tmp_path / "fit.npz"
    np.savez(fit, logits=logits, labels=rng.integers(0, 3, 40))
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    result = run_cli("metrics", test, "--fit", fit, "--method", "vector", "-o", tmp_path / "r.json")
    one_line_error(result, str(fit), "row 9")
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    assert after == before
