"""The last-layer Laplace kernel against dense float64 truth built independently: the GGN from
the Jacobian of the logits in the last layer's parameters (autograd), the marginal likelihood
from its definition and a grid, the probit and Monte Carlo predictives from their formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from curvcal.calibration import laplace as lp
from curvcal.errors import InputError


def _head(k: int, d: int, bias: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(k, d, generator=g, dtype=torch.float64) * 1.5
    b = torch.randn(k, generator=g, dtype=torch.float64) if bias else None
    return w, b


def _data(n: int, d: int, k: int, w: torch.Tensor, b: torch.Tensor | None, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    phi = torch.randn(n, d, generator=g, dtype=torch.float64)
    logits = phi @ w.T + (0 if b is None else b)
    y = torch.multinomial(torch.softmax(0.6 * logits, 1), 1, generator=g)[:, 0]
    return phi, y


def _dense_ggn(phi: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Σ_n J_nᵀ (diag p − ppᵀ) J_n with J_n from torch.autograd.functional.jacobian over
    θ = [vec(W), b] (laplace-torch's order)."""
    k, d = w.shape
    theta = torch.cat([w.reshape(-1), *([] if b is None else [b])])
    h = torch.zeros(theta.numel(), theta.numel(), dtype=torch.float64)
    for x in phi:

        def f(t: torch.Tensor, x: torch.Tensor = x) -> torch.Tensor:
            out = t[: k * d].reshape(k, d) @ x
            return out + t[k * d :] if b is not None else out

        jac = torch.autograd.functional.jacobian(f, theta)
        p = torch.softmax(f(theta), 0)
        h += jac.T @ (torch.diag(p) - torch.outer(p, p)) @ jac
    return h


@pytest.mark.parametrize(("k", "d", "bias"), [(3, 4, True), (2, 5, True), (4, 3, False)])
def test_full_posterior_matches_dense_jacobian_ggn(k: int, d: int, bias: bool) -> None:
    w, b = _head(k, d, bias)
    phi, y = _data(37, d, k, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="full")
    delta = fit.prior_precision
    precision = _dense_ggn(phi, w, b) + delta * torch.eye(fit.n_parameters, dtype=torch.float64)
    ours = lp.ggn_full(phi, torch.softmax(phi @ w.T + (0 if b is None else b), 1), bias)
    assert torch.allclose(
        ours + delta * torch.eye(len(ours), dtype=torch.float64), precision, rtol=0, atol=1e-10
    )
    cov = fit.calibrator.covariance
    assert cov is not None
    assert torch.allclose(cov, torch.linalg.inv(precision), rtol=0, atol=1e-10)


def test_prior_precision_maximises_the_dense_marginal_likelihood() -> None:
    w, b = _head(3, 4, True)
    phi, y = _data(50, 4, 3, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="full")
    h = _dense_ggn(phi, w, b)
    p = h.shape[0]
    theta_sq = float((w * w).sum() + (b * b).sum())
    loglik = -float(torch.nn.functional.cross_entropy(phi @ w.T + b, y, reduction="sum"))

    def logz(delta: float) -> float:  # log p(D|θ) + log p(θ) − ½ log det((H + δI)/2π)
        prior = -0.5 * delta * theta_sq + 0.5 * p * math.log(delta / (2 * math.pi))
        sign, logdet = torch.linalg.slogdet(
            (h + delta * torch.eye(p, dtype=torch.float64)) / (2 * math.pi)
        )
        assert sign > 0
        return loglik + prior - 0.5 * float(logdet)

    assert fit.log_marginal_likelihood == pytest.approx(logz(fit.prior_precision), rel=1e-12)
    for factor in (0.999, 1.001, 0.5, 2.0):
        assert logz(fit.prior_precision * factor) < fit.log_marginal_likelihood
    grid = torch.logspace(-3, 3, 601).tolist()
    best = max(grid, key=logz)
    assert abs(math.log(best / fit.prior_precision)) < math.log(10) / 100
    assert not fit.at_bracket_end


