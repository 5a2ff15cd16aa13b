"""Smoke test of bench_hessian.py's large cases (ResNet-18, tiny ViT) at --quick size, peers off."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_hessian")


def test_vit_case_against_its_float64_lanczos_reference(bench: ModuleType, capsys) -> None:
    argv = ["--cases", "vit", "--quick", "--no-peers", "--no-memory", "--repeats", "1"]
    report = bench.main([*argv, "--tasks", "lambda_max,hvp"])
    (case,) = report["cases"]
    assert case["n_params"] == 75_082 and case["n_samples"] == 8
    assert "tol 1e-8" in case["reference"] and case["lambda_max"] >= case["lambda_2"]
    rows = {(r["library"], r["setting"]): r for r in case["rows"]}
    assert {r["task"] for r in case["rows"]} == {"lambda_max", "hvp"}
    ours = rows["curvcal", "Lanczos, tol 1e-6"]
    # float32 products against the float64 reference: float32 accuracy
    assert ours["rel_error"] < 1e-5 and ours["residual"] <= 1e-6
    assert all(
        math.isnan(r["value"]) and r["note"] == "skipped (--no-peers)"
        for (library, _), r in rows.items()
        if library in ("pyhessian", "curvlinops")
    )
    gradient = rows["reference", "gradient (autograd.grad once)"]
    assert gradient["hvps"] == 0 and gradient["seconds"] > 0
    (summary,) = report["summary"]
    assert summary.startswith("| vit | 75,082 |")
    assert "### Summary" in capsys.readouterr().out


def test_resnet_products_without_reference(bench: ModuleType) -> None:
    report = bench.main(
        ["--cases", "resnet18", "--quick", "--tasks", "hvp", "--no-memory", "--repeats", "1"]
    )
    (case,) = report["cases"]
    assert case["n_params"] == 11_181_642
    assert math.isnan(case["lambda_max"]) or case["lambda_max"] is None  # no truth asked for
    assert [r["setting"] for r in case["rows"]] == [
        "gradient (autograd.grad once)",
        "double backward (autograd.grad twice)",
        "engine auto (default), 1 vector",
    ]


def test_bad_task_and_reference_are_usage_errors(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.parse(["--tasks", "density"])
    with pytest.raises(SystemExit):
        bench.parse(["--trace-reference", "-1"])
