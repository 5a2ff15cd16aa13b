"""Lanczos from a given start vector, and the warm start from a sample of the data, against
dense float64 truth (torch.linalg.eigh)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.analysis import analyse_batches
from curvcal.curvature.eigen import eigenvalues, lanczos
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.operators import DenseOperator
from curvcal.curvature.progress import Stopped
from curvcal.curvature.results import ConvergenceWarning
from curvcal.curvature.warm_start import (
    check_fraction,
    sample_batches,
    sample_rows,
    warm_start,
)
from curvcal.errors import InputError, SettingsError
from curvcal.settings.hessian import HessianSettings

from .cases import dense_hessian, spectrum_matrix, split

BATCH = 20  # 50 samples as 20 + 20 + 10


def _top(hessian: Tensor) -> tuple[float, Tensor]:
    values, vectors = torch.linalg.eigh(hessian)
    return float(values[-1]), vectors[:, -1]


def test_a_start_near_the_top_eigenvector_needs_fewer_products() -> None:
    """A spectrum whose top gap is small (1 against 0.98 and a cluster below): from a random
    start Lanczos needs many steps to 1e-8; from the top eigenvector plus 1e-3 of noise a
    handful. Both find the exact λmax."""
    values = torch.cat([torch.tensor([1.0, 0.98]), torch.linspace(-0.5, 0.97, 398)])
    matrix = spectrum_matrix(values, seed=3)
    exact, top = _top(matrix)
    noise = torch.randn(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    start = top + 1e-3 * noise / noise.norm()
    cold = lanczos(DenseOperator(matrix), tol=1e-8, seed=0)
    warm = lanczos(DenseOperator(matrix), tol=1e-8, seed=0, start=start)
    assert cold.converged and warm.converged
    assert cold.values[0].value == pytest.approx(exact, abs=1e-8)
    assert warm.values[0].value == pytest.approx(exact, abs=1e-8)
    # the margin: a 1e-3 start error needs a few steps at this gap, a random start (overlap
    # ~1/20 with the top vector) several times as many
    assert 2 * warm.matvecs < cold.matvecs


def test_a_start_near_another_eigenvector_still_finds_the_top() -> None:
    """Started 1e-4 away from the *second* eigenvector, Lanczos still finds λmax; the start
    is not modified. (Exactly on it, the Krylov space is invariant: Lanczos' docstring says
    why that start converges to the second value.)"""
    matrix = spectrum_matrix(torch.linspace(-1.0, 2.0, 30), seed=2)
    vectors = torch.linalg.eigh(matrix).eigenvectors
    noise = torch.randn(30, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    start = vectors[:, -2] + 1e-4 * noise / noise.norm()
    before = start.clone()
    spectrum = eigenvalues(matrix, 1, tol=1e-10, start=start)
    assert spectrum.values[0].value == pytest.approx(2.0, abs=1e-9)
    assert torch.equal(start, before)


def test_a_float32_start_on_a_float64_operator_is_taken() -> None:
    matrix = spectrum_matrix(torch.linspace(0.0, 3.0, 20), seed=4)
    start = torch.ones(20, dtype=torch.float32)
    spectrum = eigenvalues(matrix, 2, tol=1e-10, start=start)
    assert spectrum.eigenvalues == pytest.approx(
        torch.linalg.eigvalsh(matrix).flip(0)[:2].tolist(), abs=1e-9
    )


@pytest.mark.parametrize(
    ("start", "words"),
    [
        (torch.ones(9, dtype=torch.float64), "of the operator's 10 values, got (9,)"),
        (torch.ones(10, 1, dtype=torch.float64), "got (10, 1)"),
        ([1.0] * 10, "got list"),
        (torch.zeros(10, dtype=torch.float64), "the start vector is zero"),
        (torch.full((10,), math.nan, dtype=torch.float64), "NaN or Inf"),
        (torch.tensor([math.inf] + [1.0] * 9, dtype=torch.float64), "NaN or Inf"),
        (torch.ones(10, dtype=torch.complex128), "must hold real numbers"),
        (torch.ones(10, dtype=torch.bool), "must hold real numbers"),
    ],
)
def test_a_bad_start_vector_is_refused(start: object, words: str) -> None:
    matrix = spectrum_matrix(torch.linspace(0.0, 1.0, 10))
    with pytest.raises(InputError) as caught:
        lanczos(matrix, start=start)  # type: ignore[arg-type]
    assert caught.value.what == "start" and words in str(caught.value)


def test_power_iteration_refuses_a_start_vector() -> None:
    matrix = spectrum_matrix(torch.linspace(0.0, 1.0, 10))
    with pytest.raises(InputError, match="Lanczos only"):
        eigenvalues(matrix, method="power", start=torch.ones(10, dtype=torch.float64))


def test_sample_rows_draws_the_share_asked_for() -> None:
    for n, fraction, count in ((50, 0.25, 13), (50, 0.5, 25), (50, 0.001, 1), (1, 0.5, 1)):
        rows = sample_rows(n, fraction, seed=7)
        assert rows.numel() == count == max(1, math.ceil(fraction * n))
        assert torch.equal(rows, rows.unique())  # ascending, no repeat
        assert int(rows.min()) >= 0 and int(rows.max()) < n
    assert torch.equal(sample_rows(50, 0.25, 7), sample_rows(50, 0.25, 7))
    assert not torch.equal(sample_rows(50, 0.25, 7), sample_rows(50, 0.25, 8))


def test_sample_batches_keeps_each_batch_s_chosen_rows() -> None:
    """Rows 0, 19, 20, 45 of batches of 20, 20 and 10: one row from each end of the first
    batch's border, one from the last; hand-worked."""
    x = torch.arange(50, dtype=torch.float64).reshape(50, 1)
    y = torch.arange(50) % 3
    kept = sample_batches(split(x, y, BATCH), torch.tensor([0, 19, 20, 45]))
    assert [b[0].flatten().tolist() for b in kept] == [[0.0, 19.0], [20.0], [45.0]]
    assert [b[1].tolist() for b in kept] == [[0, 1], [2], [0]]


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1.5, math.nan, math.inf, True, "0.5"])
def test_a_bad_fraction_is_refused(fraction: object) -> None:
    with pytest.raises(InputError) as caught:
        check_fraction(fraction)
    assert caught.value.what == "warm_start" and "strictly between 0 and 1" in str(caught.value)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 2.0, math.nan])
