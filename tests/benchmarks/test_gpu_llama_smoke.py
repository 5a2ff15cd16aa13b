"""Smoke test of the GPU run's ``llama_1b`` part (benchmarks/gpu/llama_part.py) on the CPU: a
tiny Llama classifier, bfloat16 replicated and float32 sharded over a one-rank gloo group, both
with their measured seconds, passes and chunking in the table; the plan's 1B row by hand."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_llama_part_runs_both_paths(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    smoke_part: Callable[[str, Path], tuple[dict[str, Any], str]],
) -> None:
    monkeypatch.setenv("CURVCAL_LLAMA_STEPS", "bf16,bf16-auto,fp32")
    part, table = smoke_part("llama_1b", tmp_path)
    rows = {r["path"]: r for r in part["records"]}
    assert set(rows) == {"bf16 replicated", "bf16 replicated, kept graphs auto", "fp32 sharded"}
    assert rows["bf16 replicated"]["data_passes_per_product"] == 1  # one double-backward pass
    # the plan in words: half the free memory, whole micro-batches, graphs as asked
    rebuilt, kept = rows["bf16 replicated"], rows["bf16 replicated, kept graphs auto"]
    assert rebuilt["memory_plan"]["budget_source"].startswith("default: 50% of the")
    assert not rebuilt["memory_plan"]["micro_batched"] and rebuilt["plan_rows"] == 2
    assert rebuilt["memory_plan"]["graphs"] == "rebuilt"
    # the graphs built once, by the warm-up product: one pass over the two products measured
    assert kept["memory_plan"]["graphs"] == "kept" and kept["data_passes_per_product"] == 0.5
    # central differences: the first of the two products takes the start (G(θ) and the
    # rounding probe's pair, 3 passes) and Richardson's 4, the second 2 (three points) to 6
    assert 4.5 <= rows["fp32 sharded"]["data_passes_per_product"] <= 6.5
    assert all(r["product_s"] > 0 and r["gradient_s"] > 0 for r in rows.values())
    assert "| bf16 replicated | 28,256 | 4 × 8 (2) |" in table
    assert "| fp32 sharded | 28,256 |" in table


def test_plan_row_of_the_1b_model_by_hand() -> None:
    """The 1B row the part compares with: P of Llama-3.2-1B with a two-class head, and the
    bfloat16 product's seconds from the guide's assumptions (k = 3.76, 40 % of 989 TFLOP/s)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_llama import ARCHITECTURES, Device, plan_rows

    one_b = ARCHITECTURES[0]
    assert one_b.n_params == 1_235_814_400 + 2 * 2048  # Llama-3.2-1B's count, plus the score head
    (row,) = [r for r in plan_rows(Device(), 3.76, (4.0, 6.0), 64, 512, 4, (1,))
              if r["model"] == "1B" and r["path"] == "bf16 replicated"]  # fmt: skip
    d, kv, ff, layers = 2048, 512, 8192, 16
    forward = layers * (2 * (2 * d * d + 2 * d * kv + 3 * d * ff) + 4 * 512 * d) + 2 * d * 2
    seconds = 3.76 * 3 * forward * 64 * 512 / (989e12 * 0.4)
    assert row["seconds"][0] == pytest.approx(seconds, rel=1e-12)
