"""Smoke test of benchmarks/bench_hessian.py: curvcal's part on a tiny model, peers skipped.

The peers (PyHessian, hessian-eigenthings, curvlinops) are not installed in the test
environment; the benchmark must import them lazily and say "not installed" instead of failing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_hessian")


def _rows(report: dict, task: str, library: str) -> list[dict]:
    (case,) = report["cases"]
    return [r for r in case["rows"] if r["task"] == task and r["library"] == library]


def test_curvcal_only_run_on_tiny_model(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    report = bench.main(
        ["--cases", "tiny", "--no-peers", "--no-memory", "--repeats", "1", "--json", str(out)]
    )
    (case,) = report["cases"]
    assert case["n_params"] == 6 * 5 + 5 + 5 * 3 + 3
    assert case["n_samples"] == 60
    # curvcal against the dense float64 Hessian: float32 runs to float32 accuracy, float64 to ~1e-12
    lambdas = {r["setting"]: r for r in _rows(report, "lambda_max", "curvcal")}
    assert all(r["rel_error"] < 1e-4 for r in lambdas.values())
    assert lambdas["Lanczos, tol 1e-6, float64"]["rel_error"] < 1e-10
    # float32 products, float64 basis: the 1e-6 residual is met and reported
    assert lambdas["Lanczos, tol 1e-6"]["residual"] <= 1e-6
    assert "stopped by tol" in lambdas["Lanczos, tol 1e-6"]["note"]
    # XTrace's sketch holds the range of this rank-deficient Hessian (rank < 50 probes): AQ then
    # costs one product per basis vector, fewer than 50; Hutch++ spends what it saves on probes
    # auto on this tanh MLP: the Gauss–Newton part exact (2 norms per sample, 3 classes), Hutch++
    # on the rest with the 98 products left
    for row in _rows(report, "trace", "curvcal"):
        assert 0.0 <= row["rel_error"] < 0.2
        if row["setting"].startswith("XTrace"):
            assert 50 < row["hvps"] < 100
        elif row["setting"].startswith("auto"):
            assert row["hvps"] == 98 and "Gauss–Newton part exact" in row["note"]
        else:
            assert row["hvps"] == 100
    # peers appear, marked as skipped, and produce no numbers
    for library in ("pyhessian", "eigenthings", "curvlinops"):
        rows = _rows(report, "lambda_max", library)
        assert rows and all(r["note"] == "skipped (--no-peers)" for r in rows)
        assert all(math.isnan(r["value"]) for r in rows)
    # strict JSON (NaN written as null) and a markdown table on stdout
    written = json.loads(out.read_text(), parse_constant=pytest.fail)
    assert written["cases"][0]["rows"][0]["library"] == "curvcal"
    assert "| curvcal | Lanczos, tol 1e-4 (default) |" in capsys.readouterr().out


def test_missing_peer_is_reported_not_raised(bench: ModuleType, monkeypatch) -> None:
    monkeypatch.setitem(bench.PEERS, "pyhessian", ("no_such_module_curvcal_test", "PyHessian"))
    assert not bench.peer_available("no_such_module_curvcal_test")
    case = bench.build_case("tiny", quick=True, truth=False)
    runs = [r for r in bench.plan("tiny") if r.task == "lambda_max"]
    runs = [r for r in runs if r.library == "curvcal"][:2] + [
        r for r in runs if r.library == "pyhessian"
    ]
    rows = bench.measure(case, runs, 1, True, lambda message: None)
    assert [r.library for r in rows[:3]] == ["curvcal", "curvcal", "pyhessian"]
    assert all(r.note == "not installed" and math.isnan(r.seconds) for r in rows[2:])
    assert all(math.isfinite(r.value) for r in rows[:2])


def test_dense_reference_matches_softmax_regression_formula(bench: ModuleType) -> None:
    """Linear softmax model z = W x: H = (1/N) Σ_i (diag(p_i) − p_i p_iᵀ) ⊗ x_i x_iᵀ."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(13, 4, generator=generator)
    y = torch.randint(0, 3, (13,), generator=generator)
    model = nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 4, generator=generator))
    values, trace = bench.dense_reference(model, [(x[:5], y[:5]), (x[5:], y[5:])])
    xs = x.double()
    probs = torch.softmax(xs @ model.weight.detach().double().t(), dim=1)
    hessian = (
        sum(
            torch.kron(torch.diag(p) - torch.outer(p, p), torch.outer(xi, xi))
            for p, xi in zip(probs, xs, strict=True)
        )
        / 13
    )
    assert torch.allclose(values, torch.linalg.eigvalsh(hessian), atol=1e-12)
    assert trace == pytest.approx(float(torch.trace(hessian)), rel=1e-12)


def test_bad_repeats_is_a_usage_error(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.parse(["--repeats", "0"])
