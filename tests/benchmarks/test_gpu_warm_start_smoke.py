"""Smoke test of the GPU run's ``vit_warm_start`` part on the CPU: a tiny ViT to the smoke
tolerance from the warm start and from a random start, both in full-product units."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("timm")


def test_warm_start_part_runs_both_starts(
    tmp_path: Path, smoke_part: Callable[[str, Path], tuple[dict[str, Any], str]]
) -> None:
    part, table = smoke_part("vit_warm_start", tmp_path)
    warm, plain = part["records"]
    assert warm["start"] == "warm" and plain["start"] == "random"
    assert warm["fraction"] == 0.25 and warm["warm_samples"] == 2  # ⌈0.25 · 8⌉
    assert warm["warm_products"] >= 2 and plain["warm_products"] == 0
    # the warm stage's products count at its share of the data
    assert warm["units"] == pytest.approx(warm["products"] + 0.25 * warm["warm_products"])
    assert plain["units"] == plain["products"] >= 2
    assert math.isfinite(warm["lambda_max"]) and math.isfinite(plain["lambda_max"])
    assert warm["warm_s"] > 0 and plain["warm_s"] == 0
    assert "## Warm start (λmax)" in table
    assert "| vit_b_16 | 0.001 | warm |" in table and "(2 = 0.25 of the data)" in table
