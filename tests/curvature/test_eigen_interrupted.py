"""Stopped in the middle of the eigenvalues (Ctrl-C in the CLI), a run keeps the values that
converged and nothing else: checked against the dense eigenvalues of a matrix whose λ1 = 10 is
far from a cluster in [0, 1] (so λ1 converges in a few steps and λ2, λ3 much later)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.eigen import lanczos, power_iteration
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.progress import Stopped

TOL = 1e-8


def _matrix(n: int = 120) -> torch.Tensor:
    torch.manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    values = torch.cat([torch.tensor([10.0], dtype=torch.float64), torch.linspace(0, 1, n - 1)])
    return (basis * values) @ basis.T


def _stop_after(products: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def on_step(_done: int) -> None:
        calls[0] += 1
        if calls[0] >= products:
            raise Stopped(stage="eigenvalues")

    return on_step


@pytest.mark.parametrize("method", [lanczos, power_iteration])
def test_a_stop_after_lambda_1_converged_keeps_only_it(method) -> None:  # type: ignore[no-untyped-def]
    matrix = _matrix()
    dense = torch.linalg.eigvalsh(matrix).flip(0)
    full = method(matrix, 1, tol=TOL)
    assert full.values[0].value == pytest.approx(float(dense[0]), rel=1e-10)

    with pytest.raises(Stopped) as stopped:
        method(matrix, 3, tol=TOL, on_step=_stop_after(25))
    kept = stopped.value.finished
    assert kept is not None and stopped.value.stage == "eigenvalues"
    assert kept.stopped_by == "interrupted" and "1 of the 3" in kept.limit
    assert [r.converged for r in kept.values] == [True]  # λ2, λ3 had not: left out
    assert kept.values[0].value == pytest.approx(float(dense[0]), rel=1e-10)
    assert kept.values[0].residual <= TOL and kept.values[0].status == "tol"


@pytest.mark.parametrize("method", [lanczos, power_iteration])
def test_a_stop_before_any_value_converged_keeps_nothing(method) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Stopped) as stopped:
        method(_matrix(), 3, tol=TOL, on_step=_stop_after(2))
    assert stopped.value.finished is None


def test_a_stop_at_the_first_step_keeps_nothing_even_for_one_value() -> None:
    # border case: k = 1 and a 1-step stop (the change since the last step is not known yet)
    with pytest.raises(Stopped) as stopped:
        lanczos(_matrix(), 1, tol=TOL, on_step=_stop_after(1))
    assert stopped.value.finished is None


def _model_and_batches() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))
    x = torch.randn(23, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (23,))
    return model.double(), [(x[:10], y[:10]), (x[10:], y[10:])]  # uneven batches


def test_the_analysis_stopped_in_the_eigenvalues_keeps_the_converged_ones_and_no_stage_after() -> (
    None
):
    model, batches = _model_and_batches()
    settings = HessianSettings(top_k=4, method="power", trace_method="hutchinson", probes=9)
    full = analyse_batches(model, batches, settings)
    first = full.spectrum.values[0].matvecs  # products λ1 took (the same start vector: seed)

    def on_step(stage: str, done: int) -> None:
        if stage == "eigenvalues" and done >= first + 2:  # into λ2's deflated pass
            raise Stopped(stage=stage)

    with pytest.raises(Stopped) as stopped:
        analyse_batches(model, batches, settings, on_step=on_step)
    kept = stopped.value.finished
    assert kept is not None and stopped.value.stage == "eigenvalues"
    assert kept.trace is None and kept.layers is None  # type: ignore[attr-defined]
    assert [r.value for r in kept.spectrum.values] == [full.spectrum.values[0].value]  # type: ignore[attr-defined]
    assert kept.lambda_max == full.lambda_max  # type: ignore[attr-defined]


def test_the_per_layer_stage_stopped_keeps_the_modules_finished() -> None:
    model, batches = _model_and_batches()
    operator = HessianOperator(model, batches)
    full = layer_curvature(operator, probes=5)
    assert len(full) == 3

    def on_step(done: int) -> None:
        if done >= 1:  # the first module finished; stopped inside the second one's λmax
            raise Stopped(stage="layers")

    with pytest.raises(Stopped) as stopped:
        layer_curvature(operator, probes=5, on_step=on_step)
    kept = stopped.value.finished
    assert isinstance(kept, list) and [layer.module for layer in kept] == [full[0].module]
    assert kept[0].lambda_max.value == full[0].lambda_max.value
