"""Trace estimators against exact traces of dense matrices and of a small model's Hessian."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
from scipy.special import stdtrit
from torch import Tensor, nn

from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.operators import DenseOperator
from curvcal.curvature.results import ConvergenceWarning, TraceResult
from curvcal.curvature.trace import (
    draw_probes,
    exact_trace,
    hutchinson_trace,
    hutchpp_trace,
    sketch_bytes,
    sketch_columns,
    trace_estimate,
    xtrace,
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
    result = hutchinson_trace(matrix, 6, seed=3, probe_dist="gaussian")
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
    assert (result.matvecs, result.n_probes, result.method) == (33, 11, "hutchpp")


def test_adaptive_stop_on_relative_half_width() -> None:
    matrix = _indefinite() + 3 * torch.eye(30, dtype=torch.float64)
    steps: list[int] = []
    result = hutchinson_trace(
        matrix, trace_rtol=0.05, max_probes=2000, probe_batch=4, on_step=steps.append
    )
    assert result.stopped_by == "rtol" and result.converged
    assert result.half_width <= 0.05 * abs(result.estimate)
    assert result.n_probes >= 10 and result.n_probes == steps[-1] == result.matvecs
    previous = hutchinson_trace(matrix, result.n_probes - 4, seed=0)  # one block fewer did not stop
    assert previous.n_probes < 10 or previous.half_width > 0.05 * abs(previous.estimate)


def test_adaptive_budget_exhausted_warns() -> None:
    with pytest.warns(ConvergenceWarning):
        result = hutchinson_trace(_indefinite(), trace_rtol=1e-6, max_probes=20)
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
        ({"trace_method": "hutchinson", "probes": 0}, "probes"),
        ({"trace_method": "hutchinson", "probes": 1}, "probes"),
        ({"probes": 3}, "probes"),
        ({"probe_dist": "uniform"}, "probe_dist"),
        ({"trace_method": "hutchinson", "trace_rtol": 0.0}, "trace_rtol"),
        ({"trace_method": "hutchinson", "trace_rtol": -0.1}, "trace_rtol"),
        ({"trace_method": "hutchinson", "trace_rtol": 0.1, "max_probes": 5}, "max_probes"),
        ({"trace_method": "girard"}, "trace_method"),
        ({"trace_method": "hutchpp", "trace_rtol": 0.1}, "trace_rtol"),
        ({"trace_method": "hutchpp", "probes": 3}, "probes"),
        ({"trace_method": "xtrace", "probes": 3}, "probes"),
        ({"trace_method": "xtrace", "trace_rtol": 0.1}, "trace_rtol"),
        ({"trace_method": "xtrace", "probe_batch": 0}, "probe_batch"),
        ({"trace_method": "xtrace", "probe_dist": "uniform"}, "probe_dist"),
        ({"probe_batch": 0}, "probe_batch"),
    ],
)
def test_bad_requests_are_refused(options: dict[str, object], what: str) -> None:
    with pytest.raises(InputError) as error:
        trace_estimate(torch.eye(5, dtype=torch.float64), **options)  # type: ignore[arg-type]
    assert error.value.what == what


def _xtrace_values(matrix: Tensor, probes: Tensor) -> list[float]:
    """t_i = tr(Q_iᵀAQ_i) + ω_iᵀ(I − Q_iQ_iᵀ)A(I − Q_iQ_iᵀ)ω_i with Q_i = orth(AΩ without ω_i),
    computed plainly, one QR per probe (the reference for the O(s²) formulas). One probe: its
    sketch is empty and t_1 = ω_1ᵀAω_1."""
    values = []
    for i in range(probes.shape[1]):
        others = torch.cat([probes[:, :i], probes[:, i + 1 :]], dim=1)
        basis, _ = torch.linalg.qr(matrix @ others)
        complement = torch.eye(matrix.shape[0], dtype=torch.float64) - basis @ basis.t()
        omega = probes[:, i]
        values.append(
            float(torch.trace(basis.t() @ matrix @ basis))
            + float(omega @ complement @ matrix @ complement @ omega)
        )
    return values


def _xtrace_probes(matrix: Tensor, matvecs: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return draw_probes(matrix.shape[0], matvecs // 2, "rademacher", generator)


def _xtrace_by_definition(matrix: Tensor, matvecs: int, seed: int) -> list[float]:
    return _xtrace_values(matrix, _xtrace_probes(matrix, matvecs, seed))


def _dense_jackknife_variance(matrix: Tensor, probes: Tensor) -> float:
    """(n − 1)/n Σ_j (T_(j) − T̄)², T_(j) XTrace rerun from scratch on the probes without ω_j."""
    count = probes.shape[1]
    without = torch.tensor(
        [
            sum(values) / len(values)
            for j in range(count)
            for values in [
                _xtrace_values(matrix, torch.cat([probes[:, :j], probes[:, j + 1 :]], dim=1))
            ]
        ],
        dtype=torch.float64,
    )
    return (count - 1) / count * float(((without - without.mean()) ** 2).sum())


def test_xtrace_equals_its_definition() -> None:
    matrix = _indefinite(25)
    probes = _xtrace_probes(matrix, 12, seed=4)
    values = torch.tensor(_xtrace_values(matrix, probes), dtype=torch.float64)
    result = xtrace(matrix, 12, seed=4, probe_batch=5)
    assert result.estimate == pytest.approx(float(values.mean()), abs=1e-10)
    variance = _dense_jackknife_variance(matrix, probes)
    assert result.standard_error**2 == pytest.approx(variance, rel=1e-10)
    half = 2.5706 * result.standard_error  # t(0.975, 5)
    assert result.ci95 == pytest.approx(
        (result.estimate - half, result.estimate + half), abs=1e-4 * half
    )
    assert (result.matvecs, result.n_probes, result.method) == (12, 6, "xtrace")
    assert "jackknife" in result.interval
    assert xtrace(matrix, 13, seed=4, probe_batch=5) == result  # the odd product is unused


@pytest.mark.parametrize(
    ("spectrum", "matvecs", "probe_batch"),
    [
        (torch.linspace(-2.0, 5.0, 30), 4, 1),  # n = 2, the fewest probes: T_(j) = ω_kᵀAω_k
        (torch.linspace(-2.0, 5.0, 30), 7, 2),  # n = 3
        (10.0 * 0.8 ** torch.arange(40), 20, 3),  # decaying
        (torch.linspace(0.5, 1.5, 40), 30, 8),  # flat
    ],
    ids=["n2", "n3", "decaying", "flat"],
)
def test_xtrace_interval_is_the_jackknife_over_probes(
    spectrum: Tensor, matvecs: int, probe_batch: int
) -> None:
    """The library's variance from the small matrices equals the jackknife computed by rerunning
    XTrace without each probe; the estimate is still the mean of the leave-one-out values."""
    matrix = spectrum_matrix(spectrum.to(torch.float64), seed=7)
    for seed in (0, 1):
        probes = _xtrace_probes(matrix, matvecs, seed)
        result = xtrace(matrix, matvecs, seed=seed, probe_batch=probe_batch)
        assert result.stopped_by == "n_probes"
        values = _xtrace_values(matrix, probes)
        assert result.estimate == pytest.approx(sum(values) / len(values), rel=1e-12)
        variance = _dense_jackknife_variance(matrix, probes)
        assert result.standard_error**2 == pytest.approx(variance, rel=1e-10)
        half = float(stdtrit(probes.shape[1] - 1, 0.975)) * result.standard_error
        assert result.ci95 == pytest.approx(
            (result.estimate - half, result.estimate + half), rel=1e-14, abs=1e-14
        )
    if matvecs == 4:  # one probe left: its sketch is empty, T_(j) is the other's ωᵀAω
        quadratic = (probes * (matrix @ probes)).sum(dim=0)
        assert result.standard_error == pytest.approx(
            abs(float(quadratic[0] - quadratic[1])) / 2, rel=1e-10
        )


def test_xtrace_jackknife_interval_covers_at_least_93_percent() -> None:
    """200 seeded runs, 100 products (50 probes) on a 60 × 60 decaying spectrum."""
    matrix = spectrum_matrix(10.0 * 0.9 ** torch.arange(60, dtype=torch.float64), seed=1)
    assert _coverage(matrix, "xtrace") >= 0.93


def test_xtrace_interval_of_a_sketch_holding_the_range_is_the_spread_of_its_values() -> None:
    """Rank-deficient Y: the basis of A's range is exact, held fixed, and the jackknife of the
    mean of values that then each depend on one probe is their s/√n: width zero to rounding."""
    low_rank = spectrum_matrix(torch.tensor([3.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), seed=2)
    for seed in range(5):
        result = xtrace(low_rank, 12, seed=seed)
        assert result.estimate == pytest.approx(2.0, abs=1e-12)
        assert result.ci95 == pytest.approx((2.0, 2.0), abs=1e-11)
        assert result.stopped_by == "n_probes"


@pytest.mark.parametrize(
    ("operator", "matvecs", "what"),
    [
        (torch.eye(5, dtype=torch.float64), 3, "probes"),
        (torch.eye(5, dtype=torch.float64), 0, "probes"),
        (torch.eye(5, dtype=torch.float64), 4.0, "probes"),
    ],
)
def test_xtrace_refuses_bad_requests(operator: Tensor, matvecs: object, what: str) -> None:
    with pytest.raises(InputError) as error:
        xtrace(operator, matvecs)  # type: ignore[arg-type]
    assert error.value.what == what


def test_xtrace_beats_hutchpp_on_a_decaying_spectrum() -> None:
    matrix = spectrum_matrix(10.0 * 0.8 ** torch.arange(120, dtype=torch.float64), seed=6)
    exact = float(torch.trace(matrix))
    errors = {
        name: sum((estimator(matrix, 40, seed=s).estimate - exact) ** 2 for s in range(40))
        for name, estimator in (("xtrace", xtrace), ("hutchpp", hutchpp_trace))
    }
    assert errors["xtrace"] < 0.5 * errors["hutchpp"]


def _coverage(matrix: Tensor, method: str, runs: int = 200) -> float:
    exact = float(torch.trace(matrix))
    hits = 0
    for seed in range(runs):
        low, high = trace_estimate(matrix, 100, trace_method=method, seed=seed).ci95
        hits += low <= exact <= high
    return hits / runs


@pytest.mark.parametrize(
    "spectrum",
    [
        10.0 * 0.9 ** torch.arange(300, dtype=torch.float64),  # decaying
        torch.linspace(0.5, 1.5, 300, dtype=torch.float64),  # flat
        torch.linspace(-2.0, 5.0, 300, dtype=torch.float64),  # indefinite
    ],
    ids=["decaying", "flat", "indefinite"],
)
def test_default_trace_interval_covers_at_least_93_percent(spectrum: Tensor) -> None:
    """The default estimator's 95% interval, 100 products, 200 seeded runs against dense truth."""
    matrix = spectrum_matrix(spectrum, seed=1)
    assert trace_estimate(matrix, 100).method == "hutchpp"
    assert 0.93 <= _coverage(matrix, "hutchpp") <= 0.99


