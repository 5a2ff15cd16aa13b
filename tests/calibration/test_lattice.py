"""The pruned lattice search of the ECE/AdaECE fits against the exhaustive lattice.

"Equal to the grid's resolution" means: the fitted T is the lattice point the exhaustive search
picks (every point of the lattice evaluated with the float64 focal map of ``focal.py``, the
lowest ECE, ties to the T closest to 1), or, where the exhaustive search finds another point
whose ECE equals the chosen one's within 1e-12 (a tie up to summation order), that point.
Objective values of the chosen pair are the float64 ones (1e-12); the other γ of the profile
carry float32-search values within ``FLOAT32_ERROR`` of them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from curvcal.calibration import bins as binning
from curvcal.calibration import lattice
from curvcal.calibration.focal import focal_calibration_map
from curvcal.calibration.metrics import binned_errors
from curvcal.calibration.scaling import (
    FLOAT32_ERROR,
    fit_focal_temperature,
    fit_temperature,
)

F64 = torch.float64
TIE = 1e-12


def reference_values(
    z: torch.Tensor,
    y: torch.Tensor,
    gamma: float,
    points: np.ndarray,
    objective: str = "ece",
    bins: int = 15,
    edges: str = "left",
) -> np.ndarray:
    """The objective at every lattice point, from the float64 focal map (no search)."""
    logp = torch.log_softmax(z.to(F64), dim=1)
    correct = (logp.argmax(dim=1) == y).to(F64)
    out = []
    for u in points:
        scaled = torch.log_softmax(logp * math.exp(-u), dim=1)
        if gamma:
            scaled = focal_calibration_map(scaled, gamma)
        confidence = scaled.max(dim=1).values.exp()
        if objective == "ece":
            index = binning.equal_width_index(confidence, bins, edges)
        else:
            index = binning.equal_mass_index(confidence, bins)
        out.append(binned_errors(*binning.bin_sums(index, confidence, correct, bins)).ece)
    return np.array(out)


def reference_pick(points: np.ndarray, values: np.ndarray) -> int:
    return lattice.pick(points, dict(enumerate(values.tolist())))


def assert_same_point(points: np.ndarray, values: np.ndarray, temperature: float) -> None:
    chosen = int(np.argmin(np.abs(points - math.log(temperature))))
    assert abs(math.exp(points[chosen]) - temperature) < 1e-9 * temperature
    best = reference_pick(points, values)
    assert chosen == best or abs(values[chosen] - values[best]) <= TIE, (
        f"T = {temperature} (ECE {values[chosen]}) where the lattice gives "
        f"T = {math.exp(points[best])} (ECE {values[best]})"
    )


def sampled(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=F64) * (1 + 0.5 * math.log(k))
    return z, torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]


CASES = [  # (N, K, scale of the logits, seed): over- and under-confident, binary, many classes
    (1500, 10, 2.5, 0),
    (1500, 10, 0.4, 1),
    (2000, 2, 3.0, 2),
    (2000, 2, 0.5, 3),
    (300, 100, 2.0, 4),
    (300, 100, 0.6, 5),
]
GAMMAS = (0.0, 0.5, 2.0, 7.0)
STEP = 0.1


@pytest.mark.parametrize(("n", "k", "scale", "seed"), CASES)
def test_focal_fit_equals_the_exhaustive_lattice(n: int, k: int, scale: float, seed: int) -> None:
    z, y = sampled(n, k, seed)
    logits = scale * z
    fit = fit_focal_temperature(logits, y, gammas=GAMMAS, grid_step=STEP)
    points = lattice.lattice(math.log(0.01), math.log(100.0), STEP)
    best_per_gamma = []
    for point in fit.profile:
        values = reference_values(logits, y, point.gamma, points)
        assert_same_point(points, values, point.temperature)
        best = float(values.min())
        assert point.objective == pytest.approx(best, abs=FLOAT32_ERROR)
        best_per_gamma.append(best)
        # far fewer passes than lattice points
        assert point.n_evaluations < len(points) / 4
    chosen = GAMMAS[int(np.argmin(best_per_gamma))]
    assert fit.gamma == chosen or (
        abs(best_per_gamma[GAMMAS.index(fit.gamma)] - min(best_per_gamma)) <= TIE
    )
    assert fit.objective_after == pytest.approx(min(best_per_gamma), abs=TIE)
    assert fit.n_evaluations >= sum(p.n_evaluations for p in fit.profile) + 2


@pytest.mark.parametrize("objective", ["ece", "adaece"])
def test_temperature_grid_fit_equals_the_exhaustive_lattice(objective: str) -> None:
    z, y = sampled(1200, 5, 6)
    for scale in (3.0, 0.3):
        fit = fit_temperature(scale * z, y, objective=objective, grid_step=0.02)
        points = lattice.lattice(math.log(0.01), math.log(100.0), 0.02)
        values = reference_values(scale * z, y, 0.0, points, objective)
        assert_same_point(points, values, fit.temperature)
        assert fit.objective_after == pytest.approx(float(values.min()), abs=TIE)
        assert fit.n_evaluations < len(points) / 10


def test_search_on_a_function_with_plateaus_and_noise() -> None:
    """A piecewise-constant objective above |accuracy - mean confidence|, many local minima."""
    size = 800
    rng = np.random.default_rng(0)
    mean = np.linspace(0.95, 0.35, size)  # decreasing mean confidence
    accuracy = 0.62
    floor = np.abs(accuracy - mean)
    values = floor + np.repeat(rng.uniform(0.0, 0.03, size // 8), 8)  # plateaus of 8 points
    calls = []

    def evaluate(j: int) -> lattice.LatticePoint:
        calls.append(j)
        return lattice.LatticePoint(float(values[j]), float(mean[j]))

    for start in (0, 300, 799):
        calls.clear()
        found = lattice.search(size, evaluate, accuracy, start, 0.0)
        points = np.linspace(-4.6, 4.6, size)
        got = lattice.pick(points, {j: p.value for j, p in found.evaluated.items()})
        assert got == lattice.pick(points, dict(enumerate(values.tolist())))
        assert found.monotone and len(calls) == len(set(calls)) < size / 4
        assert mean[found.crossing] <= accuracy < mean[found.crossing - 1]


def test_search_flags_a_mean_confidence_that_is_not_monotone() -> None:
    mean = np.array([0.9, 0.8, 0.6, 0.65, 0.5, 0.4])
    found = lattice.search(
        6, lambda j: lattice.LatticePoint(abs(0.7 - mean[j]), float(mean[j])), 0.7, 1, 0.0
    )
    assert 3 in found.evaluated
    assert not found.monotone


def test_lattice_points_and_ties() -> None:
    points = lattice.lattice(math.log(0.01), math.log(100.0), 0.01)
    assert points[0] == math.log(0.01) and points[-1] == math.log(100.0)
    assert np.allclose(np.diff(points[:-1]), 0.01)
    assert len(points) == 923  # 9.21 / 0.01 steps, both ends
    # equal values: the T closest to 1, then the smaller T
    assert lattice.pick(np.array([-0.2, -0.1, 0.1, 0.3]), {0: 1.0, 1: 0.5, 2: 0.5, 3: 0.5}) == 1


def test_border_cases_of_the_grid_fit() -> None:
    one = fit_focal_temperature(torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0]), grid_step=0.1)
    assert math.isfinite(one.objective_after) and 0.01 <= one.temperature <= 100
    tied = fit_focal_temperature(torch.zeros(5, 4), torch.tensor([0, 1, 2, 3, 0]), grid_step=0.1)
    # every confidence is 1/4 whatever (γ, T): ties go to the lattice point nearest T = 1
    assert tied.temperature == pytest.approx(math.exp(math.log(0.01) + 46 * 0.1))
    assert tied.objective_after == pytest.approx(abs(0.4 - 0.25), abs=1e-12)
    hot = torch.tensor([[0.0, -math.inf], [-math.inf, 0.0], [0.0, -math.inf]])
    exact = fit_focal_temperature(hot, torch.tensor([0, 1, 1]), kind="logprobs", grid_step=0.1)
    assert exact.objective_after == pytest.approx(1 / 3, abs=1e-12)  # one-hot rows are fixed


def test_fallbacks_when_a_premise_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 value off by more than its bound, or a mean confidence that is not monotone,
    sends the fit to float64: the choice is still the exhaustive lattice's."""
    from curvcal.calibration import scaling

    z, y = sampled(800, 10, 11)
    logits = 2.5 * z
    points = lattice.lattice(math.log(0.01), math.log(100.0), STEP)
    values = reference_values(logits, y, 2.0, points)
    honest = scaling._fast_point

    def off(*args: object) -> lattice.LatticePoint:
        point = honest(*args)  # type: ignore[arg-type]
        return lattice.LatticePoint(point.value - 1e-3, point.mean_confidence)

    monkeypatch.setattr(scaling, "_fast_point", off)
    fit = fit_focal_temperature(logits, y, gammas=[2.0], grid_step=STEP)
    assert_same_point(points, values, fit.temperature)
    assert fit.objective_after == pytest.approx(float(values.min()), abs=TIE)
    monkeypatch.setattr(scaling, "_fast_point", honest)
    real_search = lattice.search

    def not_monotone(*args: object, **kwargs: object) -> lattice.LatticeSearch:
        found = real_search(*args, **kwargs)  # type: ignore[arg-type]
        return lattice.LatticeSearch(found.evaluated, found.crossing, False)

    monkeypatch.setattr(lattice, "search", not_monotone)
    fit = fit_focal_temperature(logits, y, gammas=[2.0], grid_step=STEP)
    assert_same_point(points, values, fit.temperature)
    assert fit.profile[0].n_evaluations > len(points)  # the whole lattice was visited


def test_other_bins_and_right_edges() -> None:
    z, y = sampled(1000, 4, 12)
    points = lattice.lattice(math.log(0.01), math.log(100.0), STEP)
    fit = fit_focal_temperature(
        1.8 * z, y, gammas=[0.0, 1.0], bins=10, edges="right", grid_step=STEP
    )
    for point in fit.profile:
        values = reference_values(1.8 * z, y, point.gamma, points, bins=10, edges="right")
        assert_same_point(points, values, point.temperature)
