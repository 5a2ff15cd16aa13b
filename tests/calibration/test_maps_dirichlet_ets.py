"""Dirichlet calibration and ensemble temperature scaling against independent float64
references (scipy on the defining objective) and against probmetrics' ETS."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import log_softmax, logsumexp

from curvcal.calibration.dirichlet import fit_dirichlet
from curvcal.calibration.ensemble import EnsembleMap, fit_ensemble_temperature, simplex_nll_weights
from curvcal.calibration.linear import fit_linear, penalty_weights
from tests.commands.test_metrics import as_json, logits_file


def synthetic(n: int, k: int, sharpen: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from softmax(u) with class offsets; logits sharpen·u (over-confident for
    sharpen > 1, under-confident below)."""
    rng = np.random.default_rng(seed)
    u = 1.5 * rng.standard_normal((n, k)) + 0.3 * rng.standard_normal(k)
    p = np.exp(log_softmax(u, axis=1))
    labels = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return sharpen * u, labels


def dirichlet_reference(
    logp: np.ndarray, y: np.ndarray, regulariser: str, strength: float
) -> np.ndarray:
    """The Dirichlet objective written in NumPy (mean NLL of softmax(W log p + b) plus the
    regulariser written out from its definition), minimised by scipy's trust-region Newton
    with exact Hessian-vector products from W = 0.5·I; returns the fitted probabilities."""
    n, k = logp.shape
    a = np.hstack([logp, np.ones((n, 1))])
    c = np.zeros((k, k + 1))
    if regulariser == "odir":
        c[:, :k] = strength / (k * (k - 1))
        c[np.arange(k), np.arange(k)] = 0.0
        c[:, k] = strength / k
    else:
        c[:] = strength / (k * (k + 1))
    onehot = np.eye(k)[y]

    def value_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        v = theta.reshape(k, k + 1)
        s = a @ v.T
        lse = logsumexp(s, axis=1)
        value = np.mean(lse - s[np.arange(n), y]) + np.sum(c * v * v)
        g = (np.exp(s - lse[:, None]) - onehot) / n
        return value, (g.T @ a + 2 * c * v).ravel()

    def hessp(theta: np.ndarray, d: np.ndarray) -> np.ndarray:
        v, dv = theta.reshape(k, k + 1), d.reshape(k, k + 1)
        q = np.exp(log_softmax(a @ v.T, axis=1))
        ds = a @ dv.T
        r = q * ds - q * (q * ds).sum(1, keepdims=True)
        return (r.T @ a / n + 2 * c * dv).ravel()

    start = np.hstack([0.5 * np.eye(k), np.zeros((k, 1))]).ravel()
    result = minimize(
        value_and_gradient,
        start,
        jac=True,
        hessp=hessp,
        method="trust-krylov",
        options={"gtol": 1e-11, "maxiter": 500},
    )
    v = result.x.reshape(k, k + 1)
    return np.exp(log_softmax(a @ v.T, axis=1))


@pytest.mark.parametrize("regulariser", ["odir", "l2"])
@pytest.mark.parametrize(("k", "sharpen"), [(2, 3.0), (10, 0.4), (10, 3.0), (50, 2.0)])
def test_dirichlet_matches_an_independent_minimisation(
    regulariser: str, k: int, sharpen: float
) -> None:
    n = 3000 if k < 50 else 2500
    z, y = synthetic(n, k, sharpen, seed=k)
    strength = 0.1
    fit = fit_linear(
        torch.from_numpy(z),
        torch.from_numpy(y),
        "dirichlet",
        l2_off_diagonal=strength,
        l2_bias=strength,
        regulariser=regulariser,
    )
    assert fit.converged and fit.input == "log-probabilities" and fit.regulariser == regulariser
    ours = fit.calibrator.probabilities(torch.from_numpy(z)).numpy()
    reference = dirichlet_reference(log_softmax(z, axis=1), y, regulariser, strength)
    np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)


