"""Fixtures of the curvature tests: models with their data and exact Hessians."""

from __future__ import annotations

import pytest
from torch import Tensor, nn

from .cases import dense_hessian, make_cnn, make_data, make_mlp


@pytest.fixture(scope="module")
def mlp_case() -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    model = make_mlp()
    x, y = make_data("mlp")
    return model, x, y, dense_hessian(model, x, y)


@pytest.fixture(scope="module")
def cnn_case() -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    model = make_cnn()
    x, y = make_data("cnn")
    return model, x, y, dense_hessian(model, x, y)
