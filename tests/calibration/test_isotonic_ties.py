"""The tie groups of isotonic regression (scikit-learn's rule: a score within the resolution
1e-15 of its group's first score joins it) against the rule applied score by score, on runs
of sub-resolution gaps that span many groups."""

from __future__ import annotations

import numpy as np
import pytest

from curvcal.calibration.isotonic import TIE_RESOLUTION, tie_starts


def sequential_starts(x: np.ndarray) -> np.ndarray:
    """The rule as written: walk the sorted scores, open a group at the first score at least
    the resolution above the current group's first."""
    start = np.zeros(len(x), dtype=bool)
    first = 0
    for j in range(len(x)):
        if j == 0 or x[j] - x[first] >= TIE_RESOLUTION:
            start[j] = True
            first = j
    return start


@pytest.mark.parametrize("seed", range(6))
def test_tie_groups_follow_the_rule_score_by_score(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = rng.choice([0.0, 1e-16, 3e-16, 7e-16, 9.9e-16, 1e-15, 2e-15, 1e-3], 4000)
    x = np.sort(np.concatenate([np.cumsum(steps) * rng.random(), rng.random(500) * 1e-13]))
    x = np.concatenate([x, 1.0 - rng.integers(0, 300, 300) * 2.0**-53])  # near 1: ulp gaps
    x = np.sort(x)
    expected = sequential_starts(x)
    assert expected.sum() > 100 and (~expected).sum() > 100  # many groups, many joins
    np.testing.assert_array_equal(tie_starts(x), expected)
