"""The top-label isotonic fit's and map's fast paths against plain references written here, bit
for bit:

* :func:`isotonic_points` (scores and 0/1 targets sorted as packed integers) against a
  lexsort, the tie rule applied score by score, each group's mean and size, and
  :func:`pool_adjacent_violators` on every group: ties, near ties (within 16·2⁻⁵³ relative,
  the rule of curvcal.calibration.ties), groups whose mean times size is not their count of
  right predictions in float64 (15/22·22, 27/49·49), saturated confidences, all right and none
  right, N = 1 and 2, boolean targets, and the inputs that take the general path (targets
  other than 0 and 1, scores of 2 or more, −0.0);
* :func:`interpolate_points` (segments found from bit-pattern cells) against ``numpy.interp``:
  scores at, between, below and above the knots, above 1 and 2, knots a subnormal apart (an
  infinite slope), one and two knots, more knots than cells, NaN and negative scores;
* the fitted top-label map's apply against the top-label rule with ``numpy.interp``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration import isotonic
from curvcal.calibration.isotonic import (
    _kept_points,
    fit_isotonic,
    interpolate_points,
    isotonic_points,
    pool_adjacent_violators,
)
from curvcal.calibration.ties import TIE_RELATIVE
from curvcal.calibration.univariate import top_label_map
from tests.calibration.lookup_paths import cell_path_at_every_size as every_size
from tests.calibration.test_isotonic_ties import sequential_starts

#: each test twice: the cell lookup at every size, and as shipped
cell_path_at_every_size = every_size(isotonic, "FEW_SCORES")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool((a.view(np.int64) == b.view(np.int64)).all())


def reference_points(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit as defined: sorted by score then target, groups by the rule score by score,
    each group's mean target and size pooled by pool-adjacent-violators."""
    order = np.lexsort((target, x))
    xs, ts = x[order], np.asarray(target, dtype=np.float64)[order]
    opens = sequential_starts(xs)
    group = np.cumsum(opens) - 1
    count = np.bincount(group).astype(np.float64)
    mean = np.bincount(group, weights=ts) / count
    return _kept_points(xs[opens], pool_adjacent_violators(mean, count))


def assert_fit_and_map(x: np.ndarray, target: np.ndarray) -> None:
    px, py = isotonic_points(x, target)
    rx, ry = reference_points(x, target)
    assert same_bits(px, rx)
    assert same_bits(py, ry)
    assert same_bits(interpolate_points(px, py, x), np.interp(x, rx, ry))


