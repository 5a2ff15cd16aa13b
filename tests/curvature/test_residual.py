"""The split trace tr(H) = tr(G) + tr(R): the linearised loss, its products and the estimate,
against dense float64 matrices built independently (H by torch.func.hessian, G = (1/N) Σ JᵀΛJ
from the logits' Jacobians)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import curvcal
from curvcal.curvature import build_operator
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.residual import (
    METHODS,
    residual_products,
    split_problem,
    split_result,
    split_trace,
)
from curvcal.errors import InputError
from curvcal.losses import CrossEntropy, FLSD53Loss, Focal, Linearised, Loss, logit_gradient
from curvcal.settings.hessian import HessianSettings

from .cases import BATCH, dense_gauss_newton, dense_hessian, make_data, make_mlp, split

LOSSES = [CrossEntropy(), Focal(0.5), Focal(2.0), FLSD53Loss()]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: f"{loss.name}-{loss.gamma}")
def test_logit_gradient_is_autograds(loss: Loss) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = 3.0 * torch.randn(40, 6, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 6, (40,), generator=generator)
    leaf = logits.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(loss.sum(leaf, labels), leaf)
    assert torch.allclose(logit_gradient(loss, logits, labels), expected, rtol=1e-12, atol=1e-14)


def test_logit_gradient_hand_worked() -> None:
    # logits (0, ln 3): p = (1/4, 3/4); label 1, so p_y = 3/4 and e_y − p = (−1/4, 1/4)
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    labels = torch.tensor([1])
    ce = logit_gradient(CrossEntropy(), logits, labels)
    assert ce[0].tolist() == pytest.approx([0.25, -0.25], abs=1e-15)
    # focal γ = 2: φ'(u) = q²(2 p log p / q − 1) with q = 1/4, p = 3/4
    slope = (1 / 16) * (6 * math.log(0.75) - 1)
    focal = logit_gradient(Focal(2.0), logits, labels)
    assert focal[0].tolist() == pytest.approx([-0.25 * slope, 0.25 * slope], abs=1e-15)


def test_logit_gradient_is_finite_where_the_label_saturates() -> None:
    # p_y = 1 to the last bit (row 0) and p_y ≈ e^-800 (row 1)
    logits = torch.tensor([[800.0, 0.0, -3.0], [0.0, 800.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0])
    for gamma in (0.5, 2.0):
        gradient = logit_gradient(Focal(gamma), logits, labels)
        assert torch.isfinite(gradient).all()
        assert gradient[0].tolist() == [0.0, 0.0, 0.0]  # (1 − p_y)^γ = 0 there
    assert logit_gradient(Focal(0.0), logits, labels)[0].tolist() == [0.0, 0.0, 0.0]
    # far from the label, cross-entropy's gradient is p − e_y = (−1, 1, 0) to rounding
    far = logit_gradient(CrossEntropy(), logits, labels)[1]
    assert far.tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-300)


@pytest.mark.parametrize(
    ("logits", "labels", "what"),
    [
        (torch.zeros(4), torch.zeros(4, dtype=torch.long), "logits"),
        (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), "labels"),
        (torch.zeros(4, 3), torch.zeros(4, 1, dtype=torch.long), "labels"),
    ],
)
def test_logit_gradient_refuses_bad_shapes(logits: Tensor, labels: Tensor, what: str) -> None:
    with pytest.raises(InputError, match=f"^{what}:"):
        logit_gradient(CrossEntropy(), logits, labels)


@pytest.mark.parametrize("loss", [CrossEntropy(), Focal(2.0)], ids=["ce", "focal"])
def test_the_linearised_loss_has_the_hessian_the_gauss_newton_matrix_leaves_out(
    loss: Loss,
) -> None:
    model = make_mlp()  # tanh: R is not zero
    x, y = make_data("mlp")
    hessian = dense_hessian(model, x, y, loss=lambda z, t: loss.sum(z, t) / t.shape[0])
    gauss_newton = dense_gauss_newton(model, x, y, loss)
    residual = dense_hessian(model, x, y, loss=lambda z, t: Linearised(loss).sum(z, t) / t.shape[0])
    assert float(residual.norm()) > 0.05 * float(hessian.norm())
    assert torch.allclose(residual, hessian - gauss_newton, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("engine", "keep"), [("func", "never"), ("autograd", "never"), ("autograd", "always")]
)
def test_with_loss_multiplies_by_the_residual(engine: str, keep: str) -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    loss = CrossEntropy()
    residual = dense_hessian(model, x, y, loss=lambda z, t: Linearised(loss).sum(z, t) / t.shape[0])
    operator = HessianOperator(model, split(x, y, BATCH), loss, hvp=engine, keep_graphs=keep)
    vectors = torch.randn(75, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    before = operator.matmat(vectors)
    other = operator.with_loss(Linearised(loss))
    assert torch.allclose(other.matmat(vectors), residual @ vectors, rtol=0, atol=1e-13)
    # the original is untouched, counts are shared, and only one kept graph is held at a time
    assert other.loss == Linearised(loss) and operator.loss == loss
    assert operator.total_matvecs == other.total_matvecs == 6
    assert operator._graphs.kept is None
    assert torch.equal(operator.matmat(vectors), before)


@pytest.mark.parametrize("method", list(METHODS))
def test_split_trace_is_exact_when_the_sketch_spans_the_space(method: str) -> None:
    """P = 75: with 2P products or more left for R the sketch holds R's whole range, so the
    split estimate is tr(G) + tr(R) = tr(H) to rounding."""
    model = make_mlp()
    x, y = make_data("mlp")
    hessian = dense_hessian(model, x, y)
    operator = build_operator(model, CrossEntropy(), split(x, y, BATCH))
    result = split_trace(operator, method, 400, seed=1)
    assert result.method == method
    assert result.estimate == pytest.approx(float(hessian.trace()), rel=1e-10)
    gauss_newton = dense_gauss_newton(model, x, y, CrossEntropy())
    assert result.parts is not None
    assert result.parts["gauss_newton"] == pytest.approx(float(gauss_newton.trace()), rel=1e-12)
    assert result.parts["residual"] == pytest.approx(
        float(hessian.trace() - gauss_newton.trace()), rel=1e-9
    )


def test_split_trace_spends_the_products_left_and_covers_the_trace() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    hessian = dense_hessian(model, x, y)
    operator = build_operator(model, CrossEntropy(), split(x, y, BATCH))
    spent: list[int] = []
    result = split_trace(operator, "gauss-newton+hutchpp", 30, seed=2, on_step=spent.append)
    assert result.matvecs == residual_products(30, 3) == 28 == spent[-1]
    assert operator.total_matvecs == 28
    low, high = result.ci95
    assert low <= float(hessian.trace()) <= high
    assert result.engine and result.interval.startswith("tr(G) exact up to rounding")


def test_the_split_interval_covers_at_least_93_percent() -> None:
    """The split's interval is Hutch++'s on R, moved by tr(G): 200 seeded runs of Hutch++ on
    the tanh MLP's dense R, checked against tr(H)."""
    model = make_mlp()
    x, y = make_data("mlp")
    loss = CrossEntropy()
    hessian = dense_hessian(model, x, y)
    residual = dense_hessian(model, x, y, loss=lambda z, t: Linearised(loss).sum(z, t) / t.shape[0])
    exact = float(hessian.trace())
    gauss_newton = exact - float(residual.trace())
    hits = 0
    for seed in range(200):
        low, high = curvcal.curvature.trace.trace_estimate(residual, 40, seed=seed).ci95
        hits += low + gauss_newton <= exact <= high + gauss_newton
    assert 0.93 <= hits / 200 <= 0.99


