"""The shared-work paths of one-vs-rest isotonic regression against plain per-class references
written here, bit for bit:

* :func:`interpolate` (every class's map at once, segments found from bit-pattern cells)
  against ``numpy.interp`` column by column: scores at, between, below and above the knots,
  above 1 (probabilities within the sum tolerance) and 2, knots a subnormal apart (an infinite
  slope), one knot, many knots in one cell (large K coarsens the cells);
* :func:`sorted_tie_starts` (all rows' tie groups followed together, the last few runs walked
  one by one) against the rule applied score by score;
* :func:`one_vs_rest_points` against one class at a time (score-by-score ties, group means,
  :func:`pool_adjacent_violators` on every group): tie groups whose mean times count is not
  their count of positives in float64 (1/49·49), near ties (within 16·2⁻⁵³ relative, the
  rule of curvcal.calibration.ties), saturated rows, K = 2, a class with no positives;
* the zero-aware logarithm and exponential of the renormalisation against ``torch.log`` and
  ``torch.exp``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from curvcal.calibration.isotonic import (
    FRONTIER_RUNS,
    _kept_points,
    fit_isotonic,
    interpolate,
    knot_table,
    one_vs_rest_points,
    pool_adjacent_violators,
    sorted_tie_starts,
)
from curvcal.calibration.ties import TIE_RELATIVE
from curvcal.calibration.univariate import (
    exp_of_log_probabilities,
    one_vs_rest_log_probabilities,
)
from tests.calibration.test_isotonic_ties import sequential_starts


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool((a.view(np.int64) == b.view(np.int64)).all())


def column_points(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One class's kept points, one class at a time: sorted scores, groups by the rule score by
    score, each group's mean target and size pooled by pool-adjacent-violators."""
    order = np.argsort(x, kind="stable")
    xs, ts = x[order], target[order]
    opens = sequential_starts(xs)
    group = np.cumsum(opens) - 1
    count = np.bincount(group).astype(np.float64)
    mean = np.bincount(group, weights=ts) / count
    return _kept_points(xs[opens], pool_adjacent_violators(mean, count))


def interp_columns(points: list[tuple[np.ndarray, np.ndarray]], p: np.ndarray) -> np.ndarray:
    return np.stack([np.interp(p[:, k], x, y) for k, (x, y) in enumerate(points)], axis=1)


