"""Histogram binning, isotonic regression, Platt and beta calibration against the peers'
own implementations (scikit-learn, netcal 1.4) fitted on the same data, and hand-worked cases.

Measured agreement (largest |Δ probability| on the evaluation rows, 2,000 fit / 1,000
evaluation samples, over- and under-confident, K = 2, 10, 100): isotonic vs scikit-learn
``IsotonicRegression(out_of_bounds="clip")`` 1e-12 (top-label and one-vs-rest renormalised);
isotonic one-vs-rest vs netcal 1e-13; equal-width histogram binning vs netcal
``HistogramBinning`` 2e-16 (top-label and one-vs-rest); Platt vs scikit-learn's sigmoid
calibration 4e-10; beta vs the reference procedure on ``LogisticRegression(C=99999999999)``
2e-9 and netcal ``BetaCalibration`` 1e-5 (its optimiser's tolerance). Documented convention:
Platt's smoothed targets move the map by 1.5e-3 from the unsmoothed logistic fit (netcal's
``LogisticCalibration``, ``LogisticRegression`` with a large C) at N = 2,000.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from curvcal.calibration.binary import binary_features, fit_binary
from curvcal.calibration.binning import bin_of, fit_histogram
from curvcal.calibration.isotonic import fit_isotonic, isotonic_points
from tests.calibration.test_linear_maps import synthetic

sklearn_isotonic = pytest.importorskip("sklearn.isotonic")
sklearn_calibration = pytest.importorskip("sklearn.calibration")
sklearn_linear = pytest.importorskip("sklearn.linear_model")
netcal_binning = pytest.importorskip("netcal.binning")
netcal_scaling = pytest.importorskip("netcal.scaling")

CASES = [(k, sharpen) for k in (2, 10, 100) for sharpen in (3.0, 0.5)]


def split(k: int, sharpen: float, seed: int = 1) -> tuple[np.ndarray, ...]:
    z, y = synthetic(3000, k, sharpen, seed)
    return z[:2000], y[:2000], z[2000:], y[2000:]


def top(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    logp = log_softmax(z, axis=1)
    return np.exp(logp.max(1)), logp.argmax(1), np.exp(logp)


def quiet(call):  # netcal prints and warns
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        return call()


def isotonic_reference(x: np.ndarray, t: np.ndarray, new: np.ndarray) -> np.ndarray:
    model = sklearn_isotonic.IsotonicRegression(out_of_bounds="clip")
    return model.fit(x, t).predict(new)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_isotonic_top_label_is_sklearns(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    c, pred, _ = top(zf)
    ce, _, _ = top(ze)
    fit = fit_isotonic(torch.tensor(zf), torch.tensor(yf))
    ours = np.interp(ce, fit.calibrator.x[0], fit.calibrator.y[0])
    reference = isotonic_reference(c, (pred == yf).astype(float), ce)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-11)


@pytest.mark.parametrize("k", [10, 100])
@pytest.mark.parametrize("sharpen", [3.0, 0.5])
def test_isotonic_one_vs_rest_is_sklearns_and_netcals(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    _, _, p = top(zf)
    _, _, pe = top(ze)
    q = fit_isotonic(torch.tensor(zf), torch.tensor(yf), "isotonic-ovr").calibrator
    ours = q.probabilities(torch.tensor(ze)).numpy()
    f = np.stack(
        [isotonic_reference(p[:, j], (yf == j).astype(float), pe[:, j]) for j in range(k)], 1
    )
    total = f.sum(1, keepdims=True)
    reference = np.where(total > 0, f / np.where(total > 0, total, 1), 1 / k)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)
    netcal = quiet(lambda: netcal_binning.IsotonicRegression().fit(p, yf).transform(pe))
    np.testing.assert_allclose(ours, netcal, rtol=0, atol=1e-12)


def test_isotonic_ties_and_saturated_rows_as_sklearn() -> None:
    rng = np.random.default_rng(5)
    z, y = synthetic(2000, 10, 3.0, 4)
    z[:300] = np.repeat(z[:30], 10, axis=0)  # repeated rows: tied confidences
    z[300:400, 0] += 60.0  # saturated: confidence 1 in float64
    c, pred, _ = top(z)
    assert (c == 1.0).sum() >= 50 and len(np.unique(c)) <= len(c) - 250
    target = (pred == y).astype(float)
    fit = fit_isotonic(torch.tensor(z), torch.tensor(y))
    new = np.concatenate([c, rng.random(500)])
    ours = np.interp(new, fit.calibrator.x[0], fit.calibrator.y[0])
    np.testing.assert_allclose(ours, isotonic_reference(c, target, new), rtol=0, atol=1e-12)
    # scikit-learn's tie rule: scores within 1e-15 of their group's first score are one point
    x = np.array([0.2, 0.2 + 4e-16, 0.2 + 8e-16, 0.2 + 1.2e-15, 0.5])
    t = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    px, py = isotonic_points(x, t)
    np.testing.assert_allclose(np.interp(x, px, py), isotonic_reference(x, t, x), atol=1e-15)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_equal_width_histogram_is_netcals(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    c, pred, p = top(zf)
    ce, _, pe = top(ze)
    fit = fit_histogram(torch.tensor(zf), torch.tensor(yf), n_bins=10, scheme="equal-width")
    edges, values = np.asarray(fit.calibrator.edges[0]), np.asarray(fit.calibrator.values[0])
    netcal = quiet(
        lambda: (
            netcal_binning.HistogramBinning(bins=10).fit(c, (pred == yf).astype(int)).transform(ce)
        )
    )
    np.testing.assert_allclose(values[bin_of(ce, edges)], netcal, rtol=0, atol=1e-15)
    if k > 2:  # netcal's multiclass mode is one-vs-rest, renormalised
        ovr = fit_histogram(
            torch.tensor(zf), torch.tensor(yf), "histogram-ovr", n_bins=10, scheme="equal-width"
        )
        ours = ovr.calibrator.probabilities(torch.tensor(ze)).numpy()
        netcal = quiet(lambda: netcal_binning.HistogramBinning(bins=10).fit(p, yf).transform(pe))
        np.testing.assert_allclose(ours, netcal, rtol=0, atol=1e-14)


@pytest.mark.parametrize("sharpen", [3.0, 0.5])
def test_platt_is_sklearns_sigmoid_and_differs_from_unsmoothed_by_its_targets(
    sharpen: float,
) -> None:
    zf, yf, ze, _ = split(2, sharpen)
    x, xe = zf[:, 1] - zf[:, 0], ze[:, 1] - ze[:, 0]
    fit = fit_binary(torch.tensor(zf), torch.tensor(yf), "platt")
    assert fit.converged
    ours = fit.calibrator.probabilities(torch.tensor(ze)).numpy()[:, 1]
    a, b = sklearn_calibration._sigmoid_calibration(x, yf)
    np.testing.assert_allclose(ours, 1 / (1 + np.exp(a * xe + b)), rtol=0, atol=1e-8)
    # unsmoothed maximum likelihood (netcal; LogisticRegression with a large C): the targets
    # (N_1+1)/(N_1+2), 1/(N_0+2) move the map by O(1/N)
    model = sklearn_linear.LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000)
    unsmoothed = model.fit(x[:, None], yf).predict_proba(xe[:, None])[:, 1]
    gap = np.abs(ours - unsmoothed).max()
    assert 1e-5 < gap < 5 / len(yf)
    _, _, p = top(zf)
    _, _, pe = top(ze)
    netcal = quiet(
        lambda: netcal_scaling.LogisticCalibration().fit(p[:, 1], yf).transform(pe[:, 1])
    )
    assert np.abs(netcal - unsmoothed).max() < 1e-4


@pytest.mark.parametrize("sharpen", [3.0, 0.5])
def test_beta_is_the_reference_procedure_and_netcals(sharpen: float) -> None:
    zf, yf, ze, _ = split(2, sharpen)
    fit = fit_binary(torch.tensor(zf), torch.tensor(yf), "beta")
    assert fit.converged
    ours = fit.calibrator.probabilities(torch.tensor(ze)).numpy()[:, 1]
    features = binary_features(torch.tensor(log_softmax(zf, 1)), "beta")
    new = binary_features(torch.tensor(log_softmax(ze, 1)), "beta")

    def lr(columns: list[int]) -> np.ndarray:
        model = sklearn_linear.LogisticRegression(C=99999999999, tol=1e-12, max_iter=10_000)
        model.fit(features[:, columns], yf)
        return model

    both = lr([0, 1])
    a, b = both.coef_[0]
    columns = [1] if a < 0 else [0] if b < 0 else [0, 1]
    reference = lr(columns).predict_proba(new[:, columns])[:, 1]
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-7)
    _, _, p = top(zf)
    _, _, pe = top(ze)
    netcal = quiet(lambda: netcal_scaling.BetaCalibration().fit(p[:, 1], yf).transform(pe[:, 1]))
    np.testing.assert_allclose(ours, netcal, rtol=0, atol=1e-4)


def test_platt_on_saturated_rows_is_sklearns() -> None:
    zf, yf, ze, _ = split(2, 3.0)
    zf, ze = zf.copy(), ze.copy()
    zf[:100, 1] += 45.0  # logit differences beyond 40: p_1 rounds to 1 in float64
    zf[100:150, 0] += 45.0
    ze[:50, 1] += 45.0
    x, xe = zf[:, 1] - zf[:, 0], ze[:, 1] - ze[:, 0]
    fit = fit_binary(torch.tensor(zf), torch.tensor(yf), "platt")
    ours = fit.calibrator.probabilities(torch.tensor(ze)).numpy()[:, 1]
    a, b = sklearn_calibration._sigmoid_calibration(x, yf)
    np.testing.assert_allclose(ours, 1 / (1 + np.exp(a * xe + b)), rtol=0, atol=1e-6)
    assert np.isfinite(fit.calibrator.apply(torch.tensor(ze)).numpy()).all()


@pytest.mark.parametrize("sharpen", [3.0, 0.5])
def test_binary_isotonic_one_vs_rest_is_sklearns_class_one_map(sharpen: float) -> None:
    # scikit-learn calibrates K = 2 with the class-1 map alone (q_0 = 1 − q_1); curvcal fits
    # both classes and renormalises: the two isotonic maps mirror each other, so they agree
    zf, yf, ze, _ = split(2, sharpen)
    _, _, p = top(zf)
    _, _, pe = top(ze)
    fitted = fit_isotonic(torch.tensor(zf), torch.tensor(yf), "isotonic-ovr").calibrator
    ours = fitted.probabilities(torch.tensor(ze)).numpy()[:, 1]
    reference = isotonic_reference(p[:, 1], yf.astype(float), pe[:, 1])
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)
