"""The NaN/Inf guard: the count of offending batches and the first of them, for the loss and for
Hessian-vector products; nothing changes when everything is finite."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import NumericalError

F64 = torch.float64


class RootOfSquare(nn.Module):
    """logits = sqrt((x W)²) + x V: finite everywhere, but d/dW of sqrt(u²) at u = 0 is 0/0,
    so a sample with x = 0 gives a finite loss and a NaN Hessian-vector product."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(4, 3, generator=generator, dtype=F64))
        self.v = nn.Parameter(torch.randn(4, 3, generator=generator, dtype=F64))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sqrt((x @ self.w) ** 2) + x @ self.v


def _batches(
    zero_rows: tuple[int, ...], nan_rows: tuple[int, ...] = ()
) -> list[tuple[Tensor, Tensor]]:
    """Five batches of sizes 4, 4, 4, 4, 3 (samples 0..18)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(19, 4, generator=generator, dtype=F64)
    x[list(zero_rows)] = 0.0
    x[list(nan_rows), 0] = math.nan
    y = torch.randint(0, 3, (19,), generator=generator)
    return [(x[i : i + 4], y[i : i + 4]) for i in range(0, 19, 4)]


def test_nan_loss_names_the_count_and_first_batch() -> None:
    batches = _batches((), nan_rows=(6, 17))
    operator = HessianOperator(RootOfSquare(), batches)
    with pytest.raises(NumericalError) as failed:
        operator.mean_loss()
    assert failed.value.what == "loss"
    assert failed.value.why == (
        "the mean ce loss over the 19 samples is nan: "
        "non-finite in 2 of 5 batches, the first being batch 1 (samples 4..7)"
    )


def test_nan_product_with_finite_loss_names_the_batches() -> None:
    batches = _batches((9, 10, 13))
    operator = HessianOperator(RootOfSquare(), batches)
    assert math.isfinite(operator.mean_loss())
    with pytest.raises(NumericalError) as failed:
        operator.matvec(torch.ones(24, dtype=F64))
    assert failed.value.what == "hessian"
    assert (
        "(NaN or Inf): non-finite in 2 of 5 batches, the first being batch 2 (samples 8..11)"
        in (failed.value.why)
    )


def test_analysis_stops_at_the_first_product_and_restricted_blocks_are_guarded() -> None:
    batches = _batches((0,))
    with pytest.raises(NumericalError, match="1 of 5 batches, the first being batch 0"):
        analyse_batches(RootOfSquare(), batches, HessianSettings(probes=4))
    block = HessianOperator(RootOfSquare(), batches).restrict(["w"])
    with pytest.raises(NumericalError, match=r"the first being batch 0 \(samples 0\.\.3\)"):
        block.matvec(torch.ones(12, dtype=F64))


def test_finite_products_are_those_of_the_dense_hessian() -> None:
    """With every check passing, products and the mean loss are the unguarded numbers: those of
    the dense float64 Hessian and the mean loss over the 19 samples."""
    batches = _batches(())
    model = RootOfSquare()
    vectors = torch.randn(24, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    guarded = HessianOperator(model, batches, probe_batch=2)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    shapes = [(4, 3), (4, 3)]

    def mean_loss(theta: Tensor) -> Tensor:
        w, v = theta[:12].reshape(shapes[0]), theta[12:].reshape(shapes[1])
        return nn.functional.cross_entropy(torch.sqrt((x @ w) ** 2) + x @ v, y)

    theta = torch.cat([model.w.detach().reshape(-1), model.v.detach().reshape(-1)])
    dense = torch.autograd.functional.hessian(mean_loss, theta)
    torch.testing.assert_close(guarded.matmat(vectors), dense @ vectors, rtol=1e-10, atol=1e-12)
    assert guarded.mean_loss() == pytest.approx(float(mean_loss(theta)), rel=1e-12)
    assert guarded.n_matvecs == 3


def test_products_written_in_place_are_guarded_too() -> None:
    """matvec_into: the same batches named as by matvec; finite products identical to the plain
    operator's."""
    guarded = HessianOperator(RootOfSquare(), _batches((9, 10, 13)))
    out = torch.empty(24, dtype=F64)
    with pytest.raises(NumericalError) as failed:
        guarded.matvec_into(torch.ones(24, dtype=F64), out)
    assert "non-finite in 2 of 5 batches, the first being batch 2 (samples 8..11)" in (
        failed.value.why
    )
    batches = _batches(())
    vector = torch.randn(24, generator=torch.Generator().manual_seed(3), dtype=F64)
    plain = HessianOperator(RootOfSquare(), batches)
    expected = torch.empty(24, dtype=F64)
    plain.matvec_into(vector, expected)
    guarded = HessianOperator(RootOfSquare(), batches)
    assert torch.equal(guarded.matvec_into(vector, out), expected)
    assert torch.equal(expected, plain.matvec(vector))
