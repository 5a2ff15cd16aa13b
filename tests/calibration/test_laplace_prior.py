"""The held-out NLL rule of the last-layer Laplace prior precision (``prior="nll"``) against a
dense float64 computation built independently: per fold, the GGN from the Jacobian of the logits
(autograd), the covariance by a dense inverse, the probit predictive from its formula."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.calibration import laplace as lp
from curvcal.calibration.linear import cv_folds
from curvcal.errors import InputError

GRID = tuple(10.0 ** (i / 4) for i in range(-8, 13))  # 1e-2 … 1e3


def _problem(n: int = 60, k: int = 3, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(k, d, generator=g, dtype=torch.float64) * 2.0
    b = torch.randn(k, generator=g, dtype=torch.float64)
    phi = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(0.5 * (phi @ w.T + b), 1), 1, generator=g)[:, 0]
    return phi, y, w, b


def _dense_ggn(phi: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k, d = w.shape
    theta = torch.cat([w.reshape(-1), b])
    h = torch.zeros(theta.numel(), theta.numel(), dtype=torch.float64)
    for x in phi:

        def f(t: torch.Tensor, x: torch.Tensor = x) -> torch.Tensor:
            return t[: k * d].reshape(k, d) @ x + t[k * d :]

        jac = torch.autograd.functional.jacobian(f, theta)
        p = torch.softmax(f(theta), 0)
        h += jac.T @ (torch.diag(p) - torch.outer(p, p)) @ jac
    return h


def _dense_probit_nll(h, phi, y, w, b, delta) -> tuple[float, int]:
    """Σ −log p_y of the probit predictive: κ_k = 1/√(1 + π/8 · J_k Σ J_kᵀ), Σ = (H + δI)⁻¹."""
    k = w.shape[0]
    cov = torch.linalg.inv(h + delta * torch.eye(h.shape[0], dtype=torch.float64))
    total = 0.0
    for x, label in zip(phi, y, strict=True):
        jac = torch.cat([torch.kron(torch.eye(k, dtype=torch.float64), x[None]), torch.eye(k)], 1)
        var = torch.diagonal(jac @ cov @ jac.T)
        kappa = 1 / torch.sqrt(1 + math.pi / 8 * var)
        total -= float(torch.log_softmax(kappa * (w @ x + b), 0)[label])
    return total, len(y)


def _dense_objective(phi, y, w, b, seed: int = 0):
    fold = torch.as_tensor(cv_folds(y, lp.PRIOR_FOLDS, seed))
    parts = [(fold != j, fold == j) for j in range(lp.PRIOR_FOLDS)]
    ggns = [_dense_ggn(phi[train], w, b) for train, _ in parts]

    def objective(delta: float) -> float:
        sums = [
            _dense_probit_nll(h, phi[held], y[held], w, b, delta)
            for h, (_, held) in zip(ggns, parts, strict=True)
        ]
        return sum(s for s, _ in sums) / sum(c for _, c in sums)

    return objective


def test_nll_prior_is_the_grid_minimum_of_a_dense_heldout_nll() -> None:
    phi, y, w, b = _problem()
    dense = _dense_objective(phi, y, w, b)
    values = [dense(delta) for delta in GRID]
    best = min(range(len(GRID)), key=lambda i: values[i])
    assert 0 < best < len(GRID) - 1  # an interior minimum, so the refinement is exercised
    probs = torch.softmax(phi @ w.T + b, 1)
    folds = lp.heldout_folds(phi, probs, y, True, "full", lp.PRIOR_FOLDS, 0)
    template = lp.LaplaceMap(w, b, 1.0, "full", "probit", 1, 0, "")
    for delta, value in zip(GRID, values, strict=True):
        assert abs(lp.heldout_nll(delta, folds, template) - value) < 1e-10
    fit = lp.fit_laplace(phi, y, w, b, structure="full", prior="nll", grid=GRID)
    assert fit.prior_rule == "nll" and fit.prior_folds == lp.PRIOR_FOLDS
    assert not fit.at_bracket_end
    # refined between the grid neighbours of the minimum, and no worse than it
    assert GRID[best - 1] <= fit.prior_precision <= GRID[best + 1]
    assert fit.heldout_nll is not None
    assert abs(dense(fit.prior_precision) - fit.heldout_nll) < 1e-10
    assert fit.heldout_nll <= values[best]
    assert dense(fit.prior_precision * 1.01) >= fit.heldout_nll - 1e-12
    assert dense(fit.prior_precision / 1.01) >= fit.heldout_nll - 1e-12
    # the posterior is the whole fit split's at that δ, and log Z is evaluated there
    precision = _dense_ggn(phi, w, b) + fit.prior_precision * torch.eye(15, dtype=torch.float64)
    assert fit.calibrator.covariance is not None
    assert torch.allclose(fit.calibrator.covariance, torch.linalg.inv(precision), atol=1e-10)
    eig = torch.linalg.eigvalsh(_dense_ggn(phi, w, b)).clamp_min(0)
    theta_sq = float((w * w).sum() + (b * b).sum())
    logz = lp.log_marginal_likelihood(fit.prior_precision, eig, theta_sq, fit.log_likelihood)
    assert abs(fit.log_marginal_likelihood - logz) < 1e-8 * abs(logz)


def test_grid_search_without_refinement_takes_the_grid_minimum() -> None:
    values = {delta: (math.log10(delta) - 0.6) ** 2 for delta in GRID}
    search = lp.minimise_on_grid(values.__getitem__, GRID, refine=False)
    assert search.prior_precision == search.grid_choice == 10**0.5
    refined = lp.minimise_on_grid(lambda d: (math.log10(d) - 0.6) ** 2, GRID)
    assert abs(math.log10(refined.prior_precision) - 0.6) < 1e-6
    assert refined.grid_choice == 10**0.5


def test_ties_take_the_smallest_delta_and_say_it_is_an_end() -> None:
    """A head of zeros predicts the uniform distribution at every δ: a flat objective."""
    phi, y, w, _b = _problem()
    fit = lp.fit_laplace(phi, y, torch.zeros_like(w), None, structure="kron", prior="nll")
    assert fit.prior_precision == lp.NLL_GRID[0] and fit.at_bracket_end
    assert abs(fit.heldout_nll - math.log(3)) < 1e-12  # type: ignore[operator]


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_monte_carlo_objective_is_seeded_and_smooth(structure: str) -> None:
    phi, y, w, b = _problem()
    probs = torch.softmax(phi @ w.T + b, 1)
    folds = lp.heldout_folds(phi, probs, y, True, structure, lp.PRIOR_FOLDS, 3)
    template = lp.LaplaceMap(w, b, 1.0, structure, "mc", 400, 7, "")
    first = lp.heldout_nll(2.0, folds, template)
    assert first == lp.heldout_nll(2.0, folds, template)
    # the same draws at every δ: a small step in δ moves the objective a little
    assert abs(lp.heldout_nll(2.0 * 1.001, folds, template) - first) < 1e-3
    fit = lp.fit_laplace(
        phi, y, w, b, structure=structure, predictive="mc", samples=50, prior="nll"
    )
    assert fit.heldout_nll is not None and math.isfinite(fit.heldout_nll)


def test_folds_hold_every_fit_row_once() -> None:
    phi, y, w, b = _problem(n=47)
    probs = torch.softmax(phi @ w.T + b, 1)
    folds = lp.heldout_folds(phi, probs, y, True, "kron", 5, 1)
    assert sum(len(f.labels) for f in folds) == 47
    assert sorted(torch.cat([f.features for f in folds])[:, 0].tolist()) == sorted(
        phi[:, 0].tolist()
    )


def test_a_fit_split_without_training_rows_for_any_fold_is_refused() -> None:
    phi, y, w, b = _problem(n=1)
    with pytest.raises(InputError, match="laplace_prior nll"):
        lp.fit_laplace(phi, y, w, b, prior="nll")


def test_unknown_prior_rule_is_refused() -> None:
    phi, y, w, b = _problem(n=10)
    with pytest.raises(InputError, match="laplace_prior"):
        lp.fit_laplace(phi, y, w, b, prior="evidence")