@pytest.mark.parametrize("case", ["mlp_case", "cnn_case"])
def test_default_trace_interval_covers_a_model_hessian(
    case: str, request: pytest.FixtureRequest
) -> None:
    hessian = request.getfixturevalue(case)[3]
    assert 0.93 <= _coverage(hessian, "hutchpp") <= 0.99


def test_xtrace_on_hessian_operator_and_rank_deficient_sketches(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, 20), probe_batch=16)
    assert xtrace(operator, 40, probe_batch=16).estimate == pytest.approx(
        xtrace(hessian, 40).estimate, abs=1e-10
    )
    # more probes than dimensions, and a rank-2 matrix: the sketch holds the whole range
    exact = float(torch.trace(hessian))
    assert xtrace(hessian, 200).estimate == pytest.approx(exact, abs=1e-10)
    low_rank = spectrum_matrix(torch.tensor([3.0, -1.0, 0.0, 0.0, 0.0, 0.0]))
    result = xtrace(low_rank, 10)
    assert result.estimate == pytest.approx(2.0, abs=1e-12)
    assert result.standard_error == pytest.approx(0.0, abs=1e-12)
    zero = xtrace(torch.zeros(5, 5, dtype=torch.float64), 6)
    assert (zero.estimate, zero.standard_error) == (0.0, 0.0)
    assert xtrace(torch.tensor([[2.5]], dtype=torch.float64), 4).estimate == pytest.approx(2.5)


