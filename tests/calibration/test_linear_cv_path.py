"""Cross-validation of the full maps' strength: the walk down the grid that stops past the
minimum chooses the strength the whole grid chooses, with the same held-out NLLs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration.linear import ODIR_GRID, _past_the_minimum, fit_matrix_odir
from tests.calibration.test_linear_maps import synthetic

SMALL = [
    # (K, sharpen: > 1 over-confident, < 1 under-confident, N, seed)
    (2, 2.0, 400, 1),
    (2, 0.5, 400, 2),
    (10, 2.0, 1000, 3),
    (10, 0.5, 1000, 4),
]
MAPS = [("matrix", "odir"), ("dirichlet", "odir"), ("dirichlet", "l2")]
CASES = [case + full for case in SMALL for full in MAPS]


@pytest.mark.parametrize(("k", "sharpen", "n", "seed", "method", "regulariser"), CASES)
def test_stopping_past_the_minimum_chooses_the_whole_grids_strength(
    k: int, sharpen: float, n: int, seed: int, method: str, regulariser: str
) -> None:
    z, y = synthetic(n, k, sharpen, seed)
    scores, labels = torch.from_numpy(z), torch.from_numpy(y)
    walk = fit_matrix_odir(scores, labels, method=method, regulariser=regulariser)
    grid = fit_matrix_odir(scores, labels, method=method, regulariser=regulariser, patience=None)
    assert grid.cv_folds == walk.cv_folds == 5  # not the fallback of a split too small
    assert grid.cv_strengths == ODIR_GRID
    assert walk.cv_strengths == ODIR_GRID[len(ODIR_GRID) - len(walk.cv_strengths) :]
    assert walk.l2_off_diagonal == grid.l2_off_diagonal
    for strength, value in zip(walk.cv_strengths, walk.cv_nll, strict=True):
        assert value == grid.cv_nll[ODIR_GRID.index(strength)]
    np.testing.assert_array_equal(walk.calibrator.weights, grid.calibrator.weights)


def test_the_walk_stops_after_two_rises_in_a_row() -> None:
    assert not _past_the_minimum([3.0], 2)
    assert not _past_the_minimum([3.0, 3.1], 2)
    assert _past_the_minimum([3.0, 3.1, 3.2], 2)
    assert not _past_the_minimum([3.0, 3.1, 3.05], 2)  # fell again: go on
    assert not _past_the_minimum([3.2, 3.1, 3.0], 2)
    assert _past_the_minimum([3.2, 3.0, 3.1, 3.3], 2)
    assert not _past_the_minimum([3.0, 3.0, 3.0], 2)  # flat is not a rise