def test_dirichlet_on_logits_is_matrix_scaling_of_log_probabilities() -> None:
    # The two maps differ on logits (W z vs W log p) and coincide on log p.
    z, y = synthetic(800, 4, 2.0, seed=3)
    logp = log_softmax(z, axis=1)
    dirichlet = fit_linear(torch.from_numpy(z), torch.from_numpy(y), "dirichlet")
    matrix_logp = fit_linear(torch.from_numpy(logp), torch.from_numpy(y), "matrix")
    matrix_logits = fit_linear(torch.from_numpy(z), torch.from_numpy(y), "matrix")
    ours = dirichlet.calibrator.probabilities(torch.from_numpy(z)).numpy()
    np.testing.assert_allclose(
        ours, matrix_logp.calibrator.probabilities(torch.from_numpy(logp)).numpy(), atol=1e-7
    )
    other = matrix_logits.calibrator.probabilities(torch.from_numpy(z)).numpy()
    assert np.abs(ours - other).max() > 1e-3


def test_penalty_weights_are_the_papers_regularisers() -> None:
    odir = penalty_weights("odir", 3, 6.0, 3.0).numpy()
    np.testing.assert_array_equal(np.diag(odir[:, :3]), 0.0)
    assert odir[0, 1] == 6.0 / 6 and odir[0, 3] == 3.0 / 3
    l2 = penalty_weights("l2", 3, 12.0, 0.0).numpy()
    np.testing.assert_array_equal(l2, np.full((3, 4), 1.0))


def test_dirichlet_cross_validation_records_the_grid() -> None:
    z, y = synthetic(600, 3, 2.0, seed=7)
    for regulariser in ("odir", "l2"):
        fit = fit_dirichlet(torch.from_numpy(z), torch.from_numpy(y), regulariser=regulariser)
        assert fit.method == "dirichlet" and fit.cv_folds == 5 and fit.converged
        best = min(range(len(fit.cv_nll)), key=lambda i: (fit.cv_nll[i], -fit.cv_strengths[i]))
        assert fit.l2_off_diagonal == fit.cv_strengths[best]


def ets_reference(logp: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """T by a bounded scalar search on the NLL of softmax(log p / T), then the weights by
    SLSQP on the simplex, on the full N×K mixture (not only the true class's column)."""
    from scipy.optimize import minimize_scalar

    n, k = logp.shape
    rows = np.arange(n)

    def nll_t(log_t: float) -> float:
        return -log_softmax(logp / np.exp(log_t), axis=1)[rows, y].mean()

    t = float(
        np.exp(
            minimize_scalar(
                nll_t,
                bounds=(np.log(0.01), np.log(100)),
                method="bounded",
                options={"xatol": 1e-12},
            ).x
        )
    )
    parts = [np.exp(log_softmax(logp / t, axis=1)), np.exp(logp), np.full((n, k), 1.0 / k)]

    def nll_w(w: np.ndarray) -> float:
        mixed = sum(wi * p for wi, p in zip(w, parts, strict=True))
        return -np.log(mixed[rows, y]).mean()

    result = minimize(
        nll_w,
        np.full(3, 1 / 3),
        method="SLSQP",
        bounds=[(0, 1)] * 3,
        constraints={"type": "eq", "fun": lambda w: w.sum() - 1},
        options={"ftol": 1e-15},
    )
    return t, result.x


@pytest.mark.parametrize(("k", "sharpen"), [(2, 3.0), (10, 0.5), (10, 3.0), (100, 2.0)])
def test_ets_matches_an_independent_fit(k: int, sharpen: float) -> None:
    z, y = synthetic(2000, k, sharpen, seed=k + 1)
    fit = fit_ensemble_temperature(torch.from_numpy(z), torch.from_numpy(y))
    t, w = ets_reference(log_softmax(z, axis=1), y)
    assert fit.temperature == pytest.approx(t, rel=1e-6)
    np.testing.assert_allclose(fit.weights, w, atol=1e-5)
    assert fit.nll_after <= fit.nll_ts + 1e-12 and fit.nll_after <= fit.nll_before + 1e-12


def test_ets_agrees_with_probmetrics(monkeypatch: pytest.MonkeyPatch) -> None:
    # probmetrics.calibrators imports numba (not installed) for maps ETS does not use: a
    # stand-in whose njit leaves functions as they are lets the package import.
    import types

    if "numba" not in sys.modules:
        stub = types.ModuleType("numba")
        stub.njit = lambda *args, **kwargs: args[0] if args and callable(args[0]) else (lambda f: f)  # type: ignore[attr-defined]
        stub.prange = range  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "numba", stub)
    from probmetrics.calibrators.temperature_scaling import ETSCalibrator

    z, y = synthetic(3000, 10, 1.5, seed=4)
    probs = np.exp(log_softmax(z, axis=1))
    ours = fit_ensemble_temperature(torch.from_numpy(probs), torch.from_numpy(y), kind="probs")
    assert 0.05 < ours.temperature < 5  # inside probmetrics' bracket for T
    peer = ETSCalibrator(loss="ce").fit(probs, y)
    assert ours.temperature == pytest.approx(peer.t_, rel=1e-4)
    # The weights' NLL is flat near its minimum and SLSQP stops early there (weights apart by
    # up to 1e-2 here): ours must score no worse on the peer's own objective, and predict alike.
    theirs = EnsembleMap(
        ours.temperature, tuple(np.clip(peer.w_, 0, None) / np.clip(peer.w_, 0, None).sum())
    )
    rows = np.arange(len(y))
    nll_ours = -np.log(
        ours.calibrator.probabilities(torch.from_numpy(probs), "probs").numpy()[rows, y]
    ).mean()
    nll_theirs = -np.log(
        theirs.probabilities(torch.from_numpy(probs), "probs").numpy()[rows, y]
    ).mean()
    assert nll_ours <= nll_theirs + 1e-12
    np.testing.assert_allclose(
        ours.calibrator.probabilities(torch.from_numpy(probs), "probs").numpy(),
        peer.predict_proba(probs),
        atol=5e-3,
    )


