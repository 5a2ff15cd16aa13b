"""Smoke test of benchmarks/gpu/run.py: tiny sizes on the CPU, the CUDA tests skipped, results
written with the fields the GPU table is made of."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest


def test_smoke_run_writes_results_and_table(gpu_run: ModuleType, tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    # --smoke gives each part 60 s, which a loaded machine can take: budgets no load reaches
    argv = ["--smoke", "--device", "cpu", "--parts",
            "cuda-tests,bert_base,calibration,maps-device",
            "--part-budget", "600", "--total-budget", "1200",
            "--results-dir", str(results), "--out", str(out)]  # fmt: skip
    report = gpu_run.main(argv)
    names = {"gpu-run-smoke.json", "gpu-run-smoke.md", "gpu-run-smoke.log"}
    assert {p.name for p in results.iterdir()} == {p.name for p in out.iterdir()} == names
    written = json.loads((out / "gpu-run-smoke.json").read_text())
    assert written["mode"] == "smoke"
    environment = written["environment"]
    assert environment["device"] == "cpu" and environment["torch"] and "cuda" in environment
    statuses = {p["part"]: p["status"] for p in written["parts"]}
    assert statuses == {
        "cuda-tests": "skipped",
        "bert_base": "ok",
        "calibration": "ok",
        "maps-device": "ok",
    }
    assert report["parts"][0]["note"].startswith("not on a CUDA device")

    bert, kernel = next(p for p in written["parts"] if p["part"] == "bert_base")["records"]
    assert bert["kind"] == "hessian" and bert["n_samples"] == 8 and bert["products"] >= 1
    assert math.isfinite(bert["lambda_max"]) and bert["gradient_s"] > 0
    assert bert["seconds_per_product"] > 0 and bert["product_ratio"] > 0
    assert bert["peak_ratio"] is None  # peak memory is measured on CUDA only
    # the kernel beside the run's cost per product, and the plan the run made
    assert kernel["kind"] == "hessian-kernel" and kernel["model"] == "bert_base"
    assert kernel["kernel_s"] > 0 and kernel["kernel_per_gradient"] > 0
    assert kernel["run_per_kernel"] == pytest.approx(
        bert["seconds_per_product"] / kernel["kernel_s"]
    )
    assert bert["memory_plan"]["budget_source"].startswith("default: 50% of the")
    assert bert["memory_plan"]["graphs"] in {"kept", "partly kept", "rebuilt"}
    # the product is timed through the command line's own result
    assert bert["eigen_s"] == bert["timings"]["eigenvalues"]

    calibration = next(p for p in written["parts"] if p["part"] == "calibration")["records"]
    assert [r.get("stage") for r in calibration] == ["metrics", "ts", None]
    final = calibration[-1]
    assert (final["n"], final["k"]) == (500, 5)
    assert final["temperature"] > 0 and final["focal_temperature"] > 0 and final["focal_s"] > 0

    # the maps on the device (the CPU here) fit the same draw to the CPU part's T and γ
    on_device = next(p for p in written["parts"] if p["part"] == "maps-device")["records"]
    assert [r.get("stage") for r in on_device] == ["metrics", "ts", None]
    device_row = on_device[-1]
    assert (device_row["n"], device_row["k"], device_row["device"]) == (500, 5, "cpu")
    assert device_row["ece"] == pytest.approx(final["ece"], abs=1e-12)
    assert device_row["temperature"] == pytest.approx(final["temperature"], abs=1e-9)
    assert device_row["focal_gamma"] == final["focal_gamma"]
    assert device_row["focal_temperature"] == pytest.approx(final["focal_temperature"], abs=1e-9)
    assert device_row["apply_s"] > 0 and "peak_gib" not in device_row  # peak: CUDA only

    table = (out / "gpu-run-smoke.md").read_text()
    assert "| bert_base | 26,786 | 8 (4) |" in table
    assert "| 500 × 5 |" in table
    assert "| 500 × 5 | cpu |" in table  # the maps-on-device row


def test_parts_left_without_budget_are_skipped_with_a_note(
    gpu_run: ModuleType, tmp_path: Path
) -> None:
    argv = ["--smoke", "--device", "cpu", "--parts", "resnet18,vit_b_16", "--total-budget", "0",
            "--results-dir", str(tmp_path)]  # fmt: skip
    report = gpu_run.main(argv)
    assert [(p["part"], p["status"]) for p in report["parts"]] == [
        ("resnet18", "skipped"),
        ("vit_b_16", "skipped"),
    ]
    assert all(p["note"].startswith("total budget spent") for p in report["parts"])
    table = (tmp_path / "gpu-run-smoke.md").read_text()
    assert "| resnet18 | skipped | — | total budget spent" in table


def test_unknown_part_is_a_usage_error(gpu_run: ModuleType) -> None:
    with pytest.raises(SystemExit):
        gpu_run.parse(["--parts", "resnet18,gpt"])
