"""curvcal's last-layer Laplace against laplace-torch 0.3 on the same model and data.

laplace-torch (``Laplace(model, "classification", subset_of_weights="last_layer",
hessian_structure=...)``, prior precision by ``optimize_prior_precision(method="marglik")``,
``link_approx="probit"``) is the peer. The tolerances, measured:

- ``kron``: the factors are the same sums, so at the same δ the log marginal likelihood and
  the probit predictive agree to float64 rounding (measured 4e-16 on probabilities).
- ``full``: laplace-torch builds H as ``linop @ torch.eye(P)`` with a float32 identity, which
  rounds H to float32 (measured 6e-7 on H, 1.4e-7 on log Z, 2e-8 on probabilities): 1e-6.
- δ: laplace-torch takes 100 Adam steps of 0.1 in log δ from δ = 1 and stops wherever the last
  step lands; curvcal solves d log Z / d log δ = 0 by Brent's method. Measured 3e-4 to 5e-4
  relative: tolerance 1e-2 relative, and log Z at laplace-torch's δ is never above curvcal's.
"""

from __future__ import annotations

import math

import laplace
import pytest
import torch
from torch import nn

from curvcal.calibration.laplace import fit_laplace


def _problem(k: int, bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, k, bias=bias)).double()
    with torch.no_grad():
        model[2].weight.mul_(3)
    x = torch.randn(150, 4, dtype=torch.float64)
    y = torch.distributions.Categorical(logits=0.5 * model(x).detach()).sample()
    features = model[1](model[0](x)).detach()
    return model, x, y, features


@pytest.mark.parametrize(
    ("structure", "k", "bias", "tol"),
    [
        ("full", 3, True, 1e-6),
        ("kron", 3, True, 1e-12),
        ("full", 2, True, 1e-6),
        ("kron", 4, False, 1e-12),
        ("full", 4, False, 1e-6),
    ],
)
def test_agrees_with_laplace_torch(structure: str, k: int, bias: bool, tol: float) -> None:
    model, x, y, features = _problem(k, bias)
    head = model[2]
    fit = fit_laplace(
        features,
        y,
        head.weight.detach(),
        None if head.bias is None else head.bias.detach(),
        structure=structure,
    )
    peer = laplace.Laplace(
        model, "classification", subset_of_weights="last_layer", hessian_structure=structure
    )
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    peer.fit(loader)
    peer.optimize_prior_precision(method="marglik")
    peer_delta = float(peer.prior_precision)
    assert abs(peer_delta / fit.prior_precision - 1) < 1e-2
    # at its own δ laplace-torch's log Z is not above the maximum curvcal found
    assert float(peer.log_marginal_likelihood()) <= fit.log_marginal_likelihood + 1e-6
    # at curvcal's δ: the same log Z and the same probit predictive
    peer.prior_precision = torch.tensor(fit.prior_precision, dtype=torch.float64)
    logz = float(peer.log_marginal_likelihood())
    assert abs(logz - fit.log_marginal_likelihood) < tol * max(1.0, abs(logz))
    probs = peer(x, link_approx="probit")
    ours = fit.calibrator.probabilities(features)
    assert float((probs - ours).abs().max()) < tol
    assert math.isfinite(fit.log_marginal_likelihood)
