"""`torchrun --nproc-per-node 2 -m curvcal hessian|calibrate` on a text classifier folder (gloo,
CPU): each rank tokenizes the texts, takes its shard of them padded per batch, and the sharded
run gives the numbers of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from .launch import torchrun_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["good", "bad", "film", "very", "plot", "not"]
TEXTS = ["good film", "bad plot", "very good film", "not good", "very very bad", "plot", "film"] * 3


def _folder(path: Path) -> None:
    torch.manual_seed(4)
    config = transformers.BertConfig(
        vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 2.0)
    model.save_pretrained(path)
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(path)


@pytest.mark.slow
def test_two_processes_match_one_on_texts(run_cli, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    _folder(folder)
    data = tmp_path / "texts.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS))
    )
    common = ["--data", str(data), "--dtype", "float64", "--device", "cpu", "--batch-size", "4"]
    hessian = ["hessian", str(folder), *common, "--no-trace", "--tol", "1e-8"]
    distributed = torchrun_json(hessian, tmp_path)
    single = run_cli(*hessian, "--json")
    assert single.code == 0, single.stderr
    assert distributed["results"]["operator"]["n_samples"] == len(TEXTS)
    assert distributed["results"]["lambda_max"] == pytest.approx(
        json.loads(single.stdout)["results"]["lambda_max"], rel=1e-6
    )
    calibrate = ["calibrate", str(folder), *common, "--method", "none"]
    distributed = torchrun_json(calibrate, tmp_path)
    single = run_cli(*calibrate, "--json")
    assert single.code == 0, single.stderr
    got = distributed["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece"):
        assert got[metric] == pytest.approx(expected[metric], abs=1e-12)
