"""Properties that must hold for any input (hypothesis): the Hessian-vector product is linear,
symmetric and independent of how the data is batched; power iteration never reports an
eigenvalue beyond the spectral radius."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from curvcal.curvature.eigen import power_iteration
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.results import ConvergenceWarning

F64 = torch.float64
N_SAMPLES = 13


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()  # P = 43


MODEL = _model()
P = sum(p.numel() for p in MODEL.parameters())
_generator = torch.Generator().manual_seed(1)
X = torch.randn(N_SAMPLES, 5, generator=_generator, dtype=F64)
Y = torch.randint(0, 3, (N_SAMPLES,), generator=_generator)


def _operator(batch_size: int = N_SAMPLES) -> HessianOperator:
    batches = [
        (X[i : i + batch_size], Y[i : i + batch_size]) for i in range(0, N_SAMPLES, batch_size)
    ]
    return HessianOperator(MODEL, batches, probe_batch=4)


FULL = _operator()
coefficients = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False)


def _vector(seed: int, columns: int = 1) -> Tensor:
    return torch.randn(P, columns, generator=torch.Generator().manual_seed(seed), dtype=F64)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), coefficients, coefficients)
def test_product_is_linear(seed_u: int, seed_v: int, a: float, b: float) -> None:
    u, v = _vector(seed_u), _vector(seed_v)
    products = FULL.matmat(torch.cat([u, v, a * u + b * v], dim=1))
    combined = a * products[:, :1] + b * products[:, 1:2]
    scale = 1 + float(products.abs().max())
    torch.testing.assert_close(products[:, 2:], combined, rtol=0, atol=1e-12 * scale)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_product_is_symmetric(seed_u: int, seed_v: int) -> None:
    u, v = _vector(seed_u), _vector(seed_v)
    hu, hv = FULL.matmat(torch.cat([u, v], dim=1)).split(1, dim=1)
    left, right = float(u.t() @ hv), float(v.t() @ hu)
    assert left == pytest.approx(right, rel=1e-10, abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, N_SAMPLES), st.integers(0, 2**31 - 1))
def test_product_does_not_depend_on_the_batch_size(batch_size: int, seed: int) -> None:
    vectors = _vector(seed, 2)
    torch.testing.assert_close(
        _operator(batch_size).matmat(vectors), FULL.matmat(vectors), rtol=1e-11, atol=1e-13
    )


@st.composite
def symmetric_matrices(draw: st.DrawFn) -> Tensor:
    n = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.floats(1e-3, 1e3))
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return scale * (a + a.t()) / 2


@settings(max_examples=40, deadline=None)
@given(symmetric_matrices(), st.integers(0, 1000))
def test_power_iteration_never_exceeds_the_spectral_radius(matrix: Tensor, seed: int) -> None:
    radius = float(torch.linalg.eigvalsh(matrix).abs().max())
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", ConvergenceWarning
        )  # close eigenvalues: slow, still bounded
        spectrum = power_iteration(matrix, 1, seed=seed, max_iter=200)
    for found in spectrum.values:
        assert abs(found.value) <= radius * (1 + 1e-10) + 1e-300