def _hutchpp_by_definition(
    matrix: Tensor, matvecs: int, seed: int, distribution: str, sketch_size: int | None = None
) -> tuple[float, list[float]]:
    """Hutch++ written out with dense algebra from the same probes: S (P × ⌊m/3⌋, or
    ``sketch_size`` columns) then G (the rest), Q = qr(AS), tr(QᵀAQ) and the values
    gᵀ(I − QQᵀ)A(I − QQᵀ)g."""
    n = matrix.shape[0]
    sketch_size = max(1, matvecs // 3) if sketch_size is None else sketch_size
    generator = torch.Generator().manual_seed(seed)
    sketch = draw_probes(n, sketch_size, distribution, generator)
    residual = draw_probes(n, matvecs - 2 * sketch_size, distribution, generator)
    basis, _ = torch.linalg.qr(matrix @ sketch)
    complement = torch.eye(n, dtype=torch.float64) - basis @ basis.t()
    deflated = complement @ residual
    values = (deflated * (complement @ matrix @ deflated)).sum(0)
    return float(torch.trace(basis.t() @ matrix @ basis)), [float(v) for v in values]


@pytest.mark.parametrize("distribution", ["rademacher", "gaussian"])
@pytest.mark.parametrize("probe_batch", [1, 3, 8])
def test_streamed_hutchpp_equals_the_dense_formula(distribution: str, probe_batch: int) -> None:
    matrix = _indefinite(40)
    exact_part, values = _hutchpp_by_definition(matrix, 31, seed=7, distribution=distribution)
    samples = torch.tensor(values, dtype=torch.float64)
    result = hutchpp_trace(matrix, 31, seed=7, probe_dist=distribution, probe_batch=probe_batch)
    assert result.estimate == pytest.approx(exact_part + float(samples.mean()), abs=1e-10)
    assert result.standard_error == pytest.approx(float(samples.std()) / len(values) ** 0.5)
    assert (result.matvecs, result.n_probes, result.stopped_by) == (31, 11, "n_probes")


@pytest.mark.parametrize("max_sketch", [1, 4, 10, 50])
def test_a_bounded_hutchpp_sketch_is_hutchpp_with_a_smaller_sketch(max_sketch: int) -> None:
    """``max_sketch`` columns at most (⌊31/3⌋ = 10 when larger): the dense formula with that
    sketch, the products it does not take spent on deflated probes (31 − 2s), the sketch's
    bytes s × P × 8."""
    matrix = _indefinite(40)
    columns = min(max_sketch, 10)
    exact_part, values = _hutchpp_by_definition(matrix, 31, 7, "rademacher", columns)
    result = hutchpp_trace(matrix, 31, seed=7, probe_batch=3, max_sketch=max_sketch)
    samples = torch.tensor(values, dtype=torch.float64)
    assert result.estimate == pytest.approx(exact_part + float(samples.mean()), abs=1e-10)
    assert (result.matvecs, result.n_probes) == (31, 31 - 2 * columns)
    assert result.sketch_bytes == columns * 40 * 8
    through = trace_estimate(matrix, 31, seed=7, probe_batch=3, max_sketch=max_sketch)
    assert through.estimate == result.estimate


def test_a_bounded_sketch_holding_the_range_is_still_exact() -> None:
    """Rank 2 and a sketch of 2 columns: Q spans range(A), tr(A) exactly, no spread."""
    spectrum = torch.zeros(30, dtype=torch.float64)
    spectrum[:2] = torch.tensor([3.0, -1.25], dtype=torch.float64)
    result = hutchpp_trace(spectrum_matrix(spectrum, seed=4), 40, seed=1, max_sketch=2)
    assert result.estimate == pytest.approx(1.75, abs=1e-10)
    assert result.standard_error == pytest.approx(0.0, abs=1e-10)
    assert result.n_probes == 36


def test_only_hutchpp_bounds_its_sketch() -> None:
    matrix = _indefinite(20)
    for method in ("xtrace", "hutchinson"):
        with pytest.raises(InputError) as error:
            trace_estimate(matrix, 20, trace_method=method, max_sketch=3)
        assert error.value.what == "max_sketch"
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError) as error:
            hutchpp_trace(matrix, 20, max_sketch=bad)  # type: ignore[arg-type]
        assert error.value.what == "max_sketch"


