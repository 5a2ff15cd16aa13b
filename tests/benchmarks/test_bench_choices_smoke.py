"""Smoke test of benchmarks/bench_choices.py on a tiny Llama: its packed scores against the
per-answer baseline it times (the library's own forward, every position's full logits), its
widest vocabulary tensors, and the printed table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("transformers")

TINY = [
    "--hidden=16", "--layers=2", "--intermediate=32", "--heads=2", "--kv-heads=1",
    "--vocab=40", "--rows=3", "--choices=3", "--answer-tokens=2",
]  # fmt: skip


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_choices")


def test_packed_scores_equal_the_per_answer_baseline(bench: ModuleType) -> None:
    shape = bench.Shape(hidden=16, layers=2, intermediate=32, heads=2, kv_heads=1, vocab=40)
    rows = bench.Rows(rows=3, choices=3, answer_tokens=2, prompt=5)
    scorer = bench.build_scorer(shape).double()
    data, labels = bench.choice_rows(shape, rows)
    batch = list(zip(data, labels.tolist(), strict=True))
    x, _y = bench.ChoiceDataset(data, labels, 0).collate(batch)
    with torch.no_grad():
        packed, baseline = scorer(x), bench.per_answer_scores(scorer, data)
    assert packed.shape == (3, 3)
    torch.testing.assert_close(packed, baseline, rtol=0, atol=1e-10)


def test_the_table_and_the_json(bench: ModuleType, tmp_path: Path, capsys) -> None:
    out = tmp_path / "choices.json"
    bench.main([*TINY, "--prompts=4,12", "--repeats=1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("\n| ") == 2 and "| 12 |" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [row["prompt_tokens"] for row in rows] == [4, 12]
    for row in rows:
        assert row["max_score_difference"] < 1e-4
        # the packed pass's widest vocabulary tensor is rows x (answer tokens) x V in float32;
        # the baseline's holds every position of every (row, answer) sequence
        assert row["packed_vocab_tensor_mib"] * 2**20 == 3 * 3 * 2 * 40 * 4
        tokens = row["prompt_tokens"] + 2
        assert row["per_answer_vocab_tensor_mib"] * 2**20 == 3 * 3 * tokens * 40 * 4
