"""The full maps' per-class block preconditioner (curvcal.calibration.class_blocks): its
Woodbury solve against the dense blocks B_i formed from their definition and inverted in
float64 (and, with every row kept, against the exact diagonal blocks of the whitened
objective's Hessian from autograd), its border cases, and a nearly interpolating fit that
reaches the same minimiser as a dense Newton reference in fewer Hessian products."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import curvcal.calibration.linear as linear
from curvcal.calibration.class_blocks import (
    block_basis,
    class_block_preconditioner,
    has_block_base,
)
from curvcal.calibration.linear import _FullProblem, fit_linear, penalty_weights


def _scores(n: int, k: int, seed: int, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    z = torch.randn(n, k, generator=generator, dtype=torch.float64)
    z[torch.arange(n), y] += 2.0
    return spread * z, y


def _softmax_at(problem: _FullProblem, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A point Ṽ (K×(K+1)) of moderate size and the softmax there."""
    generator = torch.Generator().manual_seed(seed)
    k = problem.k
    theta = torch.randn(k, k + 1, generator=generator, dtype=torch.float64)
    return theta, torch.softmax(problem.a @ theta.T, dim=1)


def _dense_blocks(
    problem: _FullProblem, penalty: torch.Tensor, q: torch.Tensor, rows: int
) -> torch.Tensor:
    """B_i of the module docstring, formed term by term."""
    a, p, n, k = problem.a, problem.p, problem.n, problem.k
    w = q * (1.0 - q)
    norms = (a * a).sum(1)
    blocks = []
    for i in range(k):
        chosen = torch.topk(w[:, i], min(rows, n)).indices
        rest = torch.ones(n, dtype=torch.bool)
        rest[chosen] = False
        mu = float((w[rest, i] * norms[rest]).sum()) / (n * (k + 1))
        data = a[chosen].T @ (w[chosen, i, None] * a[chosen]) / n
        regulariser = 2.0 * (p * penalty[i]) @ p  # exactly row i's, c⁰ and its correction
        blocks.append(regulariser + data + mu * torch.eye(k + 1, dtype=torch.float64))
    return torch.stack(blocks)