def test_float32_hutchpp_agrees_with_float64() -> None:
    matrix = _indefinite(50)
    single = hutchpp_trace(matrix.float(), 40, seed=2, probe_batch=3)
    double = hutchpp_trace(matrix, 40, seed=2, probe_batch=3)
    assert single.estimate == pytest.approx(double.estimate, rel=1e-5)


@pytest.mark.parametrize("rank", [1, 3, 6])
def test_hutchpp_is_exact_when_the_sketch_holds_the_range(rank: int) -> None:
    """A of rank r ≤ s: Q spans range(A), so tr(QᵀAQ) = tr(A) and the deflated remainder is 0;
    the basis keeps r columns, so only r products go to tr(QᵀAQ)."""
    spectrum = torch.zeros(30, dtype=torch.float64)
    spectrum[:rank] = torch.linspace(-1.5, 4.0, rank, dtype=torch.float64)
    matrix = spectrum_matrix(spectrum, seed=rank)
    operator = DenseOperator(matrix)
    result = hutchpp_trace(operator, 21, seed=1, probe_batch=4)
    assert result.estimate == pytest.approx(float(spectrum.sum()), abs=1e-10)
    assert result.standard_error == pytest.approx(0.0, abs=1e-10)
    assert result.ci95 == pytest.approx((result.estimate, result.estimate), abs=1e-9)
    # 7 sketch products, r for tr(QᵀAQ), the rest deflated probes: never more than asked
    assert result.matvecs == operator.n_matvecs == 21
    assert result.n_probes == 21 - 7 - rank


