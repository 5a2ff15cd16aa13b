"""Dirichlet calibration with ODIR at a fixed strength against torch-uncertainty's
``DirichletScaler(lambda_reg=λ, mu_reg=μ)`` fitted on the same data.

Its objective (``torch_uncertainty/post_processing/calibration/dirichlet_scaler.py``) is
``CrossEntropyLoss()`` (the mean over the N rows) of W log_softmax(z) + b, plus
λ · Σ_{i≠j} W_ij² / (K(K−1)) + μ · mean_j b_j²: curvcal's Dirichlet ODIR objective with
λ_od = λ and λ_b = μ, term for term (:func:`curvcal.calibration.linear.penalty_weights`).

Its optimiser is torch's L-BFGS with lr 0.1, no line search, ``max_iter`` 200 and the default
stops (max |gradient| ≤ 1e-7, change of the loss or step ≤ 1e-9), on float32 parameters: it
stops short of the minimum. So the comparison gives it float64 parameters and logits and 2,000
iterations, and checks (a) curvcal's objective is never above its (curvcal's is the minimum to
a gradient of 1e-8), (b) its objective comes within 1e-7 of curvcal's, (c) the probabilities
agree within 1e-3: along the objective's flattest directions an objective gap δ moves the
probabilities by about √(2δ/μ_min) (μ_min its smallest curvature), so its stopping leaves
differences of 1e-4 where the objectives agree to 1e-8. Measured (2,000 rows, K = 2, 10):
max |Δp| 2e-5 and 2e-4, objective gap 4e-9 and 8e-9–1e-8. Its default (float32, 200
iterations) is also checked never to reach below curvcal's objective.
"""

from __future__ import annotations

import logging

import pytest
import torch

from curvcal.calibration.linear import fit_linear, penalty_weights
from tests.calibration.test_linear_maps import synthetic

calibration = pytest.importorskip("torch_uncertainty.post_processing.calibration")

STRENGTH = 1e-2
CASES = [(k, sharpen) for k in (2, 10) for sharpen in (3.0, 0.5)]


def peer_fit(z: torch.Tensor, y: torch.Tensor, dtype: torch.dtype, max_iter: int):
    """``DirichletScaler`` with λ = μ = STRENGTH, its parameters in ``dtype``, fitted on one
    batch of (z, y)."""
    from torch.utils.data import DataLoader, TensorDataset

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # its parameters are made in the default dtype
    try:
        scaler = calibration.DirichletScaler(
            num_classes=z.shape[1],
            model=None,
            lambda_reg=STRENGTH,
            mu_reg=STRENGTH,
            max_iter=max_iter,
        )
    finally:
        torch.set_default_dtype(default)
    logging.disable(logging.WARNING)  # "model is None"
    try:
        scaler.fit(DataLoader(TensorDataset(z.to(dtype), y), batch_size=len(y)), progress=False)
    finally:
        logging.disable(logging.NOTSET)
    return scaler


def objective(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> float:
    """Mean NLL of softmax(W log p + b) + the ODIR penalty, float64, written out here."""
    k = z.shape[1]
    w, b = w.detach().double(), b.detach().double()
    s = torch.log_softmax(z.double(), 1) @ w.T + b
    nll = -torch.log_softmax(s, 1)[torch.arange(len(y)), y].mean()
    off = (w * w).sum() - (w.diagonal() ** 2).sum()
    return float(nll + STRENGTH * off / (k * (k - 1)) + STRENGTH * (b * b).mean())


def test_the_penalty_is_torch_uncertaintys_term_for_term() -> None:
    k = 5
    v = torch.randn(k, k + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w, b = v[:, :k], v[:, k]
    theirs = STRENGTH * ((w * w).sum() - (w.diagonal() ** 2).sum()) / (k * (k - 1))
    theirs = theirs + STRENGTH * (b * b).mean()
    ours = (penalty_weights("odir", k, STRENGTH, STRENGTH) * v * v).sum()
    assert float(ours) == pytest.approx(float(theirs), rel=1e-14)


@pytest.mark.parametrize(("k", "sharpen"), CASES)
def test_dirichlet_odir_is_torch_uncertaintys_dirichlet_scaler(k: int, sharpen: float) -> None:
    z_np, y_np = synthetic(2000, k, sharpen, 1)
    z, y = torch.tensor(z_np), torch.tensor(y_np)
    fit = fit_linear(z, y, "dirichlet", l2_off_diagonal=STRENGTH, l2_bias=STRENGTH)
    assert fit.converged
    ours = fit.calibrator.probabilities(z)
    mine = objective(
        z, y, *(torch.tensor(fit.calibrator.weights), torch.tensor(fit.calibrator.bias))
    )
    assert mine == pytest.approx(fit.objective_after, abs=1e-12)

    scaler = peer_fit(z, y, torch.float64, 2000)
    theirs = objective(z, y, scaler.inv_temperature_weight, scaler.inv_temperature_bias)
    assert mine <= theirs + 1e-12
    assert theirs - mine < 1e-7
    with torch.no_grad():
        probs = torch.softmax(scaler(z).double(), 1)
    assert float((ours - probs).abs().max()) < 1e-3

    default = peer_fit(z.float(), y, torch.float32, 200)  # its defaults, as the benchmark runs it
    assert mine <= objective(z, y, default.inv_temperature_weight, default.inv_temperature_bias)
