"""Per-module curvature against the diagonal blocks of a dense Hessian."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.operator import HessianOperator

from .cases import dense_hessian, make_data, split


def test_blocks_of_the_mlp(mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor]) -> None:
    model, x, y, hessian = mlp_case
    layers = layer_curvature(HessianOperator(model, split(x, y, 20), probe_batch=16), tol=1e-8)
    assert [(r.module, r.n_params) for r in layers] == [("0", 48), ("2", 27)]
    for result, (start, stop) in zip(layers, [(0, 48), (48, 75)], strict=True):
        block = hessian[start:stop, start:stop]
        assert result.lambda_max.value == pytest.approx(
            float(torch.linalg.eigvalsh(block)[-1]), abs=1e-8
        )
        assert result.trace.method == "exact"
        assert result.trace.estimate == pytest.approx(float(torch.trace(block)), abs=1e-10)
    assert sum(r.trace.estimate for r in layers) == pytest.approx(
        float(torch.trace(hessian)), abs=1e-10
    )


def test_large_blocks_use_hutchinson(mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor]) -> None:
    model, x, y, hessian = mlp_case
    layers = layer_curvature(
        HessianOperator(model, split(x, y, 50), params=["0.*"], probe_batch=16), probes=32
    )
    assert (
        len(layers) == 1
        and layers[0].trace.method == "hutchinson"
        and layers[0].trace.n_probes == 32
    )
    assert (
        layers[0].trace.ci95[0] <= float(torch.trace(hessian[:48, :48])) <= layers[0].trace.ci95[1]
    )


class _WithIdleLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(5, 3)
        self.idle = nn.Linear(2, 2)  # never called: a zero Hessian block

    def forward(self, x: Tensor) -> Tensor:
        return self.used(x)


def test_zero_block() -> None:
    torch.manual_seed(0)
    model = _WithIdleLayer().double()
    x, y = make_data("mlp", n=11)
    layers = layer_curvature(HessianOperator(model, split(x, y, 4)))
    idle = next(r for r in layers if r.module == "idle")
    assert idle.lambda_max.value == 0.0 and idle.lambda_max.converged
    assert idle.trace.estimate == 0.0
    used = next(r for r in layers if r.module == "used")
    exact = dense_hessian(model, x, y, names=["used.weight", "used.bias"])
    assert used.lambda_max.value == pytest.approx(float(torch.linalg.eigvalsh(exact)[-1]), rel=1e-4)
