"""Temperature scaling, one-vs-rest histogram binning and one-vs-rest isotonic regression
against torch-uncertainty's own implementations (``torch_uncertainty.post_processing``)
fitted on the same data.

torch-uncertainty's conventions, and how each comparison allows for them:

* it works in the dtype of the logits it is given (a float32 softmax for float32 logits), so
  the comparisons give it float64 logits; ``HistogramBinningScaler`` keeps its bin edges and
  values in float32 whatever the logits (values rounded by up to 6e-8);
* ``HistogramBinningScaler`` and ``IsotonicRegressionScaler`` return log(clamp(q, 1e-6,
  1 − 1e-6)) with q_k = f_k / (Σ_j f_j + 1e-12): curvcal's probabilities are clamped the
  same way before the comparison, and the 1e-12 in the denominator moves q by at most 1e-12
  relative; a row whose every f_j is 0 gets 1/K from curvcal and 1e-6 per class from it;
* ``TemperatureScaler`` runs torch's L-BFGS (lr 0.1, 100 iterations, no line search) on a
  float32 inverse temperature from T = 1: it stops short of the optimum, so its temperature is
  compared within 1e-3 relative and its NLL is never below curvcal's (which is the exact
  minimum to 1e-8 in T).

Measured (largest |Δ|, 2,000 fit / 1,000 evaluation rows, over- (×3) and under-confident
(×0.5), K = 2, 10, 100): histogram OvR 2e-16 and isotonic OvR 1e-12 after the clamp; TS
temperatures 2e-5 relative.
"""

from __future__ import annotations

import logging

import pytest
import torch

from curvcal.calibration import fit_temperature, negative_log_likelihood
from curvcal.calibration.binning import fit_histogram
from curvcal.calibration.isotonic import fit_isotonic
from tests.calibration.test_linear_maps import synthetic

post_processing = pytest.importorskip("torch_uncertainty.post_processing")

CASES = [(k, sharpen) for k in (2, 10, 100) for sharpen in (3.0, 0.5)]
#: torch-uncertainty's clamp of the calibrated probabilities (its ``eps``).
EPS = 1e-6


def split(k: int, sharpen: float, seed: int = 1) -> tuple[torch.Tensor, ...]:
    z, y = synthetic(3000, k, sharpen, seed)
    zf, yf = torch.tensor(z[:2000]), torch.tensor(y[:2000])
    return zf, yf, torch.tensor(z[2000:]), torch.tensor(y[2000:])


def fitted(name: str, logits: torch.Tensor, labels: torch.Tensor, **options):
    """torch-uncertainty's scaler ``name`` fitted on one batch of (logits, labels)."""
    from torch.utils.data import DataLoader, TensorDataset

    scaler = getattr(post_processing, name)(model=None, **options)
    loader = DataLoader(TensorDataset(logits, labels), batch_size=len(labels))
    logging.disable(logging.WARNING)  # "model is None"
    try:
        scaler.fit(loader, progress=False)
    finally:
        logging.disable(logging.NOTSET)
    return scaler


def theirs(scaler, logits: torch.Tensor) -> torch.Tensor:
    """exp of the scaler's output: its clamped probabilities (before any softmax)."""
    with torch.no_grad():
        return torch.exp(scaler(logits).to(torch.float64))


def clamped(q: torch.Tensor) -> torch.Tensor:
    return q.clamp(EPS, 1 - EPS)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_histogram_one_vs_rest_is_torch_uncertaintys(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    ours = fit_histogram(zf, yf, "histogram-ovr", n_bins=15, scheme="equal-width")
    q = ours.calibrator.probabilities(ze)
    peer = theirs(fitted("HistogramBinningScaler", zf, yf, num_bins=15), ze)
    assert (q.sum(1) > 0).all()  # no all-zero row, where the conventions part
    # its float32 bin values: 6e-8 each, and the row's renormalisation by their sum
    torch.testing.assert_close(clamped(q), peer, rtol=0, atol=2e-7)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_isotonic_one_vs_rest_is_torch_uncertaintys(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    q = fit_isotonic(zf, yf, "isotonic-ovr").calibrator.probabilities(ze)
    peer = theirs(fitted("IsotonicRegressionScaler", zf, yf), ze)
    torch.testing.assert_close(clamped(q), peer, rtol=0, atol=1e-11)


def test_isotonic_one_vs_rest_with_repeated_and_saturated_rows() -> None:
    zf, yf, ze, _ = split(10, 3.0)
    zf = torch.cat([zf, zf[:300], 60.0 * zf[300:400]])  # ties, and rows with c = 1.0
    yf = torch.cat([yf, yf[:300], yf[300:400]])
    q = fit_isotonic(zf, yf, "isotonic-ovr").calibrator.probabilities(ze)
    peer = theirs(fitted("IsotonicRegressionScaler", zf, yf), ze)
    torch.testing.assert_close(clamped(q), peer, rtol=0, atol=1e-11)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_temperature_is_torch_uncertaintys_within_its_optimiser(k: int, sharpen: float) -> None:
    zf, yf, _, _ = split(k, sharpen)
    ours = fit_temperature(zf, yf)
    scaler = fitted("TemperatureScaler", zf, yf)
    t_peer = float(1.0 / scaler.inv_temp.detach().double())
    assert t_peer == pytest.approx(ours.temperature, rel=1e-3)
    nll_peer = negative_log_likelihood(zf / t_peer, yf)
    assert ours.nll_after <= nll_peer + 1e-12