def random_points(rng: np.random.Generator, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per-class knots: clustered near 0 and near 1, some classes of one knot."""
    points = []
    for j in range(k):
        m = 1 if j % 7 == 3 else int(rng.integers(2, 60))
        x = np.unique(np.concatenate([rng.random(m) ** rng.integers(1, 30), [0.0] * (j % 2)]))
        y = np.sort(rng.random(len(x)) * (rng.random(len(x)) < 0.7))
        points.append((x, y))
    return points


@pytest.mark.parametrize("k", [2, 37, 3000])
def test_interpolate_is_numpy_interp_per_class(k: int) -> None:
    rng = np.random.default_rng(k)
    points = random_points(rng, k)
    knots = np.concatenate([x for x, _ in points])
    rows = [
        rng.random((60, k)) ** rng.integers(1, 40, (60, k)),  # spread over many binades
        rng.choice(knots, (20, k)),  # exactly at knots (of any class)
        np.nextafter(rng.choice(knots, (20, k)), 1.0),  # just above them
        np.nextafter(rng.choice(knots, (20, k)), 0.0),  # just below them
        np.zeros((1, k)),
        np.ones((1, k)),
        np.full((1, k), 1.0 + 5e-5),  # probabilities within the sum tolerance
        np.full((1, k), 2.0),  # the top cell
        np.full((1, k), 7.5),
    ]
    p = np.ascontiguousarray(np.concatenate(rows).clip(0.0, None))
    table = knot_table(points)
    if k == 3000:
        assert table.shift > 52  # coarse cells: several knots share one
    assert same_bits(interpolate(table, p), interp_columns(points, p))


def test_interpolate_where_knots_are_a_subnormal_apart() -> None:
    """Knots 0 and 1e-310 with values 0 and 0.5: the slope overflows to ∞; numpy.interp
    gives the knot's value at a knot and ∞ between, and so must the table."""
    tiny = 1e-310
    points = [
        (np.array([0.0, tiny, 0.4, 1.0]), np.array([0.0, 0.5, 0.5, 1.0])),
        (np.array([0.2, 0.6]), np.array([0.1, 0.3])),
    ]
    table = knot_table(points)
    assert table.steep
    column = np.array([0.0, tiny / 4, tiny, 0.3, 0.4, 0.9, 1.0, 5e-324])
    p = np.ascontiguousarray(np.stack([column, column[::-1]], axis=1))
    got = interpolate(table, p)
    assert np.isinf(got[1, 0])  # between the two knots
    assert same_bits(got, interp_columns(points, p))


def test_interpolate_reads_a_stored_negative_zero_as_zero() -> None:
    points = [(np.array([-0.0, 0.5]), np.array([-0.0, 0.25])), (np.array([0.5]), np.array([0.5]))]
    p = np.array([[0.0, 0.0], [0.25, 0.7], [1.0, 0.5]])
    expected = interp_columns(points, p)
    got = interpolate(knot_table(points), p)
    np.testing.assert_array_equal(got, expected)  # equal as numbers (−0.0 == 0.0)
    assert not np.signbit(got).any()


def chained_rows(rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    """Sorted rows holding runs of sub-resolution gaps that span many groups, near ties in
    the ties module's sense, and exact ties."""
    rows = []
    for r in range(n_rows):
        steps = rng.choice([0.0, 1e-16, 3e-16, 7e-16, 9.9e-16, 1e-15, 2e-15, 1e-3], n)
        x = np.cumsum(steps) * rng.random()
        if r % 3 == 0:  # near 0.3: neighbours a few units of 2⁻⁵³ apart, relative
            x = 0.3 + np.cumsum(rng.integers(0, 16, n)) * TIE_RELATIVE * 0.3 / 16
        rows.append(np.sort(x))
    return np.array(rows)


@pytest.mark.parametrize("n_rows", [1, FRONTIER_RUNS - 1, 3 * FRONTIER_RUNS])
def test_sorted_tie_starts_follow_the_rule_score_by_score(n_rows: int) -> None:
    rng = np.random.default_rng(n_rows)
    rows = chained_rows(rng, n_rows, 1500)
    expected = np.array([sequential_starts(row) for row in rows])
    assert expected.sum() > 10 * n_rows and (~expected).sum() > 10 * n_rows
    np.testing.assert_array_equal(sorted_tie_starts(rows), expected)


def test_sorted_tie_starts_with_one_long_run_beside_many_short() -> None:
    """Many short runs are followed together; the long run (over 10,000 groups) is walked once the
    others are done."""
    long_run = np.arange(40_000) * 0.5e-15
    short = 0.5 + np.repeat(np.arange(300), 3) * 1e-3 + np.tile([0.0, 0.6e-15, 1.2e-15], 300)
    x = np.sort(np.concatenate([long_run, short]))
    expected = sequential_starts(x)
    assert expected[: len(long_run)].sum() > 10_000
    np.testing.assert_array_equal(sorted_tie_starts(x[None])[0], expected)


def hard_columns(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """N×K probabilities and labels: ties of 49 equal scores holding one positive (1/49·49 is
    not 1 in float64), near ties, saturated rows (exact 0 and 1), class k − 1 without
    positives."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k)) * 3
    z[: n // 10] *= 200  # saturated
    z[n // 10 : n // 4] = np.round(z[n // 10 : n // 4])  # exact ties
    p = torch.softmax(torch.tensor(z), dim=1).numpy().copy()
    # a block of 49 equal scores per class, and near-tied copies of it
    for j in range(k):
        rows = slice(n // 4 + 98 * j, n // 4 + 98 * j + 49)
        p[rows, j] = 0.375
        near = slice(n // 4 + 98 * j + 49, n // 4 + 98 * (j + 1))
        p[near, j] = 0.6 * (1 + np.arange(49) * TIE_RELATIVE / 4)
    y = rng.integers(0, max(1, k - 1), n)
    y[n // 4 :: 98] = np.arange(len(y[n // 4 :: 98])) % max(1, k - 1)
    return p, y


@pytest.mark.parametrize("k", [2, 3, 40])
def test_one_vs_rest_points_are_the_per_class_fit(k: int) -> None:
    n = 98 * k + 3000
    p, y = hard_columns(n, k, seed=k)
    assert not (y == k - 1).any()  # a class with no positives
    assert (np.float64(1.0) / 49) * 49 != 1.0  # the group means are not exact
    fitted = one_vs_rest_points(np.ascontiguousarray(p.T), y)
    for j in range(k):
        x, values = column_points(p[:, j], (y == j).astype(np.float64))
        assert same_bits(fitted[j][0], x), j
        assert same_bits(fitted[j][1], values), j
    assert fitted[k - 1][1].max() == 0.0


def test_one_vs_rest_map_applies_as_interp_and_renormalisation() -> None:
    """fit_isotonic's one-vs-rest map: q_k = f_k / Σ_j f_j as log f_k − log Σ_j f_j, 1/K where
    every f_j is 0, f_k by numpy.interp, fitted on logits with 49 identical rows (exact ties)
    and 49 permuted copies of a row (near ties), applied to probabilities (one row above 1
    within the sum tolerance)."""
    k = 12
    rng = np.random.default_rng(1)
    z = rng.standard_normal((3000, k)) * 4
    z[:300] *= 200  # saturated
    z[300:349] = z[300]
    z[349:398] = np.array([rng.permutation(z[349]) for _ in range(49)])
    y = rng.integers(0, k - 1, 3000)
    fit = fit_isotonic(torch.tensor(z), torch.tensor(y), "isotonic-ovr")
    p = torch.exp(torch.log_softmax(torch.tensor(z), dim=1)).numpy()  # curvcal's p
    points = [
        (np.asarray(x), np.asarray(v))
        for x, v in zip(fit.calibrator.x, fit.calibrator.y, strict=True)
    ]
    for j in (0, k - 1):
        x, values = column_points(p[:, j], (y == j).astype(np.float64))
        assert same_bits(points[j][0], x) and same_bits(points[j][1], values)
    probe = np.concatenate([p, np.eye(k)[:1] * (1 + 5e-5)])
    logp = torch.log(torch.tensor(probe))
    f = torch.tensor(interp_columns(points, torch.exp(logp).numpy()))
    total = f.sum(dim=1, keepdim=True)
    expected = torch.where(total > 0, torch.log(f) - torch.log(total), -math.log(k))
    assert (f == 0).any()  # (a row of zeros: the test below)
    got = fit.calibrator.apply(torch.tensor(probe), "probs")
    assert same_bits(got.numpy(), expected.numpy())
    assert same_bits(fit.calibrator.probabilities(probe, "probs").numpy(), torch.exp(expected))


def test_zero_aware_logarithm_and_exponential_are_plain_ones() -> None:
    values = torch.tensor(
        [
            [0.0, 0.25, 0.5],
            [0.0, 0.0, 0.0],
            [1e-300, 0.0, 5e-324],
            [0.3, 0.3, 0.4],
            [0.0, 1.0, 0.0],
        ],
        dtype=torch.float64,
    )
    total = values.sum(dim=1, keepdim=True)
    expected = torch.log(values) - torch.log(total)
    expected[1] = -math.log(3)
    log_q = one_vs_rest_log_probabilities(values)
    assert same_bits(log_q.numpy(), expected.numpy())
    assert same_bits(exp_of_log_probabilities(log_q).numpy(), torch.exp(expected).numpy())