def test_split_problems_are_named() -> None:
    assert split_problem("eval", 100, 10) == ""
    assert "train mode" in split_problem("train", 100, 10)
    assert "leaving 3 of probes 12" in split_problem("eval", 12, 10)
    assert split_problem("eval", 13, 10) == ""


def test_split_trace_refuses_what_cannot_run_before_any_product() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    operator = build_operator(model, CrossEntropy(), split(x, y, BATCH))
    with pytest.raises(InputError, match="leaving 3 of probes 5"):
        split_trace(operator, "gauss-newton+hutchpp", 5)
    with pytest.raises(InputError, match="unknown split trace method"):
        split_trace(operator, "gauss-newton+hutchinson", 100)
    train = build_operator(model, CrossEntropy(), split(x, y, BATCH), HessianSettings(mode="train"))
    with pytest.raises(InputError, match="train mode"):
        split_trace(train, "gauss-newton+xtrace", 100)
    assert operator.total_matvecs == 0 and train.total_matvecs == 0
    with pytest.raises(InputError, match="unknown split trace method"):
        split_result("hutchpp", None, None)  # type: ignore[arg-type]


def test_the_api_runs_the_split_trace_and_refuses_bad_requests() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    batches = split(x, y, BATCH)
    operator = build_operator(model, CrossEntropy(), batches)
    expected = split_trace(operator, "gauss-newton+xtrace", 40, seed=3)
    assert curvcal.hessian_trace(
        model, batches, 40, trace_method="gauss-newton+xtrace", seed=3
    ) == (expected)
    with pytest.raises(InputError, match="adaptive stop"):
        curvcal.hessian_trace(
            model, batches, 40, trace_method="gauss-newton+hutchpp", trace_rtol=0.1
        )
    with pytest.raises(InputError, match="unknown trace method 'gauss-newton\\+power'"):
        curvcal.hessian_trace(model, batches, 40, trace_method="gauss-newton+power")
