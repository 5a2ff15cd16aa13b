"""The study kernel: Spearman correlations by hand, curvature against dense float64 truth."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvcal.curvature.analysis import analyse_batches
from curvcal.curvature.batches import BatchSource
from curvcal.errors import InputError
from curvcal.settings.hessian import HessianSettings
from curvcal.study.summary import (
    CALIBRATION_MEASURES,
    CURVATURE_MEASURES,
    CalibrationSummary,
    CurvatureSummary,
    StudyRow,
    curvature_summary,
    rank_correlations,
)

F64 = torch.float64


def _row(lambda_max: float, trace: float, ece: float, index: int) -> StudyRow:
    curvature = CurvatureSummary(
        lambda_max, True, 0.0, trace, 0.1, "ce", None, 0.1, 10, 5, 3, "func"
    )
    calibration = CalibrationSummary(
        10, 10, 0.9, ece, ece + 0.01 * index, 0.3, 1.0 + index, 0.5, 1.2, 0.01, 0.02 * index
    )
    return StudyRow(f"m{index}", "ce", 0.0, None, curvature, calibration)


def test_spearman_matches_the_rank_formula() -> None:
    # ranks x: 1 2 3 4, ECE ranks: 1 3 2 4 -> ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    rows = [
        _row(1.0, 4.0, 0.1, 0),
        _row(2.0, 3.0, 0.3, 1),
        _row(3.0, 2.0, 0.2, 2),
        _row(4.0, 1.0, 0.4, 3),
    ]
    by_pair = {(c.curvature, c.calibration): c for c in rank_correlations(rows)}
    assert len(by_pair) == len(CURVATURE_MEASURES) * len(CALIBRATION_MEASURES)
    assert by_pair["lambda_max", "ece"].rho == pytest.approx(0.8)
    assert by_pair["trace", "ece"].rho == pytest.approx(-0.8)
    assert by_pair["lambda_max", "temperature"].rho == pytest.approx(1.0)
    # exact p of ρ = 0.8, n = 4: of the 24 pairings, ρ = 1 once and ρ = 0.8 for the three
    # adjacent swaps, so P(ρ ≥ 0.8) = 4/24 and the two-sided p is 2·4/24 = 1/3
    assert by_pair["lambda_max", "ece"].p_value == pytest.approx(1 / 3)
    assert by_pair["lambda_max", "ece"].p_method == "exact permutation"
    constant = by_pair["lambda_max", "focal_gamma"]
    assert constant.rho is None and constant.note is not None and "constant" in constant.note


def test_fewer_than_three_checkpoints_give_no_correlation() -> None:
    rows = [_row(1.0, 1.0, 0.1, 0), _row(2.0, 2.0, 0.2, 1)]
    for correlation in rank_correlations(rows):
        assert correlation.rho is None and correlation.p_value is None and correlation.n == 2


def measure_curvature(
    model: nn.Module, batches: BatchSource, settings: HessianSettings
) -> CurvatureSummary:
    """The study's curvature numbers as ``curvcal study`` takes them: the analysis behind
    ``curvcal hessian`` with the study's settings, summarised."""
    return curvature_summary(analyse_batches(model, batches, settings))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).to(F64)


def test_curvature_matches_the_dense_hessian() -> None:
    model = _model()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(20, 3, generator=generator, dtype=F64)
    y = torch.randint(0, 3, (20,), generator=generator)
    batches = [(x[:7], y[:7]), (x[7:], y[7:])]
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]

    def loss(theta: torch.Tensor) -> torch.Tensor:
        pieces = [
            t.reshape(s)
            for t, s in zip(theta.split([s.numel() for s in shapes]), shapes, strict=True)
        ]
        logits = torch.func.functional_call(model, dict(zip(names, pieces, strict=True)), (x,))
        return nn.functional.cross_entropy(logits, y)

    dense = torch.autograd.functional.hessian(
        loss, torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    )
    summary = measure_curvature(model, batches, HessianSettings(tol=1e-8, probes=400))
    assert summary.lambda_max == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-6)
    # tanh: the Gauss–Newton trace is not exact, so its part is taken exactly and Hutch++ on
    # the rest, whose 398 products ≥ 3·P sketch the whole space: exact up to rounding
    assert summary.trace == pytest.approx(float(torch.trace(dense)), abs=1e-10)
    assert summary.n_samples == 20 and summary.n_params == dense.shape[0]
    assert summary.trace_method == "gauss-newton+hutchpp"

    # ReLU: linear in each tensor, so the study takes the exact Gauss–Newton trace, even with a
    # product budget far too small for Hutch++ to be exact
    torch.manual_seed(0)
    relu = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)).to(F64)
    exact = torch.autograd.functional.hessian(
        lambda theta: _loss_at(relu, theta, x, y),
        torch.cat([p.detach().reshape(-1) for p in relu.parameters()]),
    )
    summary = measure_curvature(relu, batches, HessianSettings(probes=4))
    assert summary.trace_method == "gauss-newton"
    assert summary.trace == pytest.approx(float(torch.trace(exact)), rel=1e-12)


def _loss_at(
    model: nn.Module, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    pieces = [
        t.reshape(s) for t, s in zip(theta.split([s.numel() for s in shapes]), shapes, strict=True)
    ]
    logits = torch.func.functional_call(model, dict(zip(names, pieces, strict=True)), (x,))
    return nn.functional.cross_entropy(logits, y)


def test_bad_settings_and_losses() -> None:
    with pytest.raises(InputError, match="probes"):
        HessianSettings(probes=1)
    with pytest.raises(InputError, match="tol"):
        HessianSettings(tol=0.0)
    with pytest.raises(InputError, match="method"):
        HessianSettings(method="arnoldi")
    with pytest.raises(InputError, match="loss"):
        HessianSettings(loss="hinge")
    with pytest.raises(InputError, match="γ"):
        HessianSettings(loss="focal")
