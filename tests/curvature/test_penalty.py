"""The differentiable Hutchinson trace penalty against dense Hessians and closed forms."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from curvcal.curvature.penalty import double_backward_hvp, hutchinson_trace_penalty
from curvcal.errors import InputError

F64 = torch.float64


class FlatMLP(nn.Module):
    """A 3-4-3 tanh MLP whose weights are slices of one flat parameter θ (so the dense Hessian
    w.r.t. θ is one call of ``torch.autograd.functional.hessian``)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.theta = nn.Parameter(
            torch.randn(3 * 4 + 4 + 4 * 3 + 3, generator=generator, dtype=F64)
        )

    @staticmethod
    def apply(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        w1, b1 = theta[:12].reshape(4, 3), theta[12:16]
        w2, b2 = theta[16:28].reshape(3, 4), theta[28:31]
        return torch.tanh(x @ w1.t() + b1) @ w2.t() + b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(self.theta, x)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(9, 3, generator=generator, dtype=F64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 1])
    return x, y


def _loss_of(theta: torch.Tensor) -> torch.Tensor:
    x, y = _data()
    return nn.functional.cross_entropy(FlatMLP.apply(theta, x), y)


def _dense_hessian(model: FlatMLP) -> torch.Tensor:
    return torch.autograd.functional.hessian(_loss_of, model.theta.detach())


def _rademacher(p: int, m: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (p, m), generator=generator) * 2 - 1).to(F64)


def test_double_backward_products_match_the_dense_hessian() -> None:
    model = FlatMLP()
    x, y = _data()
    loss = nn.functional.cross_entropy(model(x), y)
    vectors = torch.randn(3, 31, dtype=F64, generator=torch.Generator().manual_seed(2))
    (products,) = double_backward_hvp(loss, [model.theta], [vectors])
    expected = vectors @ _dense_hessian(model)  # H symmetric
    torch.testing.assert_close(products, expected, rtol=1e-10, atol=1e-12)


def test_penalty_with_given_probes_is_the_mean_quadratic_form() -> None:
    model = FlatMLP()
    x, y = _data()
    probes = _rademacher(31, 5, 3)
    value = hutchinson_trace_penalty(model, nn.functional.cross_entropy(model(x), y), probes)
    dense = _dense_hessian(model)
    expected = torch.einsum("pm,pq,qm->m", probes, dense, probes).mean()
    assert float(value.detach()) == pytest.approx(float(expected), rel=1e-10)


def test_penalty_is_unbiased_for_the_exact_trace() -> None:
    model = FlatMLP()
    x, y = _data()
    exact = float(torch.trace(_dense_hessian(model)))
    generator = torch.Generator().manual_seed(4)
    samples = torch.tensor(
        [
            hutchinson_trace_penalty(
                model, nn.functional.cross_entropy(model(x), y), 1, generator=generator
            )
            .detach()
            .item()
            for _ in range(300)
        ]
    )
    standard_error = float(samples.std()) / math.sqrt(len(samples))
    assert standard_error > 0  # a non-diagonal Hessian: single probes differ
    assert abs(float(samples.mean()) - exact) < 3 * standard_error


def test_penalty_gradient_matches_central_differences() -> None:
    model = FlatMLP()
    x, y = _data()
    probes = _rademacher(31, 3, 5)

    def penalty_at(theta: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            model.theta.copy_(theta)
        return hutchinson_trace_penalty(model, nn.functional.cross_entropy(model(x), y), probes)

    theta0 = model.theta.detach().clone()
    (gradient,) = torch.autograd.grad(penalty_at(theta0), model.theta)
    direction = torch.randn(31, dtype=F64, generator=torch.Generator().manual_seed(6))
    h = 1e-5
    numeric = (penalty_at(theta0 + h * direction) - penalty_at(theta0 - h * direction)) / (2 * h)
    assert float(gradient @ direction) == pytest.approx(float(numeric.detach()), rel=1e-6)


class Quartic(nn.Module):
    """L(θ) = ¼(θᵀθ)²: H = (θᵀθ)·I + 2θθᵀ, tr H = (P + 2)·θᵀθ."""

    def __init__(self, theta: torch.Tensor) -> None:
        super().__init__()
        self.theta = nn.Parameter(theta.clone())

    def loss(self) -> torch.Tensor:
        return 0.25 * (self.theta @ self.theta) ** 2


def test_penalty_value_and_gradient_in_closed_form() -> None:
    theta = torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=F64)
    p = theta.numel()
    model = Quartic(theta)
    probes = _rademacher(p, 6, 7)
    value = hutchinson_trace_penalty(model, model.loss(), probes)
    (gradient,) = torch.autograd.grad(value, model.theta)
    # vᵀHv = P·θᵀθ + 2(vᵀθ)² for Rademacher v (vᵀv = P).
    dots = probes.t() @ theta
    expected_value = (p * (theta @ theta) + 2 * dots**2).mean()
    expected_gradient = 2 * p * theta + 4 * (dots[None, :] * probes).mean(dim=1)
    assert float(value.detach()) == pytest.approx(float(expected_value), rel=1e-12)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-12, atol=1e-12)


