"""Smoke test of the GPU run's ``vit_block_lanczos`` part on the CPU: the per-vector cost of a
block of b vectors for b = 1, 2, 4, 8, then a tiny ViT's λmax by block Lanczos and by curvcal's
Lanczos, each in products and full-product units."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("timm")


@pytest.mark.slow  # a process that imports timm, times 39 products of a 5.7 M-parameter ViT
# and runs two Lanczos: about 25 s of CPU
def test_block_lanczos_part_times_blocks_and_runs_both(
    tmp_path: Path, smoke_part: Callable[[str, Path], tuple[dict[str, Any], str]]
) -> None:
    part, table = smoke_part("vit_block_lanczos", tmp_path)
    costs = [r for r in part["records"] if r["kind"] == "block-cost"]
    assert [r["width"] for r in costs] == [1, 2, 4, 8]
    for cost in costs:  # timed on the first batch: 4 images
        assert cost["samples"] == 4 and cost["matmat_s"] > 0 and cost["matvecs_s"] > 0
        # the whole data's graphs fit on the CPU: the costs are timed through kept graphs too
        assert cost["keep_graphs"] == "auto" and cost["graphs_kept"] is True
        assert cost["per_vector"] == pytest.approx(cost["matmat_s"] / cost["matvecs_s"])
    block, single = (r for r in part["records"] if r["kind"] == "block-lanczos")
    assert (block["strategy"], block["block"], single["strategy"]) == ("block 2", 2, "single")
    assert block["n_samples"] == single["n_samples"] == 8
    assert block["kept_rows"] == 8 and block["first_product_s"] > 0
    # b products a block step and at least one verification, within the smoke budget of 8
    assert 2 * block["block_steps"] < block["products"] <= 8
    assert block["per_vector"] == costs[1]["per_vector"]
    assert block["units"] == pytest.approx(block["products"] * block["per_vector"])
    assert single["units"] == single["products"] > single["block_steps"] >= 1
    for run in (block, single):
        assert math.isfinite(run["lambda_max"]) and run["seconds"] > 0
    assert "## Block Lanczos over probes (λmax)" in table
    assert "| vit_b_16 | 4 | 8 |" in table and "| vit_b_16 | 0.001 | block 2 |" in table
    assert "graphs kept for 8 of 8 images (c_b timed with keep_graphs=auto)" in table
