"""Trace estimators against exact traces of dense matrices and of a small model's Hessian."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.results import ConvergenceWarning
from curvcal.curvature.trace import (
    draw_probes,
    exact_trace,
    hutchinson_trace,
    hutchpp_trace,
    trace_estimate,
)
from curvcal.errors import InputError

from .cases import spectrum_matrix, split


def _indefinite(n: int = 30) -> Tensor:
    return spectrum_matrix(torch.linspace(-2.0, 5.0, n), seed=5)


def test_hutchinson_interval_covers_the_trace_about_95_percent() -> None:
    matrix = _indefinite()
    exact = float(torch.trace(matrix))
    covered = 0
    for seed in range(200):
        result = hutchinson_trace(matrix, 20, seed=seed)
        covered += result.ci95[0] <= exact <= result.ci95[1]
    assert 0.88 * 200 <= covered <= 0.99 * 200


def test_hutchinson_mean_and_standard_error_are_the_sample_formulas() -> None:
    matrix = _indefinite(12)
    result = hutchinson_trace(matrix, 6, seed=3, distribution="gaussian")
    probes = draw_probes(12, 6, "gaussian", torch.Generator().manual_seed(3))
    samples = (probes * (matrix @ probes)).sum(0)
    assert result.estimate == pytest.approx(float(samples.mean()), abs=1e-12)
    assert result.standard_error == pytest.approx(float(samples.std()) / 6**0.5, abs=1e-12)
    half = 2.5706 * result.standard_error  # t(0.975, 5) = 2.5706, from tables
    assert result.ci95 == pytest.approx(
        (result.estimate - half, result.estimate + half), abs=1e-4 * half
    )


def test_rademacher_probes_are_exact_on_a_diagonal_matrix() -> None:
    diagonal = torch.diag(torch.tensor([1.0, -2.0, 3.5, 0.25], dtype=torch.float64))
    result = hutchinson_trace(diagonal, 5)
    assert result.estimate == pytest.approx(2.75, abs=1e-14) and result.standard_error == 0.0


def test_hutchpp_beats_hutchinson_on_a_decaying_spectrum() -> None:
    matrix = spectrum_matrix(10.0 * 0.6 ** torch.arange(80, dtype=torch.float64), seed=6)
    exact = float(torch.trace(matrix))
    plain = [hutchinson_trace(matrix, 30, seed=s).estimate - exact for s in range(40)]
    sketched = [hutchpp_trace(matrix, 30, seed=s).estimate - exact for s in range(40)]
    mse_plain = sum(e * e for e in plain) / 40
    mse_sketched = sum(e * e for e in sketched) / 40
    assert mse_sketched < 0.1 * mse_plain


def test_hutchpp_error_bar_is_honest() -> None:
    matrix = spectrum_matrix(
        torch.cat([torch.tensor([20.0, 10.0]), torch.linspace(-1.0, 1.0, 40)]), seed=8
    )
    exact = float(torch.trace(matrix))
    covered = sum(
        lo <= exact <= hi for lo, hi in (hutchpp_trace(matrix, 33, seed=s).ci95 for s in range(100))
    )
    assert 85 <= covered <= 100
    result = hutchpp_trace(matrix, 33)
    assert (result.matvecs, result.n_probes, result.method) == (33, 11, "hutch++")


def test_adaptive_stop_on_relative_half_width() -> None:
    matrix = _indefinite() + 3 * torch.eye(30, dtype=torch.float64)
    steps: list[int] = []
    result = hutchinson_trace(
        matrix, rtol=0.05, max_probes=2000, probe_batch=4, on_step=steps.append
    )
    assert result.stopped_by == "rtol" and result.converged
    assert result.half_width <= 0.05 * abs(result.estimate)
    assert result.n_probes >= 10 and result.n_probes == steps[-1] == result.matvecs
    previous = hutchinson_trace(matrix, result.n_probes - 4, seed=0)  # one block fewer did not stop
    assert previous.n_probes < 10 or previous.half_width > 0.05 * abs(previous.estimate)


def test_adaptive_budget_exhausted_warns() -> None:
    with pytest.warns(ConvergenceWarning):
        result = hutchinson_trace(_indefinite(), rtol=1e-6, max_probes=20)
    assert result.stopped_by == "max_probes" and not result.converged and result.n_probes == 20


def test_probes_do_not_depend_on_probe_batch_and_seed_repeats() -> None:
    matrix = _indefinite()
    one, four = (
        hutchinson_trace(matrix, 9, probe_batch=1),
        hutchinson_trace(matrix, 9, probe_batch=4),
    )
    assert one.estimate == pytest.approx(four.estimate, abs=1e-12)
    assert one.standard_error == pytest.approx(four.standard_error, abs=1e-12)
    assert hutchinson_trace(matrix, 9, seed=1) == hutchinson_trace(matrix, 9, seed=1)
    assert hutchinson_trace(matrix, 9, seed=1) != hutchinson_trace(matrix, 9, seed=2)


def test_hessian_trace_exact_and_estimated(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, 20), probe_batch=16)
    exact = float(torch.trace(hessian))
    assert exact_trace(operator, probe_batch=25).estimate == pytest.approx(exact, abs=1e-10)
    estimate = hutchinson_trace(operator, 64, probe_batch=16)
    dense = hutchinson_trace(hessian, 64)  # same seed: same probes, so the same numbers
    assert estimate.estimate == pytest.approx(dense.estimate, abs=1e-10)
    assert estimate.ci95[0] <= exact <= estimate.ci95[1]


def test_border_cases() -> None:
    one = torch.tensor([[2.5]], dtype=torch.float64)
    assert hutchinson_trace(one, 2).estimate == 2.5
    assert hutchpp_trace(one, 4).estimate == pytest.approx(2.5, abs=1e-14)
    zero = hutchinson_trace(torch.zeros(4, 4, dtype=torch.float64), 3)
    assert (zero.estimate, zero.standard_error, zero.ci95) == (0.0, 0.0, (0.0, 0.0))


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"n_probes": 0}, "n_probes"),
        ({"n_probes": 1}, "n_probes"),
        ({"distribution": "uniform"}, "distribution"),
        ({"rtol": 0.0}, "rtol"),
        ({"rtol": -0.1}, "rtol"),
        ({"rtol": 0.1, "max_probes": 5}, "max_probes"),
        ({"method": "girard"}, "method"),
        ({"method": "hutch++", "rtol": 0.1}, "rtol"),
        ({"method": "hutch++", "n_probes": 3}, "matvecs"),
        ({"probe_batch": 0}, "probe_batch"),
    ],
)
def test_bad_requests_are_refused(options: dict[str, object], what: str) -> None:
    with pytest.raises(InputError) as error:
        trace_estimate(torch.eye(5, dtype=torch.float64), **options)  # type: ignore[arg-type]
    assert error.value.what == what
