"""The run-time forecast: products planned, the advice, the hook that times the first products."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal.curvature import forecast
from curvcal.curvature.analysis import HessianSettings
from curvcal.curvature.forecast import forecast_hook, planned_products, slow_run_advice


def test_products_planned_by_hand() -> None:
    # Lanczos for λ1: 10 + 3 steps and 1 residual check; 100 trace probes
    assert planned_products(HessianSettings(), 10**6) == 14 + 100
    assert planned_products(HessianSettings(top_k=3, trace=False), 10**6) == 19 + 3
    # the step budget caps Lanczos: min(13, 5) + 1
    assert planned_products(HessianSettings(max_iter=5, probes=4), 10**6) == 6 + 4
    # a Hessian of 6 rows has at most 6 Lanczos steps
    assert planned_products(HessianSettings(trace=False), 6) == 6 + 1
    assert planned_products(HessianSettings(method="power", top_k=2, trace=False), 10**6) == 40
    assert planned_products(HessianSettings(method="power", max_iter=7, trace=False), 10**6) == 7
    settings = HessianSettings(
        smallest=True, density=True, density_runs=2, density_steps=30, per_layer=True, probes=10
    )
    # λ1 14, λmin 14, trace 10, density 60, 3 blocks × (20 + 10)
    assert planned_products(settings, 10**6, n_blocks=3) == 14 + 14 + 10 + 60 + 90


def test_advice_only_above_the_threshold_and_naming_the_options() -> None:
    assert slow_run_advice(0.5, 120) is None  # 60 s exactly: not above
    assert slow_run_advice(0.1, 10, threshold=0.5) is not None
    advice = slow_run_advice(5.0, 114)
    assert advice is not None
    assert "about 10 min" in advice and "114 Hessian-vector products of 5 s each" in advice
    for option in ("--params", "--max-samples", "--tol", "--probes", "GPU"):
        assert option in advice
    assert "about 2.8 h" in (slow_run_advice(100.0, 100) or "")
    assert "about 90 s" in (slow_run_advice(1.0, 90) or "")


def test_hook_times_the_first_five_products_and_speaks_once() -> None:
    times = iter([100.0, 110.0, 130.0, 131.0, 500.0])
    notes: list[str] = []
    hook = forecast_hook(50, notes.append, clock=lambda: next(times))
    hook("eigenvalues", 1)  # t = 100 (after setup and the first product: not used)
    hook("eigenvalues", 3)  # t = 110: fewer than 5 products, no forecast yet
    assert notes == []
    hook("eigenvalues", 5)  # t = 130: 4 products in 30 s → 7.5 s each, 50 planned → 375 s
    assert len(notes) == 1 and "about 6 min" in notes[0] and "of 7.5 s each" in notes[0]
    hook("trace", 12)
    hook("trace", 20)
    assert len(notes) == 1


def test_hook_reads_a_plan_that_changed_before_it_spoke() -> None:
    times = iter([0.0, 40.0])
    notes: list[str] = []
    planned = [100]
    hook = forecast_hook(lambda: planned[0], notes.append, clock=lambda: next(times))
    hook("eigenvalues", 1)
    planned[0] = 20  # the run took the Gauss–Newton trace: no trace products
    hook("eigenvalues", 5)  # 10 s a product × 20 = 200 s
    assert len(notes) == 1 and "about 20 Hessian-vector products" in notes[0]
    assert planned_products(HessianSettings(trace_method="gauss-newton"), 10**6) == 14


def test_hook_stays_silent_for_a_fast_run_and_ignores_repeated_counts() -> None:
    times = iter([0.0, 0.5, 2.0])
    notes: list[str] = []
    hook = forecast_hook(100, notes.append, clock=lambda: next(times))
    hook("eigenvalues", 1)
    hook("eigenvalues", 1)  # no new product: no rate yet
    hook("eigenvalues", 5)  # 4 products in 2 s: 100 × 0.5 s = 50 s ≤ 60 s
    assert notes == []


def test_the_command_prints_the_note_once_on_stderr(
    run_cli, digits_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, data = digits_files
    monkeypatch.setattr(forecast, "SLOW_RUN_SECONDS", 0.0)
    args = [
        "hessian",
        str(checkpoint),
        "--data",
        str(data),
        "--device",
        "cpu",
        "--probes",
        "4",
        "--json",
    ]
    result = run_cli(*args)
    assert result.code == 0, result.stderr
    assert result.stderr.count("curvcal: note: this run will take about") == 1
    assert "--max-samples" in result.stderr
    # --probes 4 is already small: the note does not suggest a rougher trace
    assert "--probes 20" not in result.stderr
    json.loads(result.stdout)  # stdout holds the JSON alone
    quiet = run_cli(*args, "--quiet")
    assert quiet.code == 0 and "note" not in quiet.stderr


def test_advice_names_the_stages_that_cost_and_not_options_already_given() -> None:
    from curvcal.curvature.forecast import planned_by_stage

    settings = HessianSettings(
        per_layer=True, density=True, density_runs=5, density_steps=40, probes=100, params=("fc*",)
    )
    plan = planned_by_stage(settings, 10**6, n_blocks=3)
    # λ1 14, trace 100, density 5 × 40, 3 blocks × (20 + 100)
    assert plan == {"eigenvalues": 14, "trace": 100, "density": 200, "layers": 360}
    advice = slow_run_advice(
        1.0, plan, settings=settings, given=frozenset({"--max-samples"}), device="cuda"
    )
    assert advice is not None
    # the costly stage is named first, with its count; the options given are not repeated
    assert advice.index("--per-layer costs 360 products") < advice.index("--density costs 200")
    assert "--params 'PATTERN'" not in advice and "--max-samples N" not in advice
    assert "--device cuda" not in advice
    # λ1 alone on the default settings: only the general hints
    plain = slow_run_advice(10.0, planned_by_stage(HessianSettings(trace=False), 10**6))
    assert plain is not None and "--per-layer" not in plain and "--density" not in plain
    assert "--params 'PATTERN'" in plain and "--max-samples N" in plain
