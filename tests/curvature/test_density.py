"""Stochastic Lanczos quadrature: exact quadrature moments and the density's normalisation."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.density import spectral_density
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.trace import hutchinson_trace
from curvcal.errors import InputError

from .cases import spectrum_matrix, split


def _moment(
    result_nodes: tuple[float, ...], result_weights: tuple[float, ...], power: int
) -> float:
    return sum(w * t**power for t, w in zip(result_nodes, result_weights, strict=True))


def test_quadrature_moments_equal_quadratic_forms_of_the_same_probes() -> None:
    """Σ_j w_j θ_j^p = vᵀAᵖv/‖v‖² for p ≤ 2·steps − 1; v are the probes Hutchinson draws with the same seed."""
    eigenvalues = torch.linspace(-1.0, 4.0, 25)
    matrix = spectrum_matrix(eigenvalues, seed=2)
    result = spectral_density(matrix, runs=4, steps=3, seed=9)
    for power in (0, 1, 2, 5):
        mean_moment = (
            sum(_moment(n, w, power) for n, w in zip(result.nodes, result.weights, strict=True)) / 4
        )
        quadratic = (
            hutchinson_trace(torch.linalg.matrix_power(matrix, power), 4, seed=9).estimate / 25
        )
        assert mean_moment == pytest.approx(quadratic, abs=1e-10)
    assert result.matvecs == 12 and result.steps == 3


def test_full_steps_recover_the_eigenvalues_and_density_integrates_to_one() -> None:
    eigenvalues = torch.tensor([-2.0, 0.5, 1.0, 3.0, 7.0])
    result = spectral_density(spectrum_matrix(eigenvalues), runs=2, steps=10, n_grid=2000)
    assert result.steps == 5
    for nodes in result.nodes:
        assert torch.allclose(
            torch.tensor(nodes, dtype=torch.float64), eigenvalues.double(), atol=1e-9
        )
    grid, density = torch.tensor(result.grid), torch.tensor(result.density)
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-3)
    assert result.grid[0] < -2.0 and result.grid[-1] > 7.0


def test_hessian_density_moment_matches_dense(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    result = spectral_density(HessianOperator(model, split(x, y, 20)), runs=2, steps=6, seed=4)
    mean_first = (
        sum(_moment(n, w, 1) for n, w in zip(result.nodes, result.weights, strict=True)) / 2
    )
    assert mean_first == pytest.approx(
        hutchinson_trace(hessian, 2, seed=4).estimate / 75, abs=1e-10
    )


def test_border_cases() -> None:
    single = spectral_density(torch.tensor([[3.0]], dtype=torch.float64), runs=1, steps=4)
    assert single.nodes == ((3.0,),) and single.weights[0] == pytest.approx((1.0,))
    assert max(single.density) > 0
    zero = spectral_density(torch.zeros(3, 3, dtype=torch.float64), runs=2, steps=3)
    assert all(n == (0.0,) for n in zero.nodes) and all(v == v for v in zero.density)


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"runs": 0}, "runs"),
        ({"steps": 0}, "steps"),
        ({"n_grid": 1}, "n_grid"),
        ({"bandwidth": 0.0}, "bandwidth"),
    ],
)
def test_bad_requests_are_refused(options: dict[str, object], what: str) -> None:
    with pytest.raises(InputError) as error:
        spectral_density(torch.eye(3, dtype=torch.float64), **options)  # type: ignore[arg-type]
    assert error.value.what == what
