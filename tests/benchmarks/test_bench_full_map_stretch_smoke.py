"""Smoke test of benchmarks/bench_full_map_stretch.py: the Kronecker-only fit and the fit with
the per-class block preconditioner on tiny nearly interpolating logits, interleaved; both rows
complete, the switch restored, and the block fit reaches the common objective in fewer
Hessian products."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import curvcal.calibration.linear as linear


def test_quick_run_compares_the_two_preconditioners(
    load_bench: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    bench = load_bench("bench_full_map_stretch")
    switch = linear.STRETCH_PRODUCTS
    out = tmp_path / "s.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    assert switch == linear.STRETCH_PRODUCTS  # the benchmark puts the switch back
    rows = {row["preconditioner"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"kronecker", "blocks"}
    for row in rows.values():
        assert math.isfinite(row["objective"]) and row["products"] > 0
    blocks, kronecker = rows["blocks"], rows["kronecker"]
    assert blocks["to_common_products"] is not None
    assert kronecker["to_common_products"] is None or (
        blocks["to_common_products"] < kronecker["to_common_products"]
    )
    assert blocks["max_dp_between"] < 1e-4