def test_diagonal_hessian_gives_the_exact_trace_and_gradient_for_any_probe() -> None:
    # L(θ) = Σ a_i θ_i⁴ / 12: H = diag(a_i θ_i²), so vᵀHv = tr H = Σ a_i θ_i² for every
    # Rademacher v, and ∇ tr H = 2 a θ.
    a = torch.tensor([1.0, 2.0, 0.5], dtype=F64)
    theta = nn.Parameter(torch.tensor([1.5, -0.5, 3.0], dtype=F64))
    holder = nn.Module()
    holder.theta = theta
    value = hutchinson_trace_penalty(
        holder, (a * theta**4).sum() / 12, 4, generator=torch.Generator().manual_seed(8)
    )
    (gradient,) = torch.autograd.grad(value, theta)
    assert float(value.detach()) == pytest.approx(float((a * theta.detach() ** 2).sum()), rel=1e-12)
    torch.testing.assert_close(gradient, 2 * a * theta.detach(), rtol=1e-12, atol=0)


def test_unused_parameters_add_nothing_and_the_model_is_untouched() -> None:
    model = FlatMLP()
    model.unused = nn.Parameter(torch.ones(5, dtype=F64))
    model.train()
    x, y = _data()
    loss = nn.functional.cross_entropy(model(x), y)
    probes = _rademacher(36, 4, 10)  # θ (31) then the unused parameter (5)
    value = hutchinson_trace_penalty(model, loss, probes)
    theta_only = hutchinson_trace_penalty(model, loss, probes[:31], params=[model.theta])
    assert float(value.detach()) == pytest.approx(float(theta_only.detach()), rel=1e-12)
    assert model.training and model.theta.grad is None and model.unused.grad is None


def test_a_loss_without_curvature_gives_zero() -> None:
    theta = nn.Parameter(torch.tensor([1.0, 2.0], dtype=F64))
    holder = nn.Module()
    holder.theta = theta
    value = hutchinson_trace_penalty(holder, (3 * theta).sum(), _rademacher(2, 3, 11))
    assert float(value.detach()) == 0.0


def test_bad_inputs() -> None:
    model = FlatMLP()
    x, y = _data()
    loss = nn.functional.cross_entropy(model(x), y)
    generator = torch.Generator()
    with pytest.raises(InputError, match="probes"):
        hutchinson_trace_penalty(model, loss, 0, generator=generator)
    with pytest.raises(InputError, match="probes"):
        hutchinson_trace_penalty(model, loss, torch.ones(30, 2, dtype=F64))
    with pytest.raises(InputError, match="generator"):
        hutchinson_trace_penalty(model, loss, 2)
    with pytest.raises(InputError, match="scalar"):
        hutchinson_trace_penalty(
            model,
            nn.functional.cross_entropy(model(x), y, reduction="none"),
            2,
            generator=generator,
        )
    with pytest.raises(InputError, match="graph"):
        hutchinson_trace_penalty(model, loss.detach(), 2, generator=generator)
    frozen = FlatMLP().requires_grad_(False)
    with pytest.raises(InputError, match="params"):
        hutchinson_trace_penalty(frozen, loss, 2, generator=generator)
