"""Histogram binning, isotonic regression, Platt and beta calibration: hand-worked cases, the
top-label and one-vs-rest rules, border cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from curvcal.calibration.binary import BinaryMap, fit_binary
from curvcal.calibration.binning import HistogramMap, fit_histogram
from curvcal.calibration.isotonic import IsotonicMap, fit_isotonic, pool_adjacent_violators
from curvcal.calibration.univariate import top_label_log_probabilities


def probs_with_confidence(c: list[float], k: int = 2) -> torch.Tensor:
    """Rows whose top class 0 has probability c and the rest share 1 − c evenly."""
    c_t = torch.tensor(c, dtype=torch.float64)[:, None]
    rest = (1 - c_t) / (k - 1)
    return torch.cat([c_t, rest.expand(-1, k - 1)], 1)


def test_isotonic_six_samples_by_hand() -> None:
    # confidences 0.6 .. 0.9 (top class 0), correct = y == 0: 1 0 1 0 0 1 by rising confidence
    c = [0.55, 0.6, 0.65, 0.7, 0.8, 0.9]
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    fit = fit_isotonic(probs_with_confidence(c), y, kind="probs")
    # PAV: (1, 0) pool to 0.5; 0.5 ≤ 1; then (1, 0, 0) pool to 1/3, which is below 0.5:
    # pool (1, 0, 1, 0, 0) to 0.4; then 1 → fitted 0.4 ×5, 1.0
    assert fit.calibrator.x[0] == pytest.approx((0.55, 0.8, 0.9))
    assert fit.calibrator.y[0] == pytest.approx((0.4, 0.4, 1.0))
    q = fit.calibrator.probabilities(probs_with_confidence([0.85, 0.5, 0.95]), "probs")
    # 0.85: halfway between (0.8, 0.4) and (0.9, 1.0) → 0.7; 0.5 clips to 0.4, floored at the
    # tie value 0.5 (K = 2: the prediction is kept); 0.95 clips to 1.0
    np.testing.assert_allclose(q[:, 0].numpy(), [0.7, 0.5, 1.0], atol=1e-12)
    np.testing.assert_allclose(q.sum(1).numpy(), 1.0, atol=1e-15)


def test_pool_adjacent_violators_by_hand() -> None:
    fitted = pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 0.0, 4.0]), np.ones(5))
    np.testing.assert_allclose(fitted, [1.0, 5 / 3, 5 / 3, 5 / 3, 4.0])
    weighted = pool_adjacent_violators(np.array([2.0, 1.0]), np.array([3.0, 1.0]))
    np.testing.assert_allclose(weighted, [1.75, 1.75])


def test_histogram_two_bins_by_hand() -> None:
    # equal-width, 2 bins (0, .5], (.5, 1] on K = 3 confidences
    c = [0.4, 0.45, 0.5, 0.7, 0.9, 1.0]
    y = torch.tensor([0, 1, 0, 0, 0, 2])  # correct: 1 0 1 1 1 0
    p = probs_with_confidence(c, 3)
    fit = fit_histogram(p, y, kind="probs", n_bins=2, scheme="equal-width")
    # bin 1 holds 0.4, 0.45 and the edge value 0.5 (lower bin): accuracy 2/3; bin 2: 2/3
    assert fit.calibrator.values[0] == pytest.approx((2 / 3, 2 / 3))
    q = fit.calibrator.probabilities(probs_with_confidence([0.5, 0.6], 3), "probs")
    np.testing.assert_allclose(q[:, 0].numpy(), [2 / 3, 2 / 3], atol=1e-15)
    assert fit.empty_bins == 0
    mass = fit_histogram(p, y, kind="probs", n_bins=2, scheme="equal-mass")
    # cut after the third sorted confidence: edge halfway between 0.5 and 0.7
    assert mass.calibrator.edges[0] == pytest.approx((0.0, 0.6, 1.0))
    assert mass.calibrator.values[0] == pytest.approx((2 / 3, 2 / 3))
    shifted = fit_histogram(p, torch.tensor([0, 1, 0, 0, 0, 0]), kind="probs", n_bins=2)
    assert shifted.calibrator.values[0] == pytest.approx((2 / 3, 1.0))


def test_empty_equal_width_bin_takes_its_middle() -> None:
    p = probs_with_confidence([0.9, 0.95, 0.97], 3)
    fit = fit_histogram(p, torch.tensor([0, 0, 1]), kind="probs", n_bins=3, scheme="equal-width")
    assert fit.calibrator.values[0] == pytest.approx((1 / 6, 0.5, 2 / 3))
    assert fit.empty_bins == 2


def test_top_label_rule_keeps_proportions_and_prediction() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]], dtype=torch.float64))
    q = torch.exp(top_label_log_probabilities(logp, torch.tensor([0.8, 0.1])))
    np.testing.assert_allclose(q[0].numpy(), [0.8, 0.12, 0.08], atol=1e-15)
    # 0.1 is under the tie value 0.4 / (0.4 + 0.4) = 0.5: floored there; p = 0 stays 0
    np.testing.assert_allclose(q[1].numpy(), [0.5, 0.5, 0.0], atol=1e-15)
    # at the floor the runner-up (a lower index) stays under the top class: same prediction
    logp = torch.log(torch.tensor([[0.35, 0.6, 0.05]], dtype=torch.float64))
    q = torch.exp(top_label_log_probabilities(logp, torch.tensor([0.2])))
    assert int(q.argmax()) == 1 and float(q[0, 1] - q[0, 0]) > 0
    np.testing.assert_allclose(q[0].numpy(), [0.35 / 0.75, 0.35 / 0.75, 0.05 / 0.75], rtol=1e-11)
    saturated = torch.tensor([[0.0, -math.inf, -math.inf]], dtype=torch.float64)
    q = torch.exp(top_label_log_probabilities(saturated, torch.tensor([0.7])))
    np.testing.assert_allclose(q[0].numpy(), [0.7, 0.15, 0.15], atol=1e-15)


def test_top_label_saturated_rows_from_logits_stay_finite() -> None:
    z = torch.tensor([[50.0, 0.0, 0.0], [0.0, 80.0, 1.0], [1.0, 0.5, 0.0], [0.2, 0.0, 0.1]])
    y = torch.tensor([0, 2, 0, 1])
    for fit in (fit_isotonic(z, y), fit_histogram(z, y, n_bins=2)):
        logq = fit.calibrator.apply(z)
        assert not torch.isnan(logq).any()
        np.testing.assert_allclose(torch.exp(logq).sum(1).numpy(), 1.0, atol=1e-12)


def test_one_vs_rest_zero_row_is_uniform_and_one_class_fits() -> None:
    z = torch.tensor(np.random.default_rng(0).standard_normal((40, 4)))
    y = torch.zeros(40, dtype=torch.int64)  # one class present in the fit split
    for fit in (fit_isotonic(z, y, "isotonic-ovr"), fit_histogram(z, y, "histogram-ovr", n_bins=4)):
        q = fit.calibrator.probabilities(z)
        assert torch.isfinite(q).all()
        np.testing.assert_allclose(q.sum(1).numpy(), 1.0, atol=1e-12)
    fit = fit_isotonic(z, y, "isotonic-ovr")
    assert set(fit.calibrator.y[1]) == {0.0}  # class 1 never seen: f_1 = 0
    q = fit.calibrator.probabilities(z)
    np.testing.assert_allclose(q[:, 0].numpy(), 1.0)


def test_all_confidences_equal() -> None:
    z = torch.zeros((30, 3))
    z[:, 0] = 1.0
    y = torch.tensor([0] * 12 + [1] * 18)
    for fit in (
        fit_isotonic(z, y),
        fit_histogram(z, y, n_bins=5, scheme="equal-mass"),
        fit_histogram(z, y, n_bins=5, scheme="equal-width"),
    ):
        q = fit.calibrator.probabilities(z)
        c = torch.exp(z[0]) / torch.exp(z[0]).sum()
        floor = float(c[1] / (c[1] + 1 - c[0]))
        np.testing.assert_allclose(q[:, 0].numpy(), max(0.4, floor), atol=1e-12)
    assert fit_histogram(z, y, n_bins=5, scheme="equal-mass").bins_used == (1,)
    binary = torch.zeros((30, 2))
    binary[:, 1] = 0.7
    platt = fit_binary(binary, torch.tensor([1] * 21 + [0] * 9), "platt")
    assert platt.coefficients["slope"] == 0.0 and platt.converged
    # constant scores: q_1 = the mean of Platt's targets, (21·22/23 + 9/11)/30
    expected = (21 * 22 / 23 + 9 / 11) / 30
    q = platt.calibrator.probabilities(binary)
    np.testing.assert_allclose(q[:, 1].numpy(), expected, atol=1e-10)


def test_platt_single_class_is_finite_beta_refuses() -> None:
    z = torch.tensor(np.random.default_rng(1).standard_normal((50, 2)))
    y = torch.ones(50, dtype=torch.int64)
    platt = fit_binary(z, y, "platt")
    assert platt.converged and all(map(math.isfinite, platt.coefficients.values()))
    with pytest.raises(Exception, match="needs both classes"):
        fit_binary(z, y, "beta")


def test_beta_constraint_fixes_a_negative_coefficient() -> None:
    rng = np.random.default_rng(3)
    p1 = rng.uniform(0.01, 0.99, 4000)
    # true map decreasing in ln p_1: a < 0 in the free fit, so a is fixed at 0
    y = (rng.random(4000) < 1 / (1 + p1**2)).astype(np.int64)
    scores = torch.tensor(np.stack([1 - p1, p1], 1))
    fit = fit_binary(scores, torch.tensor(y), "beta", kind="probs")
    assert fit.fixed == "a" and fit.coefficients["a"] == 0.0


@pytest.mark.parametrize(
    "calibrator",
    [
        HistogramMap("histogram", "equal-mass", 3, ((0.0, 0.5, 1.0),), ((0.2, 0.9),)),
        IsotonicMap("isotonic-ovr", 2, ((0.1, 0.9), (0.5,)), ((0.0, 1.0), (0.3,))),
        BinaryMap("platt", (1.5,), -0.2),
        BinaryMap("beta", (1.0, 2.0), 0.1),
    ],
)
def test_saved_form_round_trips(calibrator) -> None:
    again = type(calibrator).from_dict(calibrator.to_dict())
    assert again == calibrator


def test_pool_adjacent_violators_long_cascades_match_scipy() -> None:
    from scipy.optimize import isotonic_regression

    # a pool that cascades back over 300 blocks: past the vectorised passes, into the stack
    cascade = np.r_[np.ones(300), np.zeros(300)]
    np.testing.assert_allclose(pool_adjacent_violators(cascade, np.ones(600)), 0.5)
    rng = np.random.default_rng(7)
    for rate in (np.linspace(0, 1, 5000), np.full(5000, 0.02), np.linspace(1, 0, 5000)):
        targets = (rng.random(5000) < rate).astype(float)
        weights = rng.integers(1, 4, 5000).astype(float)
        reference = isotonic_regression(targets, weights=weights).x
        np.testing.assert_allclose(
            pool_adjacent_violators(targets, weights), reference, rtol=0, atol=1e-12
        )
