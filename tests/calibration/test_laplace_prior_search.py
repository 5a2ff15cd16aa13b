"""The held-out NLL rule's search (``search_prior_precision``): the probit NLL of the whole grid
computed at once, the Monte Carlo objective asked only on a descent from the probit minimum,
and the refinement started from the grid minimum and its neighbours.

The reference is the rule as it was: the objective (itself checked against dense references in
test_laplace_mc_search.py and test_laplace_prior.py) asked at every grid point, the first
minimum taken, then SciPy's bounded Brent method between its neighbours (``xatol`` 1e-10)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import minimize_scalar

from curvcal.calibration import laplace as lp
from curvcal.errors import InputError, NumericalError


def _problem(n, k, d, bias, seed, scale=2.0, relu=False, temperature=0.5):
    """A head over Gaussian features (or their ReLU, as a CNN's last layer sees), labels drawn
    from softmax(``temperature`` · f): over-confident below 1."""
    g = torch.Generator().manual_seed(seed)
    w = scale * torch.randn(k, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    b = torch.randn(k, generator=g, dtype=torch.float64) if bias else None
    phi = torch.randn(n, d, generator=g, dtype=torch.float64)
    phi = phi.clamp_min(0.0) if relu else phi
    logits = phi @ w.T + (0 if b is None else b)
    y = torch.multinomial(torch.softmax(temperature * logits, 1), 1, generator=g)[:, 0]
    return phi, y, w, b


def _folds(phi, y, w, b, structure: str, seed: int = 0) -> list[lp.HeldOutFold]:
    probs = torch.softmax(phi @ w.T + (0 if b is None else b), 1)
    return lp.heldout_folds(phi, probs, y, b is not None, structure, lp.PRIOR_FOLDS, seed)


def _every_point(objective, grid=lp.NLL_GRID) -> tuple[int, float, float]:
    """The previous rule: (grid index of the first minimum, δ, objective at δ)."""
    values = [objective(delta) for delta in grid]
    best = min(range(len(grid)), key=lambda i: (values[i], i))
    if best in (0, len(grid) - 1):
        return best, grid[best], values[best]
    found = minimize_scalar(
        lambda t: objective(math.exp(t)),
        bounds=(math.log(grid[best - 1]), math.log(grid[best + 1])),
        method="bounded",
        options={"xatol": 1e-10},
    )
    refined = math.exp(float(found.x))
    value = objective(refined)
    return (best, refined, value) if value <= values[best] else (best, grid[best], values[best])


CASES = [
    # structure, predictive, draws, (n, k, d, bias, seed, scale, relu, temperature)
    ("full", "mc", 100, (150, 4, 3, True, 1, 0.5, False, 0.5)),
    ("full", "mc", 30, (200, 3, 5, False, 1, 1.0, False, 0.5)),
    ("full", "probit", 0, (150, 4, 3, True, 2, 2.0, False, 0.5)),
    ("kron", "mc", 100, (200, 5, 4, True, 1, 4.0, True, 1.0)),
    ("kron", "mc", 50, (300, 10, 8, True, 1, 4.0, True, 1.0)),
    ("kron", "probit", 0, (200, 5, 4, True, 5, 2.0, False, 0.5)),
]


@pytest.mark.parametrize(("structure", "predictive", "draws", "problem"), CASES)
def test_search_takes_the_grid_minimum_and_delta_of_asking_every_point(
    structure, predictive, draws, problem
) -> None:
    phi, y, w, b = _problem(*problem)
    seed = problem[4]
    folds = _folds(phi, y, w, b, structure, seed)
    template = lp.LaplaceMap(w, b, 1.0, structure, predictive, draws, seed, "")
    best, delta, value = _every_point(lambda x: lp.heldout_nll(x, folds, template))
    assert 0 < best < len(lp.NLL_GRID) - 1  # an interior minimum: the refinement is exercised
    search = lp.search_prior_precision(folds, template)
    assert search.grid_choice == lp.NLL_GRID[best]
    # the same δ to what the objective's rounding decides near its flat minimum (both
    # refinements stop at √ε in log δ), and the held-out NLL there no worse
    assert abs(search.prior_precision / delta - 1) < 1e-5
    assert search.objective <= value + 1e-12
    assert search.objective == lp.heldout_nll(search.prior_precision, folds, template)
    # the point of the search: the objective asked at under half of the 76 δ it was before
    assert search.asked <= 35


@pytest.mark.parametrize("structure", ["full", "kron"])
@pytest.mark.parametrize("bias", [True, False])
def test_probit_grid_values_are_the_objective_at_each_grid_point(structure, bias) -> None:
    phi, y, w, b = _problem(90, 4, 3, bias, 7)
    folds = _folds(phi, y, w, b, structure)
    for predictive in ("probit", "mc"):  # the squares come from either predictive's cache
        template = lp.LaplaceMap(w, b, 1.0, structure, predictive, 10, 0, "")
        squares = [lp._fold_squares(template, fold) for fold in folds]
        grid = lp.NLL_GRID[::3]
        values = lp.probit_grid_nll(folds, template, grid, squares)
        assert values is not None
        probit = lp.LaplaceMap(w, b, 1.0, structure, "probit", 0, 0, "")
        for delta, value in zip(grid, values, strict=True):
            assert abs(value - lp.heldout_nll(delta, folds, probit)) < 1e-12


def test_fit_uses_the_search_and_its_delta() -> None:
    phi, y, w, b = _problem(150, 4, 3, True, 1, 0.5)
    fit = lp.fit_laplace(phi, y, w, b, structure="full", predictive="mc", samples=100, prior="nll")
    folds = _folds(phi, y, w, b, "full")
    template = lp.LaplaceMap(w, b, 1.0, "full", "mc", 100, 0, "")
    _, delta, value = _every_point(lambda x: lp.heldout_nll(x, folds, template))
    assert abs(fit.prior_precision / delta - 1) < 1e-5
    assert fit.heldout_nll is not None and fit.heldout_nll <= value + 1e-12


def test_one_grid_point_is_the_choice_asked_at_most_once() -> None:
    phi, y, w, b = _problem(60, 3, 4, True, 1)
    folds = _folds(phi, y, w, b, "kron")
    for predictive in ("mc", "probit"):
        template = lp.LaplaceMap(w, b, 1.0, "kron", predictive, 20, 0, "")
        search = lp.search_prior_precision(folds, template, (0.5,))
        assert search.prior_precision == search.grid_choice == 0.5 and search.at_bracket_end
        assert search.objective == pytest.approx(lp.heldout_nll(0.5, folds, template), abs=1e-12)
        assert search.asked <= 1


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_singular_ggn_searches_like_every_point(structure) -> None:
    """Border case: a repeated feature column and no bias leave the GGN singular (eigenvalues
    0, the posterior variance 1/δ there): the search still agrees with asking every point."""
    phi, y, w, _ = _problem(150, 3, 4, False, 2)
    phi[:, 3] = phi[:, 2]
    folds = _folds(phi, y, w, None, structure)
    assert float(folds[0].curvature.eigenvalues.min()) < 1e-10
    template = lp.LaplaceMap(w, None, 1.0, structure, "mc", 50, 0, "")
    best, delta, _ = _every_point(lambda x: lp.heldout_nll(x, folds, template))
    search = lp.search_prior_precision(folds, template)
    assert search.grid_choice == lp.NLL_GRID[best]
    assert abs(search.prior_precision / delta - 1) < 1e-5


GRID = tuple(10.0 ** (i / 4) for i in range(-8, 9))


def _counting(values):
    asked: list[float] = []

    def objective(delta: float) -> float:
        asked.append(delta)
        return values(delta)

    return objective, asked


def test_descent_walks_to_the_valley_and_asks_only_its_way() -> None:
    index = {delta: i for i, delta in enumerate(GRID)}
    objective, asked = _counting(lambda d: (index[d] - 11) ** 2 if d in index else math.inf)
    search = lp.minimise_on_grid(objective, GRID, refine=False, start=3)
    assert search.grid_choice == GRID[11] and search.asked == len(asked) == len(set(asked))
    assert len(asked) <= 11 and {GRID[10], GRID[12]} <= set(asked)  # both neighbours seen


def test_a_long_descent_gallops() -> None:
    """From one end of the 65-point grid to a valley near the other: a few dozen points apart,
    asked at a logarithmic count of them (plain steps would ask 56)."""
    grid = lp.NLL_GRID
    index = {delta: i for i, delta in enumerate(grid)}
    objective, asked = _counting(lambda d: abs(index[d] - 60) + 0.01 * (index[d] - 60) ** 2)
    search = lp.minimise_on_grid(objective, grid, refine=False, start=5)
    assert search.grid_choice == grid[60] and len(asked) <= 20
    left, asked[:] = lp.minimise_on_grid(objective, grid, refine=False, start=64), []
    assert left.grid_choice == grid[60]


def test_descent_takes_the_smaller_delta_on_a_tie_as_every_point_does() -> None:
    flat = {delta: 1.0 for delta in GRID}
    search = lp.minimise_on_grid(flat.__getitem__, GRID, refine=False, start=8)
    assert search.grid_choice == GRID[0] == lp.minimise_on_grid(flat.__getitem__, GRID).grid_choice
    two = {delta: 1.0 if i in (5, 9) else 2.0 for i, delta in enumerate(GRID)}
    assert lp.minimise_on_grid(two.__getitem__, GRID, refine=False, start=9).grid_choice == GRID[9]


def test_descent_ending_on_a_grid_end_descends_from_the_other_end_when_lower() -> None:
    """Two valleys: a plateau on the small-δ end (where the descent from the probit start may
    end) and a lower valley near the other end; the other end is lower than the plateau, so the
    descent runs again from there."""
    index = {delta: i for i, delta in enumerate(GRID)}

    def values(delta: float) -> float:
        i = index[delta]
        return 1.0 + 0.01 * i if i <= 6 else 0.5 + 0.01 * (i - 13) ** 2

    search = lp.minimise_on_grid(values, GRID, refine=False, start=4)
    assert search.grid_choice == GRID[13] == lp.minimise_on_grid(values, GRID).grid_choice


def test_non_finite_start_falls_back_to_every_point_and_all_non_finite_is_refused() -> None:
    only = {delta: math.inf for delta in GRID} | {GRID[14]: 0.3}
    search = lp.minimise_on_grid(only.__getitem__, GRID, refine=False, start=2)
    assert search.grid_choice == GRID[14]
    with pytest.raises(NumericalError, match="not finite at any δ"):
        lp.minimise_on_grid(lambda d: math.nan, GRID, start=5)


def test_refinement_finds_a_smooth_minimum_between_grid_points() -> None:
    centre = math.log(10**0.6)

    def values(delta: float) -> float:
        t = math.log(delta) - centre
        return math.cosh(t) + 0.3 * t**3

    truth = minimize_scalar(lambda t: math.cosh(t) + 0.3 * t**3, bounds=(-1, 1),
                            method="bounded", options={"xatol": 1e-12}).x  # fmt: skip
    search = lp.minimise_on_grid(values, GRID)
    assert abs(math.log(search.prior_precision) - centre - truth) < 1e-7
    assert search.objective <= min(values(d) for d in GRID)


def test_refinement_of_a_parabola_in_log_delta_is_its_vertex_in_a_few_steps() -> None:
    objective, asked = _counting(lambda d: (math.log10(d) - 0.6) ** 2)
    search = lp.minimise_on_grid(objective, GRID)
    assert abs(math.log10(search.prior_precision) - 0.6) < 1e-9
    assert search.asked == len(asked) <= len(GRID) + 2


def test_refinement_of_a_flat_bracket_keeps_the_grid_point() -> None:
    x, value = lp._brent_from_bracket(lambda t: 1.0, (0.0, 1.0, 2.0), (1.0, 1.0, 1.0))
    assert value == 1.0 and 0.0 <= x <= 2.0


@pytest.mark.parametrize(
    ("grid", "problem"),
    [
        ((), "no δ"),
        ((1.0, 0.5), "increasing"),
        ((0.0, 1.0), "positive"),
        ((1.0, math.inf), "finite"),
    ],
)
def test_a_bad_grid_is_refused_in_one_line(grid, problem) -> None:
    phi, y, w, b = _problem(40, 3, 2, True, 0)
    with pytest.raises(InputError, match=problem):
        lp.fit_laplace(phi, y, w, b, prior="nll", grid=grid)


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_probit_grid_in_chunks_of_one_point_gives_the_same_values(structure, monkeypatch) -> None:
    """The grid is taken in chunks bounded by each point's temporaries (n×K, and K×D or P):
    a budget of one point a chunk gives the same numbers."""
    phi, y, w, b = _problem(60, 3, 4, True, 3)
    folds = _folds(phi, y, w, b, structure)
    template = lp.LaplaceMap(w, b, 1.0, structure, "probit", 0, 0, "")
    squares = [lp._fold_squares(template, fold) for fold in folds]
    whole = lp.probit_grid_nll(folds, template, lp.NLL_GRID, squares)
    monkeypatch.setattr(lp, "CHUNK_ELEMENTS", 1)
    chunked = lp.probit_grid_nll(folds, template, lp.NLL_GRID, squares)
    assert whole is not None and chunked is not None
    assert max(abs(a - c) for a, c in zip(whole, chunked, strict=True)) < 1e-14
