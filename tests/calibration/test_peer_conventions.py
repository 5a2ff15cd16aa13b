"""The differences of the peers' calibration numbers from curvcal's, reproduced under the
peers' conventions on the same fit and evaluation rows (netcal and venn-abers are in the dev
extra, so these run wherever the suite does):

* equal-width top-label histogram binning: netcal's ``HistogramBinning`` fitted on (confidence,
  correctness) is curvcal's f(c) bin for bin; curvcal's confidence is q_t = max(f(c), c_tie)
  (the floor that keeps every prediction). netcal's ECE is that of f(c) unfloored; floored, it
  is curvcal's (to the tie margin). The ECE gap (1.8e-3 to 3.6e-3 at K = 2 here, and 0.03 to
  0.12 at K = 10 and 100 with over-confident scores, where the floor binds in half the rows) is
  the floor alone.
* one-vs-all Venn–Abers: the ``venn-abers`` package drops a class absent from the calibration
  set and renormalises over the others; curvcal keeps its map (p0 = 0, so q_k = p1 / (1 + p1)
  > 0) and renormalises over all K. Dropping that column from curvcal's q and renormalising
  gives the package's probabilities to rounding; the ECE gap is that column's share.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch
from netcal.binning import HistogramBinning
from scipy.special import log_softmax

from curvcal.calibration.binning import bin_of, fit_histogram
from curvcal.calibration.metrics import expected_calibration_error
from curvcal.calibration.univariate import TIE_MARGIN
from curvcal.calibration.venn_abers import fit_venn_abers
from tests.calibration.test_linear_maps import synthetic
from tests.calibration.test_map_venn_abers import (
    hidden_style,
    package_one_vs_all,
    probabilities,
)

BINS = 15


def top_label_ece(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Equal-width ECE of N confidences against correctness, by hand: bins (b/M, (b+1)/M],
    Σ_b |Σ correct − Σ confidence| / N."""
    b = np.clip(np.ceil(confidence * BINS).astype(int) - 1, 0, BINS - 1)
    gaps = [abs(correct[b == i].sum() - confidence[b == i].sum()) for i in range(BINS)]
    return float(sum(gaps) / len(confidence))


@pytest.mark.parametrize(("k", "sharpen"), [(2, 3.0), (2, 0.5), (10, 3.0), (100, 3.0)])
def test_histogram_ece_differs_from_netcals_by_the_floor_alone(k: int, sharpen: float) -> None:
    z, y = synthetic(4000, k, sharpen, 1)
    zf, yf, ze, ye = z[:2000], y[:2000], z[2000:], y[2000:]
    logp, logpe = log_softmax(zf, 1), log_softmax(ze, 1)
    c, pred = np.exp(logp.max(1)), logp.argmax(1)
    ce, prede = np.exp(logpe.max(1)), logpe.argmax(1)
    pe = np.exp(logpe)
    second = np.sort(pe, 1)[:, -2]
    tie = second / (second + 1 - ce)  # c_tie, where the floor sits
    fit = fit_histogram(torch.tensor(zf), torch.tensor(yf), n_bins=BINS, scheme="equal-width")
    q = fit.calibrator.probabilities(torch.tensor(ze)).numpy()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        netcal = HistogramBinning(bins=BINS).fit(c, (pred == yf).astype(int)).transform(ce)
    netcal = np.asarray(netcal, dtype=np.float64)
    correct = (prede == ye).astype(np.float64)
    assert (q.argmax(1) == prede).all()  # the floor keeps every prediction
    # curvcal's unfloored f(c) is netcal's, so netcal's ECE is reproduced from curvcal's map
    edges = np.asarray(fit.calibrator.edges[0])
    unfloored = np.asarray(fit.calibrator.values[0])[bin_of(ce, edges)]
    np.testing.assert_allclose(unfloored, netcal, rtol=0, atol=1e-15)
    assert top_label_ece(unfloored, correct) == pytest.approx(
        top_label_ece(netcal, correct), abs=1e-15
    )
    # and curvcal's ECE is netcal's confidences floored (to the tie margin of floored rows)
    ours = expected_calibration_error(torch.tensor(np.log(q)), torch.tensor(ye), "logprobs", BINS)
    floored = top_label_ece(np.maximum(netcal, tie), correct)
    assert abs(ours - floored) <= TIE_MARGIN
    binds = int((tie > netcal).sum())
    if binds:
        assert abs(ours - top_label_ece(netcal, correct)) > 1e-3  # the gap the floor makes
    else:
        assert ours == pytest.approx(top_label_ece(netcal, correct), abs=1e-12)


def test_one_vs_all_venn_abers_is_the_packages_once_an_absent_class_is_dropped() -> None:
    """K = 100 with 400 calibration rows: one class is absent; the package returns 99 columns."""
    z, y = hidden_style(400, 100, 2.0, seed=3)
    zt, _ = hidden_style(1000, 100, 2.0, seed=4)
    present = np.unique(y)
    assert len(present) == 99
    q = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(y)).calibrator.probabilities(
        torch.from_numpy(zt)
    )
    package = package_one_vs_all(probabilities(z), y, probabilities(zt))
    assert package.shape == (1000, 99)
    kept = q[:, present]
    np.testing.assert_allclose(
        (kept / kept.sum(1, keepdim=True)).numpy(), package, rtol=0, atol=1e-12
    )
    absent = int(np.setdiff1d(np.arange(100), present)[0])
    assert float(q[:, absent].min()) > 0  # curvcal's map of the absent class gives it mass
