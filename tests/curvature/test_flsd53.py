"""The FLSD-53 Hessian operator against a dense float64 Hessian of the per-sample-γ loss."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvcal.calibration.focal import focal_loss
from curvcal.curvature.flsd53 import flsd53_group_sizes, flsd53_groups
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.losses import FLSD53Loss

F64 = torch.float64


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).to(F64)


def _data(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = 3 * torch.randn(24, 3, generator=generator, dtype=F64)
    with torch.no_grad():
        logits = model(x)
    # Half the labels are the least likely class, so both γ groups are populated.
    y = torch.where(torch.arange(24) % 2 == 0, logits.argmax(1), logits.argmin(1))
    return x, y


def _dense_fixed_gamma_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with torch.no_grad():
        p_y = torch.softmax(model(x), 1)[torch.arange(len(y)), y]
    gammas = torch.where(p_y < 0.2, 5.0, 3.0).to(F64)

    def loss(theta: torch.Tensor) -> torch.Tensor:
        pieces = dict(
            zip(
                names,
                [
                    t.reshape(s)
                    for t, s in zip(theta.split([s.numel() for s in shapes]), shapes, strict=True)
                ],
                strict=True,
            )
        )
        logits = torch.func.functional_call(model, pieces, (x,))
        p = torch.softmax(logits, 1)[torch.arange(len(y)), y]
        return (-((1 - p) ** gammas) * torch.log(p)).mean()

    return torch.autograd.functional.hessian(loss, flat)


def test_matches_the_dense_hessian_with_per_sample_gamma_held_fixed() -> None:
    model = _model()
    x, y = _data(model)
    batches = [(x[:10], y[:10]), (x[10:], y[10:])]
    operator = HessianOperator(model, batches, FLSD53Loss())
    gammas = dict(flsd53_group_sizes(operator))
    assert set(gammas) == {5.0, 3.0} and sum(gammas.values()) == 24
    dense = _dense_fixed_gamma_hessian(model, x, y)
    identity = torch.eye(operator.shape[0], dtype=F64)
    torch.testing.assert_close(operator.matmat(identity), dense, rtol=1e-9, atol=1e-11)
    assert operator.mean_loss() == pytest.approx(
        focal_loss(model(x), y, "flsd53").item(), rel=1e-12
    )


def test_all_confident_samples_give_the_gamma_three_focal_hessian() -> None:
    model = _model()
    x, _ = _data(model)
    with torch.no_grad():
        y = model(x).argmax(1)  # p_y ≥ 1/3 > 0.2 for every sample
    operator = HessianOperator(model, [(x, y)], FLSD53Loss())
    assert flsd53_group_sizes(operator) == ((3.0, 24),)
    reference = HessianOperator(model, [(x, y)], loss="focal", gamma=3.0)
    vectors = torch.randn(operator.shape[0], 2, dtype=F64)
    torch.testing.assert_close(operator.matmat(vectors), reference.matmat(vectors))


def test_grouping_restores_the_model_and_rejects_bad_input() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).to(F64)
    model.train()
    before = model[1].running_mean.clone()
    x = torch.randn(8, 3, dtype=F64)
    low, high = flsd53_groups(model, [(x, torch.zeros(8, dtype=torch.int64))], mode="train")
    assert sum(len(b[1]) for b in low + high) == 8
    assert model.training and torch.equal(model[1].running_mean, before)
    with pytest.raises(InputError, match="mode"):
        flsd53_groups(model, [], mode="test")
    with pytest.raises(InputError, match="empty"):
        HessianOperator(model, [], FLSD53Loss())