def test_the_setting_refuses_a_fraction_outside_0_1(fraction: float) -> None:
    with pytest.raises(SettingsError) as caught:
        HessianSettings(warm_start=fraction)
    assert "warm" in str(caught.value)


def test_the_setting_refuses_power_iteration() -> None:
    with pytest.raises(SettingsError, match="starts Lanczos only"):
        HessianSettings(warm_start=0.25, method="power")


@pytest.mark.parametrize("fraction", [0.3, 0.05, 0.001])
def test_warm_started_lambda_max_is_the_dense_one(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor], fraction: float
) -> None:
    """Warm stages over 15, 3 (fewer than one batch) and 1 of the 50 samples: the full run
    from their vector meets the dense top eigenvalue; the stage's own operator counts its
    samples and products apart from the full one's."""
    model, x, y, hessian = mlp_case
    exact, _top_vector = _top(hessian)
    operator = HessianOperator(model, split(x, y, BATCH))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a 1-sample stage may stop short
        warm = warm_start(operator, fraction, seed=5)
    assert warm.n_samples == max(1, math.ceil(fraction * 50))
    assert warm.spectrum.matvecs >= 2 and operator.total_matvecs == 0
    assert float(warm.vector.norm()) == pytest.approx(1.0, abs=1e-12)
    spectrum = eigenvalues(operator, tol=1e-8, start=warm.vector)
    assert spectrum.converged
    assert spectrum.values[0].value == pytest.approx(exact, abs=1e-8)
    assert warm.as_dict()["n_matvecs"] == warm.spectrum.matvecs
    assert warm.as_dict()["fraction"] == fraction