def test_simplex_weights_on_hand_worked_cases() -> None:
    # One component gives the true class probability 1 everywhere: all weight on it.
    a = np.array([[0.2, 1.0, 0.5], [0.9, 1.0, 0.5]])
    assert simplex_nll_weights(a) == (0.0, 1.0, 0.0)
    # Two samples, two components, a = (1, 0) and (0, 1): −½[log t + log(1 − t)], t = ½.
    a = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(simplex_nll_weights(a), (0.5, 0.5, 0.0), atol=1e-12)


def test_ets_on_ties_and_saturated_rows() -> None:
    z, y = synthetic(600, 5, 2.0, seed=9)
    z[:100] = 0.0  # tied rows: every component is uniform on them
    z[100:150, 0] = 800.0  # saturated rows: p = (1, 0, …, 0)
    fit = fit_ensemble_temperature(torch.from_numpy(z), torch.from_numpy(y))
    q = fit.calibrator.probabilities(torch.from_numpy(z)).numpy()
    assert np.isfinite(q).all()
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(q[:100], 0.2, atol=1e-12)
    assert np.isfinite(fit.nll_after)


@pytest.mark.parametrize("method", ["dirichlet", "dirichlet-l2", "ets"])
def test_fit_save_and_apply_through_metrics(run_cli, tmp_path: Path, method: str) -> None:
    stage = method.replace("-", "_")
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", method, "--save-calibrator", calibrator, "--json")
    fitted = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    assert set(fitted["evaluation"]) == {"uncalibrated", "ts", "focal_ts", stage}
    assert fitted["evaluation"][stage]["nll"] < fitted["evaluation"]["uncalibrated"]["nll"]
    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.3" and stage in saved
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    for metric in ("ece", "nll", "brier"):
        assert applied["evaluation"][stage][metric] == pytest.approx(
            fitted["evaluation"][stage][metric], rel=1e-12
        )
    table = run_cli("metrics", test, "--fit", fit, "--method", method)
    title = "ensemble temperature scaling" if method == "ets" else "linear maps"
    assert table.code == 0 and title in table.stdout


def test_policy_gates_the_new_stages(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    for method in ("dirichlet-l2", "ets"):
        stage = method.replace("-", "_")
        report = tmp_path / f"{stage}.json"
        assert run_cli("metrics", test, "--fit", fit, "--method", method, "-o", report).code == 0
        ece = json.loads(report.read_text())["results"]["evaluation"][stage]["ece"]
        policy = tmp_path / "gate.toml"
        policy.write_text(f"[{stage}.ece]\nmax = {ece + 1e-9}\n")
        assert run_cli("compare", report, report, "--policy", policy).code == 0
        policy.write_text(f"[{stage}.ece]\nmax = {ece - 1e-9}\n")
        assert run_cli("compare", report, report, "--policy", policy).code == 1
