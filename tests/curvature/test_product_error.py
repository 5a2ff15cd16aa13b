"""Eigenvalues of an operator whose products are good to a stated bound but not linear in v
(central differences on a sharded model): the rules allow for the noise the bound puts in a
measured residual, so the run ends at tol, with values as accurate as the products allow."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

from curvcal.curvature.eigen import lanczos, power_iteration
from curvcal.curvature.operators import DenseOperator

TOP = (13.3, 11.2, 2.09)


class NoisyOperator(DenseOperator):
    """A float64 symmetric matrix whose products carry an error of b·‖A‖·‖v‖ along a direction
    drawn from v's own entries (so not linear in v), and which states b as ``product_error``."""

    def __init__(self, matrix: Tensor, bound: float) -> None:
        super().__init__(matrix)
        self.bound = bound
        self.product_error = bound  # what it states (the tests may withdraw it)
        self.norm = float(torch.linalg.matrix_norm(matrix, 2))

    def matmat(self, vectors: Tensor) -> Tensor:
        out = self.matrix @ vectors
        for j in range(vectors.shape[1]):
            v = vectors[:, j]
            seed = int(abs(float(v.sum())) * 1e9) % 2**31
            noise = torch.randn(
                v.shape[0], generator=torch.Generator().manual_seed(seed), dtype=v.dtype
            )
            out[:, j] += self.bound * self.norm * float(v.norm()) * noise / noise.norm()
        return out


def _operator(bound: float) -> NoisyOperator:
    size = 400
    generator = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64))
    rest = torch.linspace(-0.5, 0.75, size - len(TOP), dtype=torch.float64)
    values = torch.cat([torch.tensor(TOP, dtype=torch.float64), rest])
    matrix = q @ torch.diag(values) @ q.t()
    return NoisyOperator((matrix + matrix.t()) / 2, bound)


@pytest.mark.parametrize("tol", [3e-5, 1e-4])
def test_lanczos_allows_for_the_stated_product_error(tol: float) -> None:
    """b = 1.6e-5 (the float32 five-point floor): λ3's measured residual (1.5e-4) exceeds tol
    through the products' noise alone; without the allowance the run stopped by "precision",
    not converged, with a warning. The values are within 1e-5 of the matrix's."""
    operator = _operator(1.6e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spectrum = lanczos(operator, 3, tol=tol, seed=3)
    assert spectrum.converged and spectrum.stopped_by == "tol"
    for got, expected in zip(spectrum.eigenvalues, TOP, strict=True):
        assert abs(got - expected) / expected < 1e-5
    assert max(r.residual for r in spectrum.values) > tol  # the allowance was needed


def test_without_a_stated_bound_the_rule_is_unchanged() -> None:
    """The same noisy products with no bound stated: the run ends at the precision floor."""
    operator = _operator(1.6e-5)
    operator.product_error = 0.0
    with pytest.warns(Warning, match="precision floor"):
        spectrum = lanczos(operator, 3, tol=3e-5, seed=3)
    assert not spectrum.converged and spectrum.stopped_by == "precision"


def test_power_iteration_allows_for_the_stated_product_error() -> None:
    """One power step's residual carries up to 2·b·‖A‖ of noise: with b = 1e-4, a tol of 1e-5
    is met at the allowance (2e-4 relative for λ1) and λ1, λ2 are within 1e-4."""
    operator = _operator(1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spectrum = power_iteration(operator, 2, tol=1e-5, seed=3, max_iter=400)
    assert spectrum.converged
    for got, expected in zip(spectrum.eigenvalues, TOP[:2], strict=True):
        assert abs(got - expected) / expected < 1e-4
