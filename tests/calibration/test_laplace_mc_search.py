"""The Monte Carlo predictive's held-out NLL (``prior="nll"``, ``predictive="mc"``) against a
hand-written float64 reference: per fold, the GGN written out from its definition, the posterior
covariance by a dense inverse, the logit covariance J Σ Jᵀ per row, its root (the Cholesky
factor for ``full``; for ``kron`` Q_G diag(√v), checked to be a root of the dense covariance)
and the mean of softmax over the same fixed standard normal draws (one generator seeded by
the seed, S×n×K for the fold's n rows)."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.calibration import laplace as lp
from curvcal.calibration.linear import cv_folds
from curvcal.errors import InputError


def _problem(n: int, k: int, d: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(k, d, generator=g, dtype=torch.float64) * 2.0
    b = torch.randn(k, generator=g, dtype=torch.float64) if bias else None
    phi = torch.randn(n, d, generator=g, dtype=torch.float64)
    logits = phi @ w.T + (0 if b is None else b)
    y = torch.multinomial(torch.softmax(0.5 * logits, 1), 1, generator=g)[:, 0]
    return phi, y, w, b


def _jacobian(x: torch.Tensor, k: int, bias: bool) -> torch.Tensor:
    """∂f/∂θ at one row, θ = [vec(W) row by row, b]: [I_K ⊗ φᵀ, I_K]."""
    eye = torch.eye(k, dtype=torch.float64)
    weight = torch.kron(eye, x[None])
    return torch.cat([weight, eye], 1) if bias else weight


def _dense_precision(phi, w, b, structure: str, delta: float) -> torch.Tensor:
    k = w.shape[0]
    probs = torch.softmax(phi @ w.T + (0 if b is None else b), 1)
    if structure == "full":
        h = sum(
            _jacobian(x, k, b is not None).T
            @ (torch.diag(p) - torch.outer(p, p))
            @ _jacobian(x, k, b is not None)
            for x, p in zip(phi, probs, strict=True)
        )
    else:
        g = sum(torch.diag(p) - torch.outer(p, p) for p in probs)
        a = sum(torch.outer(x, x) for x in phi) / len(phi)
        h = torch.kron(g, a)
        if b is not None:
            h = torch.block_diag(h, g)
    assert isinstance(h, torch.Tensor)
    return h + delta * torch.eye(h.shape[0], dtype=torch.float64)


def _reference(phi, y, w, b, structure, delta, samples, seed, folds) -> float:
    """Mean −log p_y over the fit rows, each predicted by its fold's complement (see the module
    docstring); ``folds``: curvcal's folds, read only for the order of G's eigenvectors."""
    k = w.shape[0]
    fold_of = torch.as_tensor(cv_folds(y, lp.PRIOR_FOLDS, seed))
    total, count, used = 0.0, 0, iter(folds)
    for j in range(lp.PRIOR_FOLDS):
        held, train = fold_of == j, fold_of != j
        if not bool(held.any()) or not bool(train.any()):
            continue
        fold = next(used)
        cov = torch.linalg.inv(_dense_precision(phi[train], w, b, structure, delta))
        rows = phi[held]
        normals = torch.randn(
            samples, len(rows), k, generator=torch.Generator().manual_seed(seed),
            dtype=torch.float64,
        )  # fmt: skip
        if structure == "kron":
            probs = torch.softmax(phi[train] @ w.T + (0 if b is None else b), 1)
            g = sum(torch.diag(p) - torch.outer(p, p) for p in probs)
            assert torch.allclose(fold.curvature.kron_g, g, rtol=0, atol=1e-10)
            qg = torch.linalg.eigh(fold.curvature.kron_g)[1]
        for i, (x, label) in enumerate(zip(rows, y[held], strict=True)):
            jac = _jacobian(x, k, b is not None)
            logit_cov = jac @ cov @ jac.T
            if structure == "full":
                root = torch.linalg.cholesky(logit_cov)
            else:
                rotated = qg.T @ logit_cov @ qg
                off = rotated - torch.diag(torch.diagonal(rotated))
                assert float(off.abs().max()) < 1e-10 * float(rotated.abs().max())
                root = qg * torch.diagonal(rotated).sqrt()
            assert torch.allclose(root @ root.T, logit_cov, rtol=0, atol=1e-10)
            mean = w @ x + (0 if b is None else b)
            draws = mean + normals[:, i, :] @ root.T
            total -= math.log(float(torch.softmax(draws, 1)[:, label].mean()))
            count += 1
    return total / count


@pytest.mark.parametrize(
    ("structure", "k", "d", "bias"),
    [("full", 3, 4, True), ("full", 4, 3, False), ("kron", 3, 4, True), ("kron", 3, 2, False)],
)
def test_monte_carlo_heldout_nll_matches_dense_reference(structure, k, d, bias) -> None:
    phi, y, w, b = _problem(60, k, d, bias)
    probs = torch.softmax(phi @ w.T + (0 if b is None else b), 1)
    seed, samples = 3, 64
    folds = lp.heldout_folds(phi, probs, y, bias, structure, lp.PRIOR_FOLDS, seed)
    template = lp.LaplaceMap(w, b, 1.0, structure, "mc", samples, seed, "")
    for delta in (0.05, 1.0, 30.0):
        expected = _reference(phi, y, w, b, structure, delta, samples, seed, folds)
        assert abs(lp.heldout_nll(delta, folds, template) - expected) < 1e-10, delta


@pytest.mark.parametrize(
    ("structure", "predictive"),
    [("full", "mc"), ("full", "probit"), ("kron", "mc"), ("kron", "probit")],
)
def test_search_objective_is_the_predictive_built_at_each_delta(structure, predictive) -> None:
    """The bases and draws kept per fold give what building each fold's posterior at δ and
    running the saved calibrator's predictive gives (the path taken when the cache would be
    too big)."""
    phi, y, w, b = _problem(70, 4, 3, True)
    probs = torch.softmax(phi @ w.T + b, 1)
    folds = lp.heldout_folds(phi, probs, y, True, structure, lp.PRIOR_FOLDS, 1)
    template = lp.LaplaceMap(w, b, 1.0, structure, predictive, 30, 1, "")
    for delta in (1e-3, 0.7, 40.0):
        built = [
            lp.predictive_log_probs(lp._posterior(template, f.curvature, delta), f.features)
            .gather(1, f.labels[:, None])
            .sum()
            for f in folds
        ]
        expected = -float(sum(built)) / 70
        assert abs(lp.heldout_nll(delta, folds, template) - expected) < 1e-12, delta


def test_draws_are_made_once_per_fold_for_the_whole_search(monkeypatch) -> None:
    phi, y, w, b = _problem(50, 3, 4, True)
    calls: list[int] = []
    original = lp._normal_chunks

    def counted(n: int, k: int, samples: int, seed: int):
        calls.append(n)
        return original(n, k, samples, seed)

    monkeypatch.setattr(lp, "_normal_chunks", counted)
    fit = lp.fit_laplace(phi, y, w, b, structure="full", predictive="mc", samples=20, prior="nll")
    # one draw per fold (for about 80 evaluations of the objective), one for the refit's
    # predictive on the whole fit split
    assert fit.prior_folds == 5 and len(calls) == 6
    assert sum(calls[:5]) == 50 and calls[5] == 50


def test_covariance_root_is_cholesky_and_survives_a_singular_covariance() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    cov = a @ a.transpose(1, 2)
    cov[2] = 0.0  # a row with no logit uncertainty: no Cholesky factor
    cov[3] = torch.outer(a[3, :, 0], a[3, :, 0])  # rank one
    root = lp.covariance_root(cov)
    assert torch.equal(root[:2], torch.linalg.cholesky(cov[:2]))
    assert torch.equal(root[2], torch.zeros(3, 3, dtype=torch.float64))
    assert torch.allclose(root[3] @ root[3].T, cov[3], rtol=0, atol=1e-12)


def test_a_zero_feature_row_without_bias_is_predicted_by_its_mean() -> None:
    """Border case: no bias and φ = 0 give Σ_f = 0 (no Cholesky factor): the draws all equal
    f_μ = 0, so p is uniform, and the search stays finite."""
    phi, y, w, _ = _problem(40, 3, 4, False)
    phi[::7] = 0.0
    fit = lp.fit_laplace(
        phi, y, w, None, structure="full", predictive="mc", samples=16, prior="nll"
    )
    assert fit.heldout_nll is not None and math.isfinite(fit.heldout_nll)
    probs = fit.calibrator.probabilities(phi[:1])
    assert torch.allclose(probs, torch.full((1, 3), 1 / 3, dtype=torch.float64), rtol=0, atol=1e-15)


def test_monte_carlo_prior_search_without_draws_is_refused() -> None:
    phi, y, w, b = _problem(30, 3, 4, True)
    with pytest.raises(InputError, match="laplace_samples"):
        lp.fit_laplace(phi, y, w, b, predictive="mc", samples=0, prior="nll")


def test_cli_refuses_zero_draws_in_one_line(run_cli) -> None:
    from tests.commands.test_calibrate import CKPT, DATA

    result = run_cli("calibrate", CKPT, *DATA, "--method", "laplace", "--laplace-prior", "nll",
                     "--laplace-predictive", "mc", "--laplace-samples", "0")  # fmt: skip
    assert result.code == 2
    assert "--laplace-samples" in result.output and "Traceback" not in result.output


def test_folds_searched_again_with_other_draws_use_those_draws() -> None:
    """The cached draws belong to one seed and count: the same folds asked with another seed
    or draw count give what fresh folds give."""
    phi, y, w, b = _problem(50, 3, 4, True)
    probs = torch.softmax(phi @ w.T + b, 1)

    def folds() -> list[lp.HeldOutFold]:
        return lp.heldout_folds(phi, probs, y, True, "kron", lp.PRIOR_FOLDS, 0)

    shared = folds()
    for seed, samples in ((1, 20), (2, 20), (2, 30)):
        template = lp.LaplaceMap(w, b, 1.0, "kron", "mc", samples, seed, "")
        assert lp.heldout_nll(0.5, shared, template) == lp.heldout_nll(0.5, folds(), template)
