"""The held-out NLL rule of curvcal's Laplace prior against laplace-torch 0.3's
``optimize_prior_precision(method="gridsearch", val_loader=...)`` on the same model, the same
training / validation rows and the same grid (``torch.logspace(-4, 4, 100)``).

laplace-torch fits on one training loader and scores one validation loader; curvcal's kernel
scores a list of folds, so one fold (the GGN of the training rows, the validation rows) is the
same problem. The loss handed to laplace-torch is an offline NLL: its default
``RunningNLLMetric`` is not reset between grid points (0.3), so each point's value is the
running mean over all points so far, and its choice is the minimum of that running mean (shown
below), not of the NLL. Tolerances: those of ``test_laplace_peer.py`` (``kron`` the same sums,
1e-12; ``full`` H rounded to float32 by laplace-torch, 1e-6 on probabilities); the grid is float32
in laplace-torch, so δ agrees to float32 rounding (1e-6 relative).
"""

from __future__ import annotations

import laplace
import numpy as np
import pytest
import torch
from laplace.utils.metrics import RunningNLLMetric
from torch import nn

from curvcal.calibration import laplace as lp


def _nll(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.nll_loss(probs.log(), labels)


@pytest.mark.parametrize(("structure", "tol"), [("full", 1e-6), ("kron", 1e-12)])
def test_same_grid_same_choice_as_laplace_torch_gridsearch(structure: str, tol: float) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    with torch.no_grad():
        model[2].weight.mul_(3)
    x = torch.randn(200, 4, dtype=torch.float64)
    y = torch.distributions.Categorical(logits=0.5 * model(x).detach()).sample()
    phi = model[1](model[0](x)).detach()
    train, held = slice(0, 150), slice(150, 200)

    def loader(rows: slice, size: int) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x[rows], y[rows]), batch_size=size
        )

    peer = laplace.Laplace(
        model, "classification", subset_of_weights="last_layer", hessian_structure=structure
    )
    peer.fit(loader(train, 64))
    grid_args = {"log_prior_prec_min": -4, "log_prior_prec_max": 4, "grid_size": 100}
    peer.optimize_prior_precision(
        method="gridsearch", val_loader=loader(held, 20), loss=_nll, **grid_args
    )
    peer_delta = float(peer.prior_precision)

    w, b = model[2].weight.detach(), model[2].bias.detach()
    probs = torch.softmax(phi @ w.T + b, 1)
    fold = lp.HeldOutFold(
        lp.curvature(phi[train], probs[train], True, structure), phi[held], y[held]
    )
    template = lp.LaplaceMap(w, b, 1.0, structure, "probit", 1, 0, "")
    grid = tuple(float(v) for v in torch.logspace(-4, 4, 100))
    values = [lp.heldout_nll(delta, [fold], template) for delta in grid]
    search = lp.minimise_on_grid(lambda d: lp.heldout_nll(d, [fold], template), grid, refine=False)
    assert 0 < grid.index(search.grid_choice) < 99
    assert abs(search.grid_choice / peer_delta - 1) < 1e-6
    # at the chosen δ, the same predictive as the peer's
    peer.prior_precision = torch.tensor(search.grid_choice, dtype=torch.float64)
    ours = lp.predictive_log_probs(
        lp._posterior(template, fold.curvature, search.grid_choice), phi[held]
    )
    assert float((peer(x[held], link_approx="probit") - ours.exp()).abs().max()) < tol
    # the peer's default loss accumulates over the grid: its choice is the running mean's minimum
    peer.optimize_prior_precision(
        method="gridsearch", val_loader=loader(held, 50), loss=RunningNLLMetric(), **grid_args
    )
    running = np.cumsum(values) / np.arange(1, 101)
    assert abs(float(peer.prior_precision) / grid[int(np.argmin(running))] - 1) < 1e-5
