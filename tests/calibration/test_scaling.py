"""Temperature scaling and focal temperature scaling: optimum, bracket, nesting, round trips."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from curvcal.calibration.metrics import calibration_metrics
from curvcal.calibration.results import Calibrator
from curvcal.calibration.scaling import (
    apply_calibrator,
    apply_focal_temperature,
    apply_temperature,
    fit_focal_temperature,
    fit_temperature,
)
from curvcal.errors import InputError

F64 = torch.float64


def sampled(n: int, k: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z with labels drawn from softmax(z)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=F64) * scale
    return z, torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]


def dense_nll(z: np.ndarray, y: np.ndarray, temperatures: np.ndarray) -> np.ndarray:
    out = []
    for t in temperatures:
        a = z / t
        top = a.max(1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(a - top).sum(1))
        out.append(float(np.mean(lse - a[np.arange(len(y)), y])))
    return np.array(out)


def test_recovers_the_temperature_the_logits_were_scaled_by() -> None:
    z, y = sampled(20_000, 5, 2.0, 0)
    fit = fit_temperature(2.5 * z, y)
    assert fit.temperature == pytest.approx(2.5, rel=0.05)
    assert fit.nll_after < fit.nll_before and not fit.at_bracket_end


def test_optimum_is_stationary_and_matches_a_dense_grid() -> None:
    z, y = sampled(2_000, 4, 3.0, 1)
    z = 1.7 * z
    fit = fit_temperature(z, y)
    assert abs(fit.derivative) < 1e-6
    coarse = np.exp(np.linspace(np.log(0.5), np.log(5), 2001))
    best = coarse[np.argmin(dense_nll(z.numpy(), y.numpy(), coarse))]
    fine = np.linspace(best * 0.995, best * 1.005, 2001)
    grid_best = fine[np.argmin(dense_nll(z.numpy(), y.numpy(), fine))]
    assert fit.temperature == pytest.approx(grid_best, abs=1e-4)
    assert fit.nll_after == pytest.approx(
        float(dense_nll(z.numpy(), y.numpy(), np.array([fit.temperature]))[0]), abs=1e-12
    )
    assert fit.grid_step is None and fit.objective == "nll"


def test_separable_data_stops_at_the_bracket_end() -> None:
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, -1.0]])
    fit = fit_temperature(z, torch.tensor([0, 1, 0]))  # every prediction right: T -> 0
    assert fit.temperature == pytest.approx(0.01) and fit.at_bracket_end
    wrong = fit_temperature(
        z, torch.tensor([1, 0, 1]), bracket=(0.1, 50.0)
    )  # every one wrong: T -> inf
    assert wrong.temperature == pytest.approx(50.0) and wrong.at_bracket_end


def test_flat_objective_returns_one() -> None:
    fit = fit_temperature(torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]))
    assert fit.temperature == 1.0 and abs(fit.derivative) < 1e-12
    single = fit_temperature(torch.randn(4, 1), torch.zeros(4, dtype=torch.int64))
    assert single.temperature == 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4), min_size=2, max_size=24),
    st.lists(st.integers(0, 1), min_size=12, max_size=12),
)
def test_temperature_is_always_positive_and_finite(values: list[float], labels: list[int]) -> None:
    n = len(values) // 2
    z = torch.tensor(values[: 2 * n], dtype=torch.float32).view(n, 2)
    fit = fit_temperature(z, torch.tensor(labels[:n]))
    assert 0.01 <= fit.temperature <= 100 and math.isfinite(fit.temperature)
    assert math.isfinite(fit.nll_after) and fit.nll_after <= fit.nll_before + 1e-12


def test_ece_objective_uses_the_grid_and_does_not_worsen_ece() -> None:
    z, y = sampled(1_000, 3, 2.0, 2)
    fit = fit_temperature(3 * z, y, objective="ece", grid_step=0.02)
    assert fit.grid_step == 0.02 and fit.objective == "ece"
    assert fit.objective_after <= fit.objective_before
    after = calibration_metrics(apply_temperature(3 * z, fit.temperature), y, kind="logprobs")
    assert after.ece == pytest.approx(fit.objective_after, abs=1e-12)
    # on the grid: ln T is a multiple of the step away from a coarse point
    assert 1.5 < fit.temperature < 6
    ada = fit_temperature(3 * z, y, objective="adaece", grid_step=0.02)
    assert ada.objective_after <= ada.objective_before


def test_focal_temperature_with_gamma_zero_is_temperature_scaling() -> None:
    z, y = sampled(600, 4, 2.0, 3)
    for objective in ("nll", "ece"):
        ts = fit_temperature(2 * z, y, objective=objective, grid_step=0.02)
        fts = fit_focal_temperature(2 * z, y, objective=objective, gammas=[0.0], grid_step=0.02)
        assert fts.gamma == 0.0
        assert fts.temperature == ts.temperature
        assert fts.objective_after == pytest.approx(ts.objective_after, abs=1e-15)
    torch.testing.assert_close(apply_focal_temperature(z, 1.7, 0.0), apply_temperature(z, 1.7))


def test_focal_temperature_profile_and_choice() -> None:
    z, y = sampled(400, 3, 2.0, 4)
    fit = fit_focal_temperature(2 * z, y, objective="nll", gammas=[0.0, 1.0, 3.0])
    assert [p.gamma for p in fit.profile] == [0.0, 1.0, 3.0]
    best = min(fit.profile, key=lambda p: p.objective)
    assert (fit.gamma, fit.temperature, fit.objective_after) == (
        best.gamma,
        best.temperature,
        best.objective,
    )
    for point in fit.profile:
        logp = apply_focal_temperature(2 * z, point.temperature, point.gamma)
        assert -float(logp.gather(1, y[:, None]).mean()) == pytest.approx(
            point.objective, abs=1e-12
        )
        assert 0.01 <= point.temperature <= 100
    # the optimum T grows with γ (references.md)
    temperatures = [p.temperature for p in fit.profile]
    assert temperatures == sorted(temperatures)


def test_calibrator_round_trip_through_json() -> None:
    z, _ = sampled(20, 3, 2.0, 5)
    calibrator = Calibrator("focal-temperature", temperature=2.0, gamma=1.5)
    restored = Calibrator.from_dict(json.loads(json.dumps(calibrator.to_dict())))
    assert restored == calibrator
    torch.testing.assert_close(restored.apply(z), apply_focal_temperature(z, 2.0, 1.5))
    torch.testing.assert_close(apply_calibrator(Calibrator("none"), z), torch.log_softmax(z, 1))
    fit = fit_temperature(z, torch.arange(20) % 3)
    assert fit.calibrator == Calibrator("temperature", fit.temperature)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"method": "bbq"},
        {"method": "temperature", "temperature": 0.0},
        {"method": "temperature", "temperature": -1.0},
        {"method": "temperature", "temperature": "2"},
        {"method": "temperature", "gamma": 1.0},
        {"method": "focal-temperature", "gamma": -1.0},
        {"method": "temperature", "bias": 1.0},
        {"temperature": 1.0},
    ],
)
def test_calibrator_rejects_bad_descriptions(data: object) -> None:
    with pytest.raises(InputError) as caught:
        Calibrator.from_dict(data, source="cal.json")
    assert caught.value.what == "cal.json"


def test_bad_fit_options() -> None:
    z, y = torch.zeros(3, 2), torch.tensor([0, 1, 0])
    with pytest.raises(InputError, match="objective"):
        fit_temperature(z, y, objective="brier")
    with pytest.raises(InputError, match="T_min"):
        fit_temperature(z, y, bracket=(0.0, 10.0))
    with pytest.raises(InputError, match="grid step"):
        fit_temperature(z, y, objective="ece", grid_step=0.0)
    with pytest.raises(InputError, match="gamma"):
        fit_focal_temperature(z, y, gammas=[0.0, -1.0])
    with pytest.raises(InputError, match="empty"):
        fit_focal_temperature(z, y, gammas=[])
    with pytest.raises(InputError) as caught:
        fit_temperature(torch.tensor([[math.nan, 0.0]] * 3), y, source="val.pt")
    assert caught.value.what == "val.pt"
