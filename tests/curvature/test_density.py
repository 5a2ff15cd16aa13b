"""Stochastic Lanczos quadrature: exact quadrature moments and the density's normalisation, with
the basis kept and by the three-term recurrence alone."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.density import spectral_density
from curvcal.curvature.memory import density_keeps_basis, sketch_limit
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.trace import draw_probes, hutchinson_trace
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


def _exact_density(
    matrix: Tensor, grid: tuple[float, ...], sigma: float, runs: int, seed: int
) -> Tensor:
    """(1/R) Σ_r Σ_i (v_rᵀu_i)² N(t; λ_i, σ²) on ``grid`` from the dense eigendecomposition, for
    the normalised Rademacher probes v_r the density draws with ``seed``: the smoothed measure
    SLQ's quadrature approximates."""
    values, vectors = torch.linalg.eigh(matrix.double())
    n = matrix.shape[0]
    generator = torch.Generator().manual_seed(seed)
    points = torch.tensor(grid, dtype=torch.float64)
    kernel = torch.exp(-0.5 * ((points[:, None] - values[None, :]) / sigma) ** 2)
    kernel = kernel / (sigma * math.sqrt(2 * math.pi))
    total = torch.zeros_like(points)
    for _ in range(runs):
        probe = draw_probes(n, 1, "rademacher", generator)[:, 0].double() / math.sqrt(n)
        total += kernel @ (vectors.T @ probe) ** 2
    return total / runs


def _outlier_matrix(n: int = 60) -> Tensor:
    """A Hessian-like spectrum: a bulk near 0 and a few well separated outliers, whose Ritz values
    converge within a few steps (so the three-term recurrence loses orthogonality early)."""
    generator = torch.Generator().manual_seed(5)
    bulk = 0.05 * torch.randn(n - 5, generator=generator, dtype=torch.float64)
    outliers = torch.tensor([40.0, 25.0, 12.0, 6.0, 3.0], dtype=torch.float64)
    return spectrum_matrix(torch.cat([bulk, outliers]), seed=3)


def test_three_term_runs_repeat_converged_values_yet_keep_the_quadrature() -> None:
    """60 steps on a 60 × 60 matrix: with the basis kept the run stops at P steps on the exact
    eigenvalues; by the three-term recurrence the top eigenvalue reappears as ghost copies whose
    weights sum to the probe's squared component along it, and the quadrature moments
    Σ_j w_j θ_j^p still equal vᵀAᵖv for p ≤ 9 (relative to ‖A‖ᵖ)."""
    matrix = _outlier_matrix()
    values, vectors = torch.linalg.eigh(matrix)
    kept = spectral_density(matrix, runs=2, steps=60, seed=1)
    bare = spectral_density(matrix, runs=2, steps=60, seed=1, reorthogonalise=False)
    assert kept.reorthogonalised and not bare.reorthogonalised
    generator = torch.Generator().manual_seed(1)
    for run in range(2):
        probe = draw_probes(60, 1, "rademacher", generator)[:, 0].double() / math.sqrt(60)
        nodes = torch.tensor(bare.nodes[run], dtype=torch.float64)
        weights = torch.tensor(bare.weights[run], dtype=torch.float64)
        ghosts = (nodes - 40.0).abs() < 1e-8
        assert int(ghosts.sum()) >= 2  # the recurrence did lose orthogonality
        assert float(weights[ghosts].sum()) == pytest.approx(
            float((vectors[:, -1] @ probe) ** 2), rel=1e-9
        )
        for power in (0, 1, 2, 5, 9):
            quadratic = float(probe @ torch.linalg.matrix_power(matrix, power) @ probe)
            assert float((weights * nodes**power).sum()) == pytest.approx(
                quadratic, abs=1e-11 * 40.0**power
            )
        assert torch.allclose(torch.tensor(kept.nodes[run], dtype=torch.float64), values, atol=1e-9)


@pytest.mark.parametrize("reorthogonalise", [True, False])
def test_density_matches_the_dense_smoothed_measure(reorthogonalise: bool) -> None:
    """Either way, 40 steps give the Gaussian-smoothed density of the probes' spectral measure
    (from the dense eigendecomposition) to 1e-6 in L1."""
    matrix = _outlier_matrix()
    result = spectral_density(
        matrix, runs=3, steps=40, seed=2, n_grid=800, reorthogonalise=reorthogonalise
    )
    exact = _exact_density(matrix, result.grid, result.bandwidth, 3, 2)
    grid = torch.tensor(result.grid, dtype=torch.float64)
    error = torch.trapezoid((torch.tensor(result.density, dtype=torch.float64) - exact).abs(), grid)
    assert float(error) < 1e-6