@pytest.mark.parametrize("regulariser", ["odir", "l2"])
@pytest.mark.parametrize("rows", [7, 1000])
def test_the_woodbury_solve_matches_the_dense_blocks(regulariser: str, rows: int) -> None:
    n, k = 90, 6
    x, y = _scores(n, k, seed=1)
    problem = _FullProblem(x, y)
    penalty = penalty_weights(regulariser, k, 0.3, 0.05)
    _, q = _softmax_at(problem, seed=2)
    basis = block_basis(problem.a, problem.p, penalty)
    precondition = class_block_preconditioner(basis, q, rows=rows)
    v = torch.randn(k, k + 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = torch.from_numpy(precondition(v.reshape(-1).numpy())).view(k, k + 1)
    blocks = _dense_blocks(problem, penalty, q, rows)
    expected = torch.linalg.solve(blocks, v[..., None])[..., 0]
    assert torch.allclose(got, expected, rtol=1e-8, atol=1e-10 * float(expected.abs().max()))


def test_with_every_row_kept_the_blocks_are_the_hessians_diagonal_blocks() -> None:
    """rows ≥ N: μ_i = 0 (up to its floor), so B_i is H_ii of the whitened objective exactly
    (autograd, float64)."""
    n, k = 40, 4
    x, y = _scores(n, k, seed=3)
    problem = _FullProblem(x, y)
    penalty = penalty_weights("odir", k, 0.2, 0.1)
    theta, q = _softmax_at(problem, seed=4)
    a, p = problem.a, problem.p

    def objective(flat: torch.Tensor) -> torch.Tensor:
        vt = flat.view(k, k + 1)
        logq = torch.log_softmax(a @ vt.T, dim=1)
        v = vt @ p
        return -logq[torch.arange(n), y].mean() + (penalty * v * v).sum()

    hessian = torch.autograd.functional.hessian(objective, theta.reshape(-1))
    width = k + 1
    basis = block_basis(a, p, penalty)
    precondition = class_block_preconditioner(basis, q, rows=n)
    v = torch.randn(k, width, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    got = torch.from_numpy(precondition(v.reshape(-1).numpy())).view(k, width)
    for i in range(k):
        block = hessian[i * width : (i + 1) * width, i * width : (i + 1) * width]
        expected = torch.linalg.solve(block, v[i])
        assert torch.allclose(got[i], expected, rtol=1e-7, atol=1e-9 * float(expected.abs().max()))


def test_an_unregularised_fit_has_no_block_base() -> None:
    """λ = 0 (or a column regularised in no row): no positive definite base, so the fit keeps
    the Kronecker preconditioner."""
    x, y = _scores(30, 3, seed=7)
    problem = _FullProblem(x, y)
    for unregularised in (
        penalty_weights("odir", 3, 0.0, 0.0),
        penalty_weights("odir", 3, 0.1, 0.0),
    ):
        assert not has_block_base(unregularised)
        with pytest.raises(ValueError, match="no base"):
            block_basis(problem.a, problem.p, unregularised)
    assert has_block_base(penalty_weights("odir", 3, 0.1, 0.05))


def test_two_classes_and_fewer_rows_than_kept() -> None:
    """K = 2 (the smallest full map) with N under the rows kept: every row enters exactly."""
    n, k = 5, 2
    x, y = _scores(n, k, seed=8)
    problem = _FullProblem(x, y)
    penalty = penalty_weights("odir", k, 0.5, 0.5)
    _, q = _softmax_at(problem, seed=9)
    basis = block_basis(problem.a, problem.p, penalty)
    precondition = class_block_preconditioner(basis, q)
    v = torch.ones(k, k + 1, dtype=torch.float64)
    got = torch.from_numpy(precondition(v.reshape(-1).numpy())).view(k, k + 1)
    expected = torch.linalg.solve(_dense_blocks(problem, penalty, q, n), v[..., None])[..., 0]
    assert torch.allclose(got, expected, rtol=1e-8)


def _dense_newton(problem: _FullProblem, penalty: torch.Tensor) -> torch.Tensor:
    """The whitened objective's minimiser by dense Newton (autograd Hessian, float64)."""
    k, a, p, y, n = problem.k, problem.a, problem.p, problem.y, problem.n

    def objective(flat: torch.Tensor) -> torch.Tensor:
        vt = flat.view(k, k + 1)
        logq = torch.log_softmax(a @ vt.T, dim=1)
        v = vt @ p
        return -logq[torch.arange(n), y].mean() + (penalty * v * v).sum()

    theta = torch.from_numpy(problem.to_whitened(linear._identity(k))).clone()
    for _ in range(200):
        flat = theta.clone().requires_grad_(True)
        value = objective(flat)
        (gradient,) = torch.autograd.grad(value, flat)
        hessian = torch.autograd.functional.hessian(objective, theta, vectorize=True)
        step = torch.linalg.solve(hessian, gradient)
        t = 1.0
        while float(objective(theta - t * step)) > float(value.detach()) and t > 1e-12:
            t *= 0.5
        theta = theta - t * step
        if float(gradient.abs().max()) < 1e-13:
            break
    return problem.to_map(theta.numpy())


def test_a_nearly_interpolating_fit_reaches_the_dense_minimiser_in_fewer_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dirichlet ODIR on 120 rows of 30 classes (930 parameters, 4 rows a class): the fit
    nearly interpolates and the Kronecker preconditioner leaves conjugate gradients long
    solves. With the block preconditioner the probabilities match a dense Newton
    minimisation, and the fit takes fewer Hessian products than with the Kronecker one
    alone (the switch disabled)."""
    n, k = 120, 30
    x, y = _scores(n, k, seed=11, spread=2.0)
    logp = torch.log_softmax(x, dim=1)
    penalty = penalty_weights("odir", k, 0.01, 0.01)
    reference = _dense_newton(_FullProblem(logp, y), penalty)
    expected = torch.softmax(logp @ reference[:, :k].T + reference[:, k], dim=1)

    counts = {}
    original = linear._steihaug
    for name, switch in [("kronecker", 10**9), ("blocks", linear.STRETCH_PRODUCTS)]:
        products = [0]

        def counting(times, *args, products=products, **kwargs):  # type: ignore[no-untyped-def]
            def counted(v: np.ndarray) -> np.ndarray:
                products[0] += 1
                return times(v)

            return original(counted, *args, **kwargs)

        monkeypatch.setattr(linear, "_steihaug", counting)
        monkeypatch.setattr(linear, "STRETCH_PRODUCTS", switch)
        fit = fit_linear(logp, y, "dirichlet", kind="logprobs", l2_off_diagonal=0.01, l2_bias=0.01)
        assert fit.converged
        m = fit.calibrator
        weights = torch.tensor(m.weights, dtype=torch.float64)
        got = torch.softmax(logp @ weights.T + torch.tensor(m.bias, dtype=torch.float64), dim=1)
        assert float((got - expected).abs().max()) < 1e-6
        counts[name] = products[0]
    assert counts["blocks"] < counts["kronecker"]
