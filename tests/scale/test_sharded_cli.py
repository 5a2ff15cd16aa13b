"""`torchrun -m curvcal hessian|calibrate --shard-model blocks` on a text classifier (gloo, CPU):
the sharded run gives one process's figures and says its products are central differences; a
rank that fails on a sharded model stops every rank with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from .launch import torchrun_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"
WORDS = ["good", "bad", "film", "very", "plot", "not"]
TEXTS = ["good film", "bad plot", "very good film", "not good", "very very bad", "plot", "film"] * 3


def _folder(path: Path) -> None:
    """A two-layer BERT classifier (its layers: a repeated block list) and its tokenizer."""
    torch.manual_seed(4)
    config = transformers.BertConfig(
        vocab_size=11, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 2.0)
    model.save_pretrained(path)
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(path)


@pytest.mark.slow  # two torchrun launches and two one-process runs
def test_sharded_bert_matches_one_process(run_cli, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    _folder(folder)
    data = tmp_path / "texts.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS))
    )
    common = ["--data", str(data), "--dtype", "float64", "--device", "cpu", "--batch-size", "4"]
    hessian = ["hessian", str(folder), *common, "--trace-method", "hutchinson", "--probes", "4",
               "--tol", "1e-8"]  # fmt: skip
    sharded = torchrun_json([*hessian, "--shard-model", "blocks"], tmp_path)
    single = run_cli(*hessian, "--json")
    assert single.code == 0, single.stderr
    expected = json.loads(single.stdout)["results"]
    got = sharded["results"]
    assert got["operator"]["engine"] == "central-difference"
    assert got["operator"]["world_size"] == 2
    product = got["operator"]["product"]
    assert product["method"] == "central-difference" and product["stencil"] == "3-point"
    assert 0 < product["relative_error_bound"] < 1e-7
    # products good to 5e-9 here, but Lanczos stops at the precision floor the products'
    # asymmetry sets (a true residual near 7e-7 against --tol 1e-8): λmax within 1.1e-6
    assert got["lambda_max"] == pytest.approx(expected["lambda_max"], rel=1e-5)
    assert got["trace"]["estimate"] == pytest.approx(expected["trace"]["estimate"], rel=1e-7)
    assert sharded["settings"]["checkpoint"]["shard_model"] == "blocks"

    calibrate = ["calibrate", str(folder), *common, "--method", "ts"]
    sharded = torchrun_json([*calibrate, "--shard-model", "blocks"], tmp_path)
    single = run_cli(*calibrate, "--json")
    assert single.code == 0, single.stderr
    got = sharded["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece", "brier"):
        assert got[metric] == pytest.approx(expected[metric], rel=1e-10, abs=1e-12)


RANKED = """
import os

import torch
from torch.utils.data import Dataset

GENERATOR = torch.Generator().manual_seed(0)
X = torch.rand(40, 1, 8, 8, generator=GENERATOR)
Y = torch.randint(0, 10, (40,), generator=GENERATOR)


class LastSampleUnreadable(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        if os.environ.get("RANK") == "1" and index == 39:
            raise RuntimeError("sample 39 is unreadable")
        return X[index], Y[index]


def failing_late():
    return LastSampleUnreadable()
"""


@pytest.mark.slow
def test_a_rank_failing_on_a_sharded_model_stops_every_rank(tmp_path: Path) -> None:
    """Rank 1 fails on its last sample while rank 0 waits in the sharded model's parameter
    gather: both stop with one line each, and nothing is written."""
    (tmp_path / "ranked.py").write_text(RANKED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
           "NO_COLOR": "1", "OMP_NUM_THREADS": "1", "CURVCAL_DIST_TIMEOUT": "300"}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "curvcal", "calibrate", str(CHECKPOINT), "--data",
               "py:ranked:failing_late", "--trust-checkpoint", "--device", "cpu",
               "--shard-model", "modules", "-o", "report.json"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    cause = "internal error: RuntimeError: sample 39 is unreadable"
    lines = done.stderr.splitlines()
    assert done.returncode != 0
    assert any(line.startswith(f"curvcal: error: rank 1: {cause}") for line in lines), done.stderr
    assert any(
        line.startswith(f"curvcal: error: rank 1 failed, so rank 0 stopped: {cause}")
        for line in lines
    ), done.stderr
    assert not (tmp_path / "report.json").exists()