def test_the_step_bound_gives_the_default_density_to_rounding() -> None:
    """The claim behind ``MAX_DENSITY_STEPS``: on an evenly spread spectrum (the slowest for a
    Gauss rule) of 800 values, with the reported smoothing (1% of the span), the bound's steps
    give the density of the dense spectral measure to 1e-6 of its peak, and 80 steps do not
    (so the bound is not loose by an order of magnitude)."""
    from curvcal.settings.hessian import MAX_DENSITY_STEPS

    matrix = spectrum_matrix(torch.linspace(-1.0, 3.0, 800, dtype=torch.float64), seed=3)
    sigma = 0.01 * 4.0

    def peak_error(steps: int) -> float:
        result = spectral_density(matrix, runs=1, steps=steps, seed=5, bandwidth=sigma)
        exact = _exact_density(matrix, result.grid, sigma, 1, 5)
        found = torch.tensor(result.density, dtype=torch.float64)
        return float((found - exact).abs().max() / exact.abs().max())

    assert peak_error(MAX_DENSITY_STEPS) < 1e-6
    assert peak_error(80) > 1e-4


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        # ran past four minutes on a 9,802-parameter model (capped at P)
        ("density_steps", 100_000, "steps cannot change the density"),
        # ran past a minute
        ("density_runs", 1_000_000_000, "the density's sampling error falls as 1/√runs"),
    ],
)
def test_density_settings_past_their_bound_are_refused_with_the_reason(
    field: str, value: int, why: str, run_cli
) -> None:
    """Exit 2 before anything is loaded, saying why the bound is what it is; the same bound
    and reason from a policy or Python (the settings), and the bound itself accepted."""
    from curvcal.settings import hessian
    from curvcal.settings.hessian import HessianSettings

    bound = {"density_steps": hessian.MAX_DENSITY_STEPS, "density_runs": hessian.MAX_DENSITY_RUNS}
    option = "--" + field.replace("_", "-")
    result = run_cli(
        "hessian", "model.safetensors", "--data", "curvcal:digits", "--density",
        option, str(value),
    )  # fmt: skip
    assert result.code == 2, result.output
    assert result.stderr.startswith(
        f"curvcal: error: Invalid value for '{option}': {value} is not in the range "
        f"1<=x<={bound[field]} ("
    ), result.stderr
    assert why in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    with pytest.raises(InputError, match=why.split(" as ")[0]) as caught:
        HessianSettings(density=True, **{field: bound[field] + 1})  # policy, Python
    assert caught.value.what == field
    assert getattr(HessianSettings(**{field: bound[field]}), field) == bound[field]


def test_the_steps_refusal_points_at_runs_within_their_bound(run_cli) -> None:
    """More steps cannot help; more runs can, up to their own bound, which the message names."""
    from curvcal.settings.hessian import MAX_DENSITY_RUNS

    steps = run_cli(
        "hessian", "model.safetensors", "--data", "curvcal:digits", "--density",
        "--density-steps", "100000",
    )  # fmt: skip
    assert f"(--density-runs, at most {MAX_DENSITY_RUNS})" in steps.stderr, steps.stderr


@pytest.mark.parametrize("reorthogonalise", [True, False])
def test_float32_hessian_density_moments_match_dense(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor], reorthogonalise: bool
) -> None:
    """Float32 products (the basis stored in float32, or the recurrence in float64): each run's
    quadrature moments Σ_j w_j θ_jᵖ equal vᵀHᵖv of the dense float64 Hessian to float32
    rounding, relative to ‖H‖ᵖ, up to p = 2·steps − 1 = 59 — degrees that depend on every step,
    past the point where the recurrence loses orthogonality (75 parameters, 30 steps)."""
    model, x, y, hessian = mlp_case
    operator = HessianOperator(copy.deepcopy(model).float(), split(x.float(), y, 20))
    result = spectral_density(operator, runs=2, steps=30, seed=4, reorthogonalise=reorthogonalise)
    assert result.reorthogonalised is reorthogonalise
    scale = float(torch.linalg.matrix_norm(hessian, 2))
    generator = torch.Generator().manual_seed(4)
    for run in range(2):
        probe = draw_probes(75, 1, "rademacher", generator)[:, 0].double() / math.sqrt(75)
        nodes = torch.tensor(result.nodes[run], dtype=torch.float64)
        weights = torch.tensor(result.weights[run], dtype=torch.float64)
        image = probe
        for power in range(1, 60):
            image = hessian @ image
            if power in (1, 2, 3, 7, 16, 31, 59):
                form = float(probe @ image)
                quadrature = float((weights * nodes**power).sum())
                assert abs(quadrature - form) <= 1e-4 * scale**power, power