def test_the_warm_stage_s_value_is_the_dense_one_of_its_sample(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    """The stage multiplies by the Hessian over exactly the rows drawn: its λmax is the dense
    top eigenvalue of that sample's Hessian (to its tol)."""
    model, x, y, _hessian = mlp_case
    rows = sample_rows(50, 0.4, seed=9)
    sample_exact, _ = _top(dense_hessian(model, x[rows], y[rows]))
    warm = warm_start(HessianOperator(model, split(x, y, BATCH)), 0.4, seed=9, tol=1e-9)
    assert warm.spectrum.values[0].value == pytest.approx(sample_exact, abs=1e-8)


def test_the_warm_start_is_deterministic_for_a_seed(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, _hessian = mlp_case
    first = warm_start(HessianOperator(model, split(x, y, BATCH)), 0.3, seed=2)
    again = warm_start(HessianOperator(model, split(x, y, BATCH)), 0.3, seed=2)
    other = warm_start(HessianOperator(model, split(x, y, BATCH)), 0.3, seed=3)
    assert torch.equal(first.vector, again.vector)
    assert first.spectrum.matvecs == again.spectrum.matvecs
    assert not torch.equal(first.vector, other.vector)


def test_the_analysis_records_the_warm_stage_apart(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    exact = torch.linalg.eigvalsh(hessian).flip(0)[:2].tolist()
    settings = HessianSettings(top_k=2, tol=1e-8, trace=False, warm_start=0.5, seed=4)
    analysis = analyse_batches(model, split(x, y, BATCH), settings)
    assert analysis.spectrum.eigenvalues == pytest.approx(exact, abs=1e-8)
    record = analysis.operator["warm_start"]
    assert record["fraction"] == 0.5 and record["n_samples"] == 25
    assert record["n_matvecs"] >= 2
    # the full operator's count holds its own products only
    assert analysis.operator["n_matvecs"] == analysis.spectrum.matvecs
    assert "warm_start" in analysis.timings
    plain = analyse_batches(model, split(x, y, BATCH), HessianSettings(top_k=2, trace=False))
    assert "warm_start" not in plain.operator


def test_a_stop_in_the_warm_stage_keeps_nothing(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    """Stopped during the warm stage, no value of the full data is known: the stop carries
    nothing (not the sample's spectrum)."""
    model, x, y, _hessian = mlp_case
    stages: list[str] = []

    def on_step(stage: str, _products: int) -> None:
        stages.append(stage)
        if stage == "warm start" and stages.count(stage) == 3:
            raise Stopped(stage=stage)

    settings = HessianSettings(trace=False, warm_start=0.5)
    with pytest.raises(Stopped) as caught:
        analyse_batches(model, split(x, y, BATCH), settings, on_step=on_step)
    assert caught.value.finished is None and caught.value.stage == "warm start"
    assert "eigenvalues" not in stages


def test_the_api_takes_a_start_vector(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    import curvcal

    model, x, y, hessian = mlp_case
    exact, top = _top(hessian)
    operator = curvcal.hessian_operator(model, split(x, y, BATCH))
    near = curvcal.hessian_eigenvalues(operator, tol=1e-8, start=top + 1e-3)
    assert near.values[0].value == pytest.approx(exact, abs=1e-8)
    with pytest.raises(InputError, match="start"):
        curvcal.hessian_eigenvalues(operator, start=torch.zeros(3, dtype=torch.float64))


def test_a_sharded_model_is_refused_in_one_line(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check reads the model the way build_operator does (a model sharded with fully_shard
    is stood in for: its sample operator would need sliced vectors)."""
    import curvcal.sharding

    model, x, y, _hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH))
    monkeypatch.setattr(curvcal.sharding, "is_sharded", lambda module: module is model)
    with pytest.raises(InputError) as caught:
        warm_start(operator, 0.5)
    assert str(caught.value) == (
        "warm_start: is not available for a model sharded with fully_shard (leave warm_start out)"
    )