def test_probit_predictive_from_dense_covariance() -> None:
    w, b = _head(3, 4, True)
    phi, y = _data(40, 4, 3, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="full", predictive="probit")
    precision = _dense_ggn(phi, w, b) + fit.prior_precision * torch.eye(15, dtype=torch.float64)
    cov = torch.linalg.inv(precision)
    x = torch.randn(9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    expected = []
    for row in x:
        jac = torch.cat(
            [
                torch.kron(torch.eye(3, dtype=torch.float64), row[None]),
                torch.eye(3, dtype=torch.float64),
            ],
            1,
        )
        var = torch.diagonal(jac @ cov @ jac.T)
        kappa = 1 / torch.sqrt(1 + math.pi / 8 * var)
        expected.append(torch.softmax(kappa * (w @ row + b), 0))
    got = fit.calibrator.probabilities(x)
    assert torch.allclose(got, torch.stack(expected), rtol=0, atol=1e-12)
    # the probit predictive is less confident than the MAP softmax, never more
    map_conf = torch.softmax(x @ w.T + b, 1).max(1).values
    assert bool((got.max(1).values <= map_conf + 1e-12).all())


def test_kron_posterior_from_its_factors() -> None:
    """KFAC: weight block G ⊗ A with G = Σ Λ_n and A = Σ φφᵀ / N, bias block G, built densely."""
    k, d = 3, 4
    w, b = _head(k, d, True)
    phi, y = _data(30, d, k, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="kron")
    probs = torch.softmax(phi @ w.T + b, 1)
    g = sum(torch.diag(p) - torch.outer(p, p) for p in probs)
    a = sum(torch.outer(x, x) for x in phi) / len(phi)
    delta = fit.prior_precision
    precision = torch.block_diag(torch.kron(g, a), g) + delta * torch.eye(
        k * d + k, dtype=torch.float64
    )
    cov = torch.linalg.inv(precision)
    x = phi[:7]
    for row in x:
        jac = torch.cat(
            [
                torch.kron(torch.eye(k, dtype=torch.float64), row[None]),
                torch.eye(k, dtype=torch.float64),
            ],
            1,
        )
        var = torch.diagonal(jac @ cov @ jac.T)
        expected = torch.softmax((w @ row + b) / torch.sqrt(1 + math.pi / 8 * var), 0)
        assert torch.allclose(fit.calibrator.probabilities(row[None])[0], expected, atol=1e-12)
    eigs = torch.linalg.eigvalsh(precision - delta * torch.eye(len(precision), dtype=torch.float64))
    _sign, logdet = torch.linalg.slogdet(precision)
    theta_sq = float((w * w).sum() + (b * b).sum())
    loglik = -float(torch.nn.functional.cross_entropy(phi @ w.T + b, y, reduction="sum"))
    expected_logz = loglik - 0.5 * (delta * theta_sq + float(logdet) - len(eigs) * math.log(delta))
    assert fit.log_marginal_likelihood == pytest.approx(expected_logz, rel=1e-12)


def test_mc_predictive_converges_to_gaussian_average_and_is_seeded() -> None:
    w, b = _head(3, 4, True)
    phi, y = _data(40, 4, 3, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="full", predictive="mc", samples=4000, seed=3)
    x = phi[:5]
    first = fit.calibrator.probabilities(x)
    assert torch.equal(first, fit.calibrator.probabilities(x))
    # independent reference: torch.distributions' Gaussian over the logits, J Σ Jᵀ built densely
    cov = fit.calibrator.covariance
    assert cov is not None
    torch.manual_seed(0)
    for i, row in enumerate(x):
        jac = torch.cat([torch.kron(_eye(3), row[None]), _eye(3)], 1)
        logits = torch.distributions.MultivariateNormal(
            w @ row + b, jac @ cov @ jac.T + 1e-12 * _eye(3)
        ).sample((40000,))
        assert float((torch.softmax(logits, 1).mean(0) - first[i]).abs().max()) < 0.03
    other = lp.LaplaceMap(**{**fit.calibrator.__dict__, "seed": 4}).probabilities(x)
    assert not torch.equal(first, other)


def test_kron_mc_predictive_draws_the_kron_logit_gaussian() -> None:
    k, d = 3, 4
    w, b = _head(k, d, True)
    phi, y = _data(30, d, k, w, b)
    fit = lp.fit_laplace(phi, y, w, b, structure="kron", predictive="mc", samples=4000)
    probs = torch.softmax(phi @ w.T + b, 1)
    g = sum(torch.diag(p) - torch.outer(p, p) for p in probs)
    a = sum(torch.outer(x, x) for x in phi) / len(phi)
    precision = torch.block_diag(torch.kron(g, a), g) + fit.prior_precision * _eye(k * d + k)
    cov = torch.linalg.inv(precision)
    got = fit.calibrator.probabilities(phi[:4])
    torch.manual_seed(1)
    for i, row in enumerate(phi[:4]):
        jac = torch.cat([torch.kron(_eye(k), row[None]), _eye(k)], 1)
        logits = torch.distributions.MultivariateNormal(
            w @ row + b, jac @ cov @ jac.T + 1e-12 * _eye(k)
        ).sample((40000,))
        assert float((torch.softmax(logits, 1).mean(0) - got[i]).abs().max()) < 0.03


def _eye(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


def test_auto_structure_threshold() -> None:
    assert lp.resolve_structure("auto", lp.FULL_MAX_PARAMETERS) == "full"
    assert lp.resolve_structure("auto", lp.FULL_MAX_PARAMETERS + 1) == "kron"
    assert lp.resolve_structure("kron", 4) == "kron"


def test_saved_map_round_trips_as_plain_numbers() -> None:
    import json

    for structure, bias in (("full", True), ("kron", True), ("full", False), ("kron", False)):
        w, b = _head(2, 3, bias)
        phi, y = _data(20, 3, 2, w, b)
        fit = lp.fit_laplace(phi, y, w, b, structure=structure, layer="fc")
        text = json.dumps(fit.calibrator.to_dict())
        back = lp.LaplaceMap.from_dict(json.loads(text), "cal.json")
        assert torch.equal(back.apply(phi), fit.calibrator.apply(phi))
        assert back.layer == "fc" and back.structure == structure


def test_tiny_fit_split_and_binary() -> None:
    w, b = _head(2, 3, True)
    phi, y = _data(2, 3, 2, w, b)
    fit = lp.fit_laplace(phi, y, w, b)
    assert fit.n_samples == 2 and math.isfinite(fit.log_marginal_likelihood)
    assert fit.prior_precision > 0
    assert torch.allclose(
        fit.calibrator.probabilities(phi).sum(1), torch.ones(2, dtype=torch.float64)
    )


def test_zero_head_puts_the_prior_precision_on_the_bracket_end() -> None:
    w = torch.zeros(3, 2, dtype=torch.float64)
    phi = torch.randn(10, 2, dtype=torch.float64)
    fit = lp.fit_laplace(phi, torch.arange(10) % 3, w, None)
    assert fit.at_bracket_end and fit.prior_precision == lp.PRIOR_BRACKET[1]


def test_last_linear_is_found_and_its_absence_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 3)))
    name, layer = lp.last_linear(model)
    assert name == "2.0" and layer is model[2][0]
    with pytest.raises(InputError, match=r"no nn\.Linear"):
        lp.last_linear(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten()))


def test_logits_are_refused_by_a_laplace_map() -> None:
    w, b = _head(2, 3, True)
    phi, y = _data(10, 3, 2, w, b)
    fit = lp.fit_laplace(phi, y, w, b)
    with pytest.raises(InputError, match="features of its checkpoint"):
        fit.calibrator.apply(phi @ w.T, "logits", "x.npz")
