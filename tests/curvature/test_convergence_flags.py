"""Flags that say what was checked: an eigenvalue reads "converged yes" only when its measured
residual met the tol asked for; a value that met only a raised tolerance (the precision floor,
the products' noise bound) or none says why; an exact trace has no ± and no 95% interval; a
float64 run is never advised to compute in float64; the tables say when λmax exceeds the
trace (negative eigenvalues)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from curvcal.curvature.eigen import _limit, lanczos
from curvcal.curvature.results import (
    EigenResult,
    HessianAnalysis,
    TraceResult,
    convergence_text,
    eigen_status,
)
from curvcal.report.hessian import hessian_tables, trace_below_lambda_max
from tests.curvature.test_product_error import _operator


def test_a_value_met_only_by_the_noise_bound_is_not_called_yes() -> None:
    """Products good to b = 1.6e-5 (the float32 five-point floor): λ3's measured residual
    exceeds tol = 3e-5 and the rule accepted it at the noise bound; the flag says so, and only
    values whose residual is ≤ tol read "yes"."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spectrum = lanczos(_operator(1.6e-5), 3, tol=3e-5, seed=3)
    assert spectrum.converged
    above = [r for r in spectrum.values if r.residual > spectrum.tol]
    assert above  # the case occurs
    for result in spectrum.values:
        text = convergence_text(result, spectrum.precision_floor)
        if result.residual <= spectrum.tol and result.relative_change <= spectrum.tol:
            assert result.status == "tol" and text == "yes"
        else:
            assert result.status == "noise" and text == "at the products' noise bound"


def test_a_value_met_at_the_precision_floor_says_so() -> None:
    """An operator stating a precision floor of 1e-3 (as a half-precision model does) and
    noisy products: the values stop above tol = 1e-6, below the floor; the flag reads
    "stopped at the bfloat16 floor (0.001)", not "yes"."""
    operator = _operator(1.6e-5)
    operator.product_error = 0.0
    operator.precision_floor = 1e-3  # type: ignore[attr-defined]
    spectrum = lanczos(operator, 2, tol=1e-6, seed=3)
    assert spectrum.converged and spectrum.precision_floor == 1e-3
    for result in spectrum.values:
        assert result.residual > 1e-6 and result.status == "floor"
        assert convergence_text(result, 1e-3, "bfloat16") == "stopped at the bfloat16 floor (0.001)"


@pytest.mark.parametrize(
    ("residual", "change", "converged", "stopped_by", "status", "text"),
    [
        (1e-9, 1e-9, True, "tol", "tol", "yes"),
        # the LoRA case: a residual of 2.9e-8 at tol 1e-8 is not "yes", whatever accepted it
        (2.9e-8, 1e-12, True, "tol", "noise", "at the products' noise bound"),
        (2.9e-8, 1e-12, False, "max_matvecs", "max_matvecs", "NO (budget spent)"),
        (2.9e-8, 1e-12, False, "max_iter", "max_iter", "NO (budget spent)"),
        (2.9e-8, 1e-12, False, "precision", "precision", "NO (precision floor)"),
        (1e-9, 1e-7, False, "exhausted", "exhausted", "NO (basis exhausted)"),
    ],
)
def test_status_words(
    residual: float, change: float, converged: bool, stopped_by: str, status: str, text: str
) -> None:
    got = eigen_status(residual, change, converged, 1e-8, 0.0, stopped_by)
    assert got == status
    result = EigenResult(1.0, 3, 3, residual, change, converged, got)
    assert convergence_text(result, 0.0) == text


def test_float64_run_is_not_advised_to_compute_in_float64() -> None:
    assert "compute in float64" not in _limit("precision", 10, None, torch.float64)
    assert "compute in float64" in _limit("precision", 10, None, torch.float32)


def _analysis(trace: TraceResult, values: tuple[EigenResult, ...], floor: float) -> HessianAnalysis:
    from curvcal.curvature.results import EigenSpectrum

    spectrum = EigenSpectrum(values, "lanczos", "largest", 1e-8, 10, True, precision_floor=floor)
    operator = {
        "loss": "ce", "gamma": 0.0, "mean_loss": 0.5, "mode": "eval", "engine": "autograd",
        "n_samples": 10, "n_params": 20, "n_matvecs": 10, "n_data_passes": 3,
        "model_dtype": "bfloat16" if floor else "float32",
    }  # fmt: skip
    return HessianAnalysis(
        values[0].value, None, spectrum, None, trace, None, None, operator, {"setup": 0.0}
    )


EXACT = TraceResult(
    estimate=32.15, standard_error=0.0, ci95=(32.146, 32.154), n_probes=9, matvecs=0,
    method="gauss-newton", distribution="none", seed=0, rtol=None, stopped_by="exact",
    converged=True, interval="exact up to rounding",
)  # fmt: skip


def test_hessian_tables_say_why_and_print_no_interval_for_an_exact_trace() -> None:
    values = (
        EigenResult(40.9, 12, 15, 2.9e-8, 1e-12, True, "noise"),
        EigenResult(20.1, 12, 15, 1e-9, 1e-12, True, "tol"),
    )
    eigen, trace_table, *_ = hessian_tables(_analysis(EXACT, values, 0.0), "cpu")
    assert [row[-1] for row in eigen.rows] == ["at the products' noise bound", "yes"]
    (row,) = trace_table.rows
    assert row[0] == "32.15 (exact)" and "±" not in row[0]
    assert row[1].startswith("rounding [")
    assert "no 95% interval" in trace_table.caption
    # the trace (32.15) is below λmax (40.9): negative eigenvalues, said in the caption
    assert "exceeds the trace" in trace_table.caption and "negative" in trace_table.caption


def test_hessian_table_names_the_half_precision_floor() -> None:
    values = (EigenResult(40.6, 12, 15, 0.013, 1e-3, True, "floor"),)
    sampled = dataclasses.replace(EXACT, method="hutchpp", standard_error=0.1, estimate=50.0)
    eigen, trace_table, *_ = hessian_tables(_analysis(sampled, values, 0.03125), "cpu")
    assert eigen.rows[0][-1] == "stopped at the bfloat16 floor (0.031)"
    assert "±" in trace_table.rows[0][0] and "exceeds" not in trace_table.caption


def test_lambda_max_above_the_trace_note() -> None:
    assert trace_below_lambda_max(10.0, 12.0) == ""
    note = trace_below_lambda_max(1152.0, 69.0, -1100.0)
    assert "λmax 1152 exceeds the trace 69" in note and "λmin -1100" in note


def test_study_table_says_why_and_when_lambda_max_exceeds_the_trace() -> None:
    from curvcal.report.study import study_tables
    from curvcal.study.summary import StudyResult
    from tests.test_plot_paper import _row

    rows = [_row(f"run_{i}.safetensors", None, lam, 0.05) for i, lam in enumerate([1.0, 2.0])]
    low = dataclasses.replace(
        rows[1].curvature,  # type: ignore[attr-defined]
        trace=1.5,
        lambda_max_convergence="stopped at the bfloat16 floor (0.031)",
    )
    rows[1] = dataclasses.replace(rows[1], curvature=low)  # type: ignore[type-var]
    table = study_tables(StudyResult(tuple(rows), (), {}))[0]  # type: ignore[arg-type]
    assert table.rows[0][3] == "1" and "stopped at the bfloat16 floor" in table.rows[1][3]
    assert "run_1.safetensors: λmax 2 exceeds the trace 1.5" in table.caption
    assert "run_0.safetensors" not in table.caption