def softmax_confidences(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    logits = torch.from_numpy(rng.normal(size=(n, k)) * 2.5)
    labels = rng.integers(0, k, size=n)
    probs = torch.softmax(logits, dim=1).numpy()
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


@pytest.mark.parametrize(("n", "k"), [(3000, 10), (800, 1000), (500, 2)])
def test_points_and_map_on_softmax_confidences(n: int, k: int) -> None:
    c, correct = softmax_confidences(np.random.default_rng(n + k), n, k)
    assert_fit_and_map(c, correct)


def test_ties_and_near_ties() -> None:
    rng = np.random.default_rng(1)
    # exact ties (two decimals), and near ties: permuted rows' confidences and multiples of u
    rounded = np.round(rng.random(600), 2)
    assert_fit_and_map(rounded, (rng.random(600) < rounded).astype(np.float64))
    row = rng.normal(size=50) * 3
    permuted = np.stack([rng.permutation(row) for _ in range(300)])
    c = torch.softmax(torch.from_numpy(permuted), dim=1).numpy().max(axis=1)
    assert len(np.unique(c)) > 1  # the rounding spreads them, within the rule's bound
    assert c.max() - c.min() <= TIE_RELATIVE * c.max()
    mixed = np.concatenate([c, rng.random(300)])
    assert_fit_and_map(mixed, (rng.random(600) < 0.6).astype(np.float64))
    eps = 2.0**-53
    steps = 0.4 * (1 + rng.integers(0, 40, size=500) * eps)  # chains spanning the resolution
    assert_fit_and_map(steps, (rng.random(500) < 0.5).astype(np.float64))


def test_groups_whose_mean_times_size_is_not_their_hits() -> None:
    # 22 equal scores with 15 right, then 44 equal scores none right: pooled, and fl(15/22)·22
    # ≠ 15, so the pooled value is not fl(15/66); then 49 with 27 right (fl(27/49)·49 ≠ 27)
    c = np.concatenate([np.full(22, 0.3), np.full(44, 0.5), np.full(49, 0.6), [0.7, 0.8, 0.9]])
    target = np.zeros(len(c))
    target[:15] = 1.0
    target[66:93] = 1.0
    target[-3:] = 1.0
    assert (15 / 22) * 22 / 66 != 15 / 66 and (27 / 49) * 49 != 27
    _, ry = reference_points(c, target)
    assert ry[0] == (15 / 22) * 22 / 66 and ry[2] == (27 / 49) * 49 / 49
    assert_fit_and_map(c, target)


def test_saturated_all_right_none_right_and_tiny_n() -> None:
    rng = np.random.default_rng(2)
    eps = 2.0**-53
    saturated = np.where(rng.random(400) < 0.5, 1.0, np.where(rng.random(400) < 0.5, 1 - eps, 0.9))
    assert_fit_and_map(saturated, (rng.random(400) < 0.9).astype(np.float64))
    c = rng.random(300)
    assert_fit_and_map(c, np.ones(300))
    assert_fit_and_map(c, np.zeros(300))
    assert_fit_and_map(np.array([0.7]), np.array([1.0]))
    assert_fit_and_map(np.array([0.7, 0.4]), np.array([0.0, 1.0]))
    assert_fit_and_map(np.array([0.7, 0.7]), np.array([1.0, 0.0]))
    assert_fit_and_map(np.array([0.0, 0.5, 1.0]), np.array([1.0, 0.0, 1.0]))


def test_boolean_targets_and_the_general_path() -> None:
    rng = np.random.default_rng(3)
    c = np.round(rng.random(400), 3)
    hit = rng.random(400) < c
    px, py = isotonic_points(c, hit)
    rx, ry = reference_points(c, hit.astype(np.float64))
    assert same_bits(px, rx) and same_bits(py, ry)
    assert_fit_and_map(c, np.where(hit, 0.75, 0.25))  # targets other than 0 and 1
    assert_fit_and_map(np.append(c, 3.0), np.append(hit, True).astype(np.float64))
    assert_fit_and_map(np.append(c, -0.0), np.append(hit, False).astype(np.float64))


def test_interpolate_points_is_numpy_interp() -> None:
    rng = np.random.default_rng(4)
    x = np.sort(np.concatenate([rng.random(200) ** 4, 1 - rng.random(100) ** 6]))
    x = np.unique(x)
    y = np.sort(rng.random(len(x)))
    y[40:60] = y[40]  # flat stretches
    nudged = np.concatenate([x, np.nextafter(x, 0), np.nextafter(x, 2)])
    scores = np.concatenate([rng.random(5000), nudged, [0.0, 1.0, 1 + 5e-5, 2.0, 7.5, 1e-300]])
    assert same_bits(interpolate_points(x, y, scores), np.interp(scores, x, y))
    many = np.unique(rng.random(5000))  # more knots than cells (cells scale with the scores)
    many_y = np.sort(rng.random(len(many)))
    assert same_bits(
        interpolate_points(many, many_y, scores[:100]), np.interp(scores[:100], many, many_y)
    )
    for knots in (x[:1], x[:2]):
        values = y[: len(knots)]
        assert same_bits(
            interpolate_points(knots, values, scores), np.interp(scores, knots, values)
        )
    odd = np.array([0.5, np.nan, -0.25, -0.0, np.inf])
    assert same_bits(interpolate_points(x, y, odd), np.interp(odd, x, y))


def test_interpolate_points_where_knots_are_a_subnormal_apart() -> None:
    x = np.array([0.0, 1e-310, 2e-310, 0.5, 1.0])
    y = np.array([0.0, 0.2, 0.2, 0.6, 1.0])
    scores = np.array([0.0, 5e-311, 1e-310, 1.5e-310, 2e-310, 0.3, 0.5, 1.0, 3.0])
    with np.errstate(over="ignore"):
        expected = np.interp(scores, x, y)
    assert same_bits(interpolate_points(x, y, scores), expected)


def test_fitted_map_applies_as_the_rule_with_numpy_interp() -> None:
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(size=(2000, 7)) * 3)
    logits[:40] = logits[0]  # identical rows: one tie group
    labels = torch.from_numpy(rng.integers(0, 7, size=2000))
    fitted = fit_isotonic(logits, labels, "isotonic")
    x, y = np.array(fitted.calibrator.x[0]), np.array(fitted.calibrator.y[0])
    new_logits = torch.from_numpy(rng.normal(size=(700, 7)) * 4)
    logp = torch.log_softmax(new_logits, dim=1)
    expected = top_label_map(logp, lambda c: np.interp(c, x, y))
    assert torch.equal(fitted.calibrator.apply(new_logits), expected)
