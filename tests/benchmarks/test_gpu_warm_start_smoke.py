"""Smoke test of the GPU run's ``vit_warm_start`` part on the CPU: a tiny ViT to the smoke
tolerance from the warm start and from a random start, both in full-product units."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[2]


def test_warm_start_part_runs_both_starts(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_run_warm", ROOT / "benchmarks/gpu/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_run_warm"] = module
    spec.loader.exec_module(module)
    module.main(["--smoke", "--device", "cpu", "--parts", "vit_warm_start",
                 "--part-budget", "600", "--results-dir", str(tmp_path)])  # fmt: skip
    written = json.loads((tmp_path / "gpu-run-smoke.json").read_text())
    (part,) = written["parts"]
    assert part["status"] == "ok", part
    warm, plain = part["records"]
    assert warm["start"] == "warm" and plain["start"] == "random"
    assert warm["fraction"] == 0.25 and warm["warm_samples"] == 2  # ⌈0.25 · 8⌉
    assert warm["warm_products"] >= 2 and plain["warm_products"] == 0
    # the warm stage's products count at its share of the data
    assert warm["units"] == pytest.approx(warm["products"] + 0.25 * warm["warm_products"])
    assert plain["units"] == plain["products"] >= 2
    assert math.isfinite(warm["lambda_max"]) and math.isfinite(plain["lambda_max"])
    assert warm["warm_s"] > 0 and plain["warm_s"] == 0
    table = (tmp_path / "gpu-run-smoke.md").read_text()
    assert "## Warm start (λmax)" in table
    assert "| vit_b_16 | 0.001 | warm |" in table and "(2 = 0.25 of the data)" in table
