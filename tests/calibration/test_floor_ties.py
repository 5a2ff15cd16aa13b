"""The floor of the top-label maps at an exact tie: a bin, isotonic step or BBQ value worth
exactly the floor (0.5 at K = 2) must not hand the prediction to class 0, in float64 or in a
float32 copy of the calibrated probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration.bbq import fit_bbq
from curvcal.calibration.binning import fit_histogram
from curvcal.calibration.isotonic import fit_isotonic
from curvcal.calibration.univariate import TIE_MARGIN, top_label_log_probabilities


def binary_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """K = 2 logits whose top class is class 1 in about half the rows, labels at random (so
    many bins are worth at most 0.5 and the floor binds)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 2)), rng.integers(0, 2, n)


def test_a_row_at_the_floor_keeps_its_prediction_in_float32() -> None:
    """f(c) = 0.5 at K = 2 is exactly the floor c_tie = p_s / (p_s + 1 − c) = 0.5: the row's q
    is (0.5 − δ, 0.5 + δ) with class 1 on top, and δ survives rounding to float32."""
    logp = torch.log(torch.tensor([[0.3, 0.7], [0.45, 0.55], [0.2, 0.8]], dtype=torch.float64))
    q = torch.exp(top_label_log_probabilities(logp, torch.tensor([0.5, 0.5, 0.1])))
    assert (q.argmax(1) == 1).all()
    assert (q.to(torch.float32).argmax(1) == 1).all()
    # the top class gets q_t = 1 / (1 + (1 − margin)) after the renormalisation
    expected = 1 / (2 - TIE_MARGIN)
    torch.testing.assert_close(q[:, 1], torch.full((3,), expected, dtype=torch.float64))


@pytest.mark.parametrize("method", ["histogram", "isotonic", "bbq"])
def test_top_label_maps_keep_every_prediction_in_float32(method: str) -> None:
    z, y = binary_rows(600, seed=0)
    ze, _ = binary_rows(2000, seed=1)
    scores = torch.tensor(z)
    if method == "histogram":
        calibrator = fit_histogram(scores, torch.tensor(y), n_bins=15).calibrator
    elif method == "isotonic":
        calibrator = fit_isotonic(scores, torch.tensor(y)).calibrator
    else:
        calibrator = fit_bbq(scores, torch.tensor(y)).calibrator
    q = calibrator.probabilities(torch.tensor(ze))
    before = torch.tensor(ze).argmax(1)
    at_floor = (q.max(1).values - 0.5).abs() < 1e-5
    assert at_floor.sum() > 0  # the case the test is about occurs
    assert (q.argmax(1) == before).all()
    assert (q.to(torch.float32).argmax(1) == before).all()