@pytest.mark.parametrize("estimator", [hutchpp_trace, xtrace])
def test_a_sketch_spanning_the_space_stops_exact(estimator: Callable[..., TraceResult]) -> None:
    """s ≥ P: the sketch is capped at P columns, Q spans R^P and tr(QᵀAQ) is the trace; the
    remaining products are not spent and the result says so. (Gaussian probes: P Rademacher
    probes of a small P are often linearly dependent, and then the remainder is estimated.)"""
    matrix = _indefinite(5)
    operator = DenseOperator(matrix)
    result = estimator(operator, 300, seed=3, probe_batch=2, probe_dist="gaussian")
    assert result.estimate == pytest.approx(float(torch.trace(matrix)), abs=1e-12)
    assert (result.standard_error, result.ci95) == (0.0, (result.estimate, result.estimate))
    assert (result.stopped_by, result.converged) == ("exhausted", True)
    assert result.matvecs == operator.n_matvecs == 10
    assert "whole space" in result.interval


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("matvecs", [4, 5, 12, 100])
def test_tiny_operators(n: int, matvecs: int) -> None:
    matrix = spectrum_matrix(torch.linspace(-1.0, 2.0, n) + 0.3, seed=n)  # full rank
    exact = float(torch.trace(matrix))
    for estimator in (hutchpp_trace, xtrace):
        result = estimator(matrix, matvecs, seed=n)
        assert result.matvecs <= matvecs
        assert result.ci95[0] <= result.estimate <= result.ci95[1]
        if result.stopped_by == "exhausted":
            assert result.estimate == pytest.approx(exact, abs=1e-12)
    # one sketch column (s = 1): the dense formula
    if n > 1:
        exact_part, values = _hutchpp_by_definition(matrix, 4, seed=n, distribution="rademacher")
        expected = exact_part + sum(values) / len(values)
        assert hutchpp_trace(matrix, 4, seed=n).estimate == pytest.approx(expected, abs=1e-12)
    # enough products for a sketch of P columns (independent: Gaussian): exact
    result = hutchpp_trace(matrix, 3 * n + 4, seed=n, probe_dist="gaussian")
    assert (result.estimate, result.stopped_by) == (pytest.approx(exact, abs=1e-12), "exhausted")