@pytest.mark.parametrize("reorthogonalise", [True, False])
def test_border_cases_of_either_recurrence(reorthogonalise: bool) -> None:
    """A 1 × 1 operator, a zero operator (an invariant subspace at once), a multiple of the
    identity (one node at c with weight 1) and a single step (node vᵀAv)."""
    options = {"reorthogonalise": reorthogonalise}
    single = spectral_density(
        torch.tensor([[3.0]], dtype=torch.float64), runs=1, steps=4, **options
    )
    assert single.nodes == ((3.0,),) and single.weights[0] == pytest.approx((1.0,))
    zero = spectral_density(torch.zeros(4, 4, dtype=torch.float64), runs=2, steps=3, **options)
    assert all(n == (0.0,) for n in zero.nodes) and zero.matvecs == 2
    scaled = spectral_density(2.5 * torch.eye(6, dtype=torch.float64), runs=1, steps=5, **options)
    assert scaled.nodes[0] == pytest.approx((2.5,)) and scaled.weights[0] == pytest.approx((1.0,))
    matrix = _outlier_matrix()
    one = spectral_density(matrix, runs=1, steps=1, seed=3, **options)
    probe = draw_probes(60, 1, "rademacher", torch.Generator().manual_seed(3))[:, 0] / math.sqrt(60)
    assert one.nodes[0] == pytest.approx((float(probe @ matrix @ probe),), abs=1e-12)


def test_sketch_limit_counts_columns_of_the_budget_and_the_free_memory() -> None:
    """P = 1,000 float32 values a column: the budget (or the free memory, when smaller) over
    4,000 bytes, at least one; None without a budget or for a method without a bounded sketch."""
    single = torch.float32
    assert sketch_limit("hutchpp", 1000, single, 40_000) == 10
    assert sketch_limit("hutchpp", 1000, single, 40_000, free=12_000) == 3
    assert sketch_limit("hutchpp", 1000, torch.float64, 40_000) == 5
    assert sketch_limit("hutchpp", 1000, single, 10) == 1
    assert sketch_limit("hutchpp", 1000, single, None) is None
    assert sketch_limit("xtrace", 1000, single, 40_000) is None
    assert sketch_limit("hutchinson", 1000, single, 40_000) is None


def test_the_basis_is_kept_when_the_budget_or_the_bound_holds_it() -> None:
    """What the basis allocates: min(steps, P) + 1 rows of P values — float64 for float64
    products (41 × 100 × 8 = 32,800 bytes), float32 rows and three float64 vectors (the work
    vector and the two latest rows widened) for float32 products (41 × 100 × 4 + 3 × 800 =
    18,800)."""
    assert density_keeps_basis(40, 100, None)
    assert density_keeps_basis(40, 100, 32_800) and not density_keeps_basis(40, 100, 32_799)
    single = torch.float32
    assert density_keeps_basis(40, 100, 18_800, dtype=single)
    assert not density_keeps_basis(40, 100, 18_799, dtype=single)
    assert density_keeps_basis(400, 100, 101 * 100 * 8)  # capped at P vectors
    assert density_keeps_basis(40, 100, 1, asked=40)  # --max-basis overrides the budget
    assert not density_keeps_basis(40, 100, None, asked=39)


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"runs": 0}, "runs"),
        ({"steps": 0}, "steps"),
        ({"n_grid": 1}, "n_grid"),
        ({"bandwidth": 0.0}, "bandwidth"),
        ({"reorthogonalise": "no"}, "reorthogonalise"),
    ],
)
def test_bad_requests_are_refused(options: dict[str, object], what: str) -> None:
    with pytest.raises(InputError) as error:
        spectral_density(torch.eye(3, dtype=torch.float64), **options)  # type: ignore[arg-type]
    assert error.value.what == what


def test_the_run_bound_gives_the_density_to_a_few_percent() -> None:
    """The claim behind ``MAX_DENSITY_RUNS``: on an evenly spread spectrum of 200 values with the
    reported smoothing (1% of the span), the density of the bound's runs (their exact spectral
    measures, which the quadrature gives to rounding at enough steps) is within 6% of the peak of
    the exact density (1/P) Σ_i N(t; λ_i, σ²), and a sixteenth of the runs is not (the error falls
    as 1/√runs: the bound is not loose by more than four in error)."""
    from curvcal.settings.hessian import MAX_DENSITY_RUNS

    values = torch.linspace(-1.0, 3.0, 200, dtype=torch.float64)
    matrix = spectrum_matrix(values, seed=3)
    sigma = 0.01 * 4.0
    grid = tuple(torch.linspace(-1.2, 3.2, 400, dtype=torch.float64).tolist())
    points = torch.tensor(grid, dtype=torch.float64)
    kernel = torch.exp(-0.5 * ((points[:, None] - values[None, :]) / sigma) ** 2)
    exact = kernel.sum(1) / (values.numel() * sigma * math.sqrt(2 * math.pi))

    def peak_error(runs: int) -> float:
        sampled = _exact_density(matrix, grid, sigma, runs, seed=0)
        return float((sampled - exact).abs().max() / exact.max())

    assert peak_error(MAX_DENSITY_RUNS) < 0.06
    assert peak_error(MAX_DENSITY_RUNS // 16) > 0.1
    # the quadrature the measure stands for: a few runs of SLQ give the same measure
    result = spectral_density(matrix, runs=3, steps=160, seed=0, bandwidth=sigma)
    reference = _exact_density(matrix, result.grid, sigma, 3, 0)
    found = torch.tensor(result.density, dtype=torch.float64)
    assert float((found - reference).abs().max() / reference.max()) < 1e-6
