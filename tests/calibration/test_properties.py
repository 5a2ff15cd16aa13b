"""Properties the other calibration tests leave out (hypothesis): focal temperature scaling never
returns T ≤ 0 or NaN and its map stays a probability vector for any fitted (γ, T); smooth ECE
equals |accuracy − mean confidence| whenever every sample errs on the same side."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from curvcal.calibration.scaling import apply_focal_temperature, fit_focal_temperature
from curvcal.calibration.smooth import smooth_ece

F64 = torch.float64


@settings(max_examples=8, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=6, max_size=30),
    st.lists(st.integers(0, 2), min_size=10, max_size=10),
    st.sampled_from(["ece", "nll"]),
)
def test_focal_temperature_is_positive_finite_and_maps_to_probabilities(
    values: list[float], labels: list[int], objective: str
) -> None:
    n = len(values) // 3
    z = torch.tensor(values[: 3 * n], dtype=F64).view(n, 3)
    y = torch.tensor(labels[:n])
    fit = fit_focal_temperature(z, y, objective=objective, gammas=(0.0, 2.0))
    assert fit.temperature > 0 and math.isfinite(fit.temperature)
    assert fit.gamma >= 0 and math.isfinite(fit.gamma)
    q = apply_focal_temperature(z, fit.temperature, fit.gamma).exp()  # log-probabilities
    assert torch.isfinite(q).all() and (q >= 0).all()
    torch.testing.assert_close(q.sum(dim=1), torch.ones(n, dtype=F64), rtol=0, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    st.booleans(),
)
def test_one_signed_smooth_ece_is_the_accuracy_gap(confidences: list[float], right: bool) -> None:
    confidence = torch.tensor(confidences, dtype=F64)
    correct = torch.full_like(confidence, 1.0 if right else 0.0)  # under- or over-confident
    gap = abs(float(correct.mean()) - float(confidence.mean()))
    assert smooth_ece(confidence, correct).value == pytest.approx(gap, abs=1e-9)