def test_sketch_of_a_zero_operator() -> None:
    for n in (1, 3):
        zero = torch.zeros(n, n, dtype=torch.float64)
        for estimator in (hutchpp_trace, xtrace):
            result = estimator(zero, 12)
            assert (result.estimate, result.standard_error) == (0.0, 0.0)


def test_sketch_sizes_and_bytes() -> None:
    assert sketch_columns("hutchpp", 100, 10**6) == 33
    assert sketch_columns("hutchpp", 100_000, 9802) == 9802
    assert sketch_columns("hutchpp", 4, 1) == 1
    assert sketch_columns("xtrace", 100, 10**6) == 50
    assert sketch_columns("xtrace", 100, 1) == 2
    assert sketch_columns("hutchinson", 100, 10**6) == 0
    assert sketch_bytes("hutchpp", 100, 1000, torch.float32) == 33 * 1000 * 4
    assert sketch_bytes("xtrace", 100, 1000, torch.float64) == 50 * 1000 * 8


def _big_storages(n: int) -> dict[int, int]:
    """Bytes of each storage (by address) of the live tensors of at least ``n`` elements."""
    storages = {}
    for thing in gc.get_objects():
        if issubclass(type(thing), Tensor) and thing.numel() >= n:
            storage = thing.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return storages


class _WatchedOperator(DenseOperator):
    """A dense operator that, at every product, adds up the bytes of the live tensors of at
    least P elements (found through the garbage collector, one count per storage) made since
    it was built."""

    def __init__(self, matrix: Tensor) -> None:
        super().__init__(matrix)
        self.before = set(_big_storages(self.shape[0]))
        self.peak_bytes = 0
        self.widest = 0

    def matmat(self, vectors: Tensor) -> Tensor:
        live = _big_storages(self.shape[0])
        held = sum(size for address, size in live.items() if address not in self.before)
        self.peak_bytes = max(self.peak_bytes, held)
        self.widest = max(self.widest, int(vectors.shape[1]))
        return super().matmat(vectors)


@pytest.mark.parametrize(("estimator", "columns"), [(hutchpp_trace, 40), (xtrace, 60)])
def test_sketching_holds_one_sketch_and_the_blocks_in_flight(
    estimator: Callable[..., TraceResult], columns: int
) -> None:
    """At every product the live P-sized tensors add up to at most the s × P sketch plus a few
    blocks of ``probe_batch`` columns (the whole-sketch copies of the dense formula would hold
    three to five s × P matrices)."""
    n, batch = 3000, 4
    operator = _WatchedOperator(torch.eye(n, dtype=torch.float64) * 0.5)
    result = estimator(operator, 120, probe_batch=batch)
    assert result.estimate == pytest.approx(0.5 * n, rel=1e-2)
    assert operator.widest <= batch
    assert operator.peak_bytes <= (columns + 4 * batch) * n * 8
