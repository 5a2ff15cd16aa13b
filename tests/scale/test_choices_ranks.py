"""A causal language model scored over answers under torchrun (two gloo ranks on the CPU): the
rows sharded over replicated ranks, and the model sharded per decoder layer, each against the
one-process run on the same rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .launch import torchrun_json

pytest.importorskip("transformers")
pytest.importorskip("peft")
# the builders shared with tests/load, which imports its own helpers by their bare names
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load"))
from choice_builders import save_causal_lm, save_causal_lora, write_questions


@pytest.mark.slow  # two launches of two ranks each, about 30 s
def test_two_ranks_agree_with_one_process(run_cli, tmp_path: Path) -> None:
    save_causal_lm(tmp_path / "base", "llama")
    save_causal_lora(tmp_path / "base", tmp_path / "adapter")
    data = write_questions(tmp_path / "q.jsonl")
    common = ["--data", str(data), "--top-k", "1", "--no-trace", "--tol", "1e-10"]
    for model, alone_extra, ranks_extra, rel in (
        ("adapter", ["--dtype", "float64"], ["--dtype", "float64"], 1e-9),
        ("base", [], ["--shard-model", "blocks"], 1e-4),  # central differences in float32
    ):
        alone = run_cli("hessian", tmp_path / model, *common, *alone_extra, "--json")
        assert alone.code == 0, alone.stderr
        expected = json.loads(alone.stdout)["results"]["eigenvalues"][0]
        ranks = torchrun_json(["hessian", str(tmp_path / model), *common, *ranks_extra], tmp_path)
        assert ranks["results"]["operator"]["world_size"] == 2
        assert ranks["results"]["eigenvalues"][0] == pytest.approx(expected, rel=rel)
