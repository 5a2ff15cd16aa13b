"""The shortened cross-validation walk (from λ = 100 down, stopping after two rises of the
held-out NLL) at K = 100, against the walk over every strength.

At K = 100 a full map has 10,100 parameters; the smallest strengths of the default grid
(1e-4, 1e-3) on a fit split of a few thousand rows are near-unregularised fits of a
near-separable problem, each slow (the reason the walk exists), and the whole default grid
takes minutes. The reference here is the whole of a grid without those two (1e-2 … 100, five
strengths): the walk's stopping rule is the same, and on these data its choice lies at the top.
Under-confident scores only: the over-confident case (sharpen 2) passes too but its whole grid
took 317 s on a loaded 2-core machine (53 s for this one), too long for the suite.
"""

from __future__ import annotations

import numpy as np
import torch

from curvcal.calibration.linear import fit_matrix_odir
from tests.calibration.test_linear_maps import synthetic

GRID = (1e-2, 1e-1, 1.0, 10.0, 100.0)


def test_the_walk_chooses_the_whole_grids_strength_at_k_100() -> None:
    z, y = synthetic(2500, 100, 0.5, 8)  # every class has at least 10 rows (2 per fold)
    assert np.bincount(y, minlength=100).min() >= 10
    scores, labels = torch.from_numpy(z), torch.from_numpy(y)
    walk = fit_matrix_odir(scores, labels, grid=GRID)
    grid = fit_matrix_odir(scores, labels, grid=GRID, patience=None)
    assert grid.cv_folds == walk.cv_folds == 5  # not the fallback of a split too small
    assert grid.cv_strengths == GRID and len(walk.cv_strengths) < len(GRID)
    assert walk.l2_off_diagonal == grid.l2_off_diagonal
    for strength, value in zip(walk.cv_strengths, walk.cv_nll, strict=True):
        assert value == grid.cv_nll[GRID.index(strength)]
    np.testing.assert_array_equal(walk.calibrator.weights, grid.calibrator.weights)
