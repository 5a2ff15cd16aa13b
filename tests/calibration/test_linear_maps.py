"""Vector and matrix scaling against an independent float64 fit, and their border cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg
from scipy.special import log_softmax, logsumexp

from curvcal.calibration.inputs import InputNames
from curvcal.calibration.linear import (
    L2_BIAS,
    L2_OFF_DIAGONAL,
    MAX_MATRIX_CLASSES,
    ODIR_GRID,
    LinearMap,
    cv_folds,
    fit_linear,
    fit_matrix_odir,
    matrix_memory_bytes,
)
from curvcal.calibration.scaling import fit_temperature
from curvcal.errors import InputError


def synthetic(n: int, k: int, sharpen: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from softmax(u) with class-dependent offsets; scores sharpen·u
    (over-confident for sharpen > 1, under-confident below)."""
    rng = np.random.default_rng(seed)
    u = 1.5 * rng.standard_normal((n, k)) + 0.3 * rng.standard_normal(k)
    p = np.exp(log_softmax(u, axis=1))
    labels = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return sharpen * u, labels


def reference_fit(z: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    """The same objective written in NumPy, minimised from another start (w = 0.5,
    W = 0.5·I, plus noise; b = noise) by scipy's L-BFGS-B, then by Newton steps whose systems
    are solved by conjugate gradients with exact Hessian-vector products (no line search, so
    the gradient falls to rounding level); returns the fitted probabilities."""
    n, k = z.shape
    onehot = np.eye(k)[y]
    rng = np.random.default_rng(99)
    shape = (k,) if method == "vector" else (k, k)
    size = int(np.prod(shape))
    lam_od, lam_b = (L2_OFF_DIAGONAL, L2_BIAS) if method == "matrix" else (0.0, 0.0)
    mask = 1.0 - np.eye(k)
    pairs = max(k * (k - 1), 1)

    def linear(w: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (z * w if method == "vector" else z @ w.T) + b

    def scores(theta: np.ndarray) -> np.ndarray:
        return linear(theta[:size].reshape(shape), theta[size:])

    def back(g: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        gw = (g * z).sum(0) if method == "vector" else g.T @ z
        gw = gw + 2 * lam_od * w * mask / pairs if method == "matrix" else gw
        gb = g.sum(0) + (2 * lam_b * b / k if method == "matrix" else 0.0)
        return np.concatenate([gw.ravel(), gb])

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:size].reshape(shape), theta[size:]
        s = scores(theta)
        lse = logsumexp(s, axis=1)
        value = np.mean(lse - s[np.arange(n), y])
        if method == "matrix":
            value += lam_od * np.sum((w * mask) ** 2) / pairs + lam_b * np.sum(b**2) / k
        return value, back((np.exp(s - lse[:, None]) - onehot) / n, w, b)

    def newton_step(theta: np.ndarray) -> np.ndarray:
        q = np.exp(log_softmax(scores(theta), axis=1))

        def hessian_times(v: np.ndarray) -> np.ndarray:
            dw, db = v[:size].reshape(shape), v[size:]
            ds = linear(dw, db)
            r = q * ds - q * (q * ds).sum(1, keepdims=True)
            product = back(r / n, dw, db)
            if method == "vector":  # a common shift of b changes nothing: make H definite
                product[size:] += db.mean()
            return product

        operator = LinearOperator((theta.size, theta.size), hessian_times, dtype=np.float64)
        step, _ = cg(operator, objective(theta)[1], rtol=1e-13, maxiter=10 * theta.size)
        return theta - step

    start_w = np.full(k, 0.5) if method == "vector" else 0.5 * np.eye(k)
    start_w = start_w + 0.01 * rng.standard_normal(shape)
    theta = np.concatenate([start_w.ravel(), 0.1 * rng.standard_normal(k)])
    options = {"gtol": 1e-7, "ftol": 0.0, "maxiter": 50_000}
    theta = minimize(objective, theta, jac=True, method="L-BFGS-B", options=options).x
    for _ in range(12):
        if np.abs(objective(theta)[1]).max() < 1e-12:
            break
        theta = newton_step(theta)
    assert np.abs(objective(theta)[1]).max() < 1e-11
    return np.exp(log_softmax(scores(theta), axis=1))


# matrix scaling's largest case is K = 40 (1,640 parameters): at K = 100 the reference's own
# L-BFGS on 10,100 parameters took minutes, and K = 100 is covered by vector scaling here and by
# the same-objective agreement with torch-uncertainty's DirichletScaler
@pytest.mark.parametrize(
    ("method", "k"),
    [("vector", 2), ("vector", 10), ("vector", 100), ("matrix", 2), ("matrix", 10), ("matrix", 40)],
)
@pytest.mark.parametrize("sharpen", [3.0, 0.4])
def test_fit_matches_an_independent_minimisation(method: str, k: int, sharpen: float) -> None:
    n = 3000 if k < 100 else 2000
    z, y = synthetic(n, k, sharpen, seed=k)
    fit = fit_linear(torch.from_numpy(z), torch.from_numpy(y), method)
    assert fit.converged and fit.gradient_max < fit.gradient_tol
    assert fit.nll_after < fit.nll_before
    ours = fit.calibrator.probabilities(torch.from_numpy(z)).numpy()
    np.testing.assert_allclose(ours, reference_fit(z, y, method), atol=1e-6, rtol=0)


def test_vector_scaling_of_class_symmetric_data_is_temperature_scaling() -> None:
    # Every sample appears with all K cyclic shifts of its scores and label: the NLL is then
    # invariant under permuting the classes cyclically, so its (unique up to a shift)
    # minimiser has every w_k equal and every b_k equal: vector scaling is TS exactly.
    base, labels = synthetic(300, 4, 2.5, seed=5)
    z = np.concatenate([np.roll(base, r, axis=1) for r in range(4)])
    y = np.concatenate([(labels + r) % 4 for r in range(4)])
    fit = fit_linear(torch.from_numpy(z), torch.from_numpy(y), "vector")
    ts = fit_temperature(torch.from_numpy(z), torch.from_numpy(y))
    assert fit.converged
    np.testing.assert_allclose(fit.calibrator.weights, [1 / ts.temperature] * 4, rtol=1e-6)
    np.testing.assert_allclose(fit.calibrator.bias, [0.0] * 4, atol=1e-7)
    assert fit.nll_after == pytest.approx(ts.nll_after, abs=1e-12)


def test_probabilities_input_scales_log_probabilities() -> None:
    z, y = synthetic(500, 3, 2.0, seed=1)
    probs = np.exp(log_softmax(z, axis=1))
    fit = fit_linear(torch.from_numpy(probs), torch.from_numpy(y), "matrix", kind="probs")
    assert fit.input == "log-probabilities" and fit.converged
    on_logp = fit_linear(torch.from_numpy(log_softmax(z, axis=1)), torch.from_numpy(y), "matrix")
    np.testing.assert_allclose(
        fit.calibrator.probabilities(torch.from_numpy(probs), "probs").numpy(),
        on_logp.calibrator.probabilities(torch.from_numpy(log_softmax(z, axis=1))).numpy(),
        atol=1e-9,
    )


@pytest.mark.parametrize(
    ("saved", "needle"),
    [
        (
            {"method": "vector", "weights": [1, 2], "bias": [0, 0, 0]},
            "bias has 3 entries where K = 2",
        ),
        ({"method": "matrix", "weights": [[1, 0], [0]], "bias": [0, 0]}, "rows of one length"),
        ({"method": "vector", "weights": ["1", 2], "bias": [0, 0]}, "numbers only"),
        ({"method": "vector", "weights": [1, True], "bias": [0, 0]}, "numbers only"),
        ({"method": "vector", "weights": [1, 1e400], "bias": [0, 0]}, "finite"),
        ({"method": "vector", "weights": [1, 1], "bias": [0, 0], "code": "x"}, "unknown"),
        ({"method": "affine", "weights": [1], "bias": [0]}, "unknown method"),
        ({"method": "vector", "bias": [0]}, "missing"),
    ],
)
def test_bad_saved_forms_are_refused(saved: dict, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        LinearMap.from_dict(saved, "cal.json")


def test_applying_to_another_class_count_is_refused() -> None:
    fitted = LinearMap("vector", (1.0, 1.0), (0.0, 0.0))
    with pytest.raises(InputError, match="has 3 classes but the vector scaling map has 2"):
        fitted.apply(torch.zeros(4, 3))


def test_nan_scores_and_bad_labels_go_through_the_validation() -> None:
    z = torch.zeros(5, 3, dtype=torch.float64)
    z[2, 1] = float("nan")
    with pytest.raises(InputError, match=r"NaN or infinity \(first at row 2\)"):
        fit_linear(z, torch.zeros(5, dtype=torch.int64), "vector", names=InputNames("fit.npz"))
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
        fit_linear(torch.zeros(2, 3), torch.tensor([0, 3]), "matrix")


def test_one_class_present_is_fitted_without_failing() -> None:
    # Every label 0: the NLL falls towards 0 along b_0 → ∞, so the fit stops at the cap of
    # iterations or at the tolerance, with finite numbers and says which.
    z, _ = synthetic(200, 3, 1.0, seed=3)
    fit = fit_linear(torch.from_numpy(z), torch.zeros(200, dtype=torch.int64), "vector")
    assert np.isfinite(fit.nll_after) and fit.nll_after < fit.nll_before
    assert fit.converged == (fit.gradient_max < fit.gradient_tol)


def test_matrix_scaling_memory_bound() -> None:
    # K² + K float64 parameters with the gradient, 2·10 L-BFGS history vectors, scipy's work
    # copies and the four (K+1)×(K+1) whitening matrices: 30 parameter-sized float64 arrays.
    assert matrix_memory_bytes(1000) == 8 * 30 * (1000 * 1000 + 1000)
    assert 0.24e9 < matrix_memory_bytes(1000) < 0.25e9
    k = MAX_MATRIX_CLASSES + 1
    with pytest.raises(InputError, match=f"{k} classes need .* GB"):
        fit_linear(torch.zeros(3, k), torch.tensor([0, 1, 2]), "matrix")


def test_cv_folds_are_stratified_and_seeded() -> None:
    _, y = synthetic(503, 4, 1.0, seed=6)
    folds = cv_folds(torch.from_numpy(y), 5, seed=1)
    for cls in range(4):
        sizes = np.bincount(folds[y == cls], minlength=5)
        assert sizes.max() - sizes.min() <= 1
    assert np.array_equal(folds, cv_folds(torch.from_numpy(y), 5, seed=1))
    assert not np.array_equal(folds, cv_folds(torch.from_numpy(y), 5, seed=2))


def test_odir_strength_is_the_cross_validated_minimum() -> None:
    z, y = synthetic(600, 3, 2.0, seed=7)
    fit = fit_matrix_odir(torch.from_numpy(z), torch.from_numpy(y), seed=3)
    # the strengths tried: the grid from the largest down, to where the walk stopped
    assert fit.cv_folds == 5 and fit.cv_strengths == ODIR_GRID[-len(fit.cv_strengths) :]
    # each held-out NLL again, from the fitted weights with SciPy's log_softmax
    folds = cv_folds(torch.from_numpy(y), 5, seed=3)
    for strength, recorded in zip(fit.cv_strengths, fit.cv_nll, strict=True):
        total = 0.0
        for f in range(5):
            train, test = folds != f, folds == f
            fitted = fit_linear(
                torch.from_numpy(z[train]),
                torch.from_numpy(y[train]),
                "matrix",
                l2_off_diagonal=strength,
                l2_bias=strength,
            ).calibrator
            w, b = np.array(fitted.weights), np.array(fitted.bias)
            logq = log_softmax(z[test] @ w.T + b, axis=1)
            total -= logq[np.arange(test.sum()), y[test]].sum()
        assert recorded == pytest.approx(total / len(y), rel=1e-10)
    best = int(np.argmin(fit.cv_nll))
    assert fit.l2_off_diagonal == fit.l2_bias == fit.cv_strengths[best]


def test_odir_falls_back_to_the_fixed_strength_on_a_small_split() -> None:
    z, y = synthetic(40, 3, 2.0, seed=8)
    y[y == 2] = 0
    y[:3] = 2  # class 2: 3 samples, fewer than 2 per fold
    fit = fit_matrix_odir(torch.from_numpy(z), torch.from_numpy(y))
    assert fit.cv_folds == 0 and fit.l2_off_diagonal == L2_OFF_DIAGONAL
