"""PEFT LoRA adapter folders over tiny Llama and BERT classifiers, saved by peft itself: loaded
without trust over a local base folder, logits against peft's own model, the Hessian over the
adapter's parameters against a dense float64 one built from peft's forward."""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_decoder_builders import (  # noqa: E402
    TEXTS,
    dense_hessian,
    save_decoder,
    save_lora,
    write_reviews,
)

from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.checkpoints.inspect import inspect_checkpoint  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402


@dataclass(frozen=True)
class Adapter:
    base: Path
    adapter: Path
    jsonl: Path
    labels: torch.Tensor


def _save_bert(folder: Path) -> Path:
    """A tiny BERT classifier with a WordPiece tokenizer over the words of the texts."""
    torch.manual_seed(3)
    words = sorted({w.strip(",") for t in TEXTS for w in t.lower().split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = transformers.BertTokenizerFast(
        vocab_file=str(folder / "vocab.txt"), model_max_length=24
    )
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=2,
        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=("llama", "bert"))
def lora(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Adapter:
    root = tmp_path_factory.mktemp(f"lora_{request.param}")
    if request.param == "llama":
        base = save_decoder(root / "base", "llama", seed=4)
    else:
        base = _save_bert(root / "base")
    save_lora(base, root / "adapter")
    labels = torch.tensor([i % 2 for i in range(len(TEXTS))])
    return Adapter(base, root / "adapter", write_reviews(root / "reviews.jsonl"), labels)


def _peft_model(adapter: Adapter) -> torch.nn.Module:
    base = transformers.AutoModelForSequenceClassification.from_pretrained(
        adapter.base, attn_implementation="eager"
    )
    model = peft.PeftModel.from_pretrained(base, adapter.adapter, is_trainable=True)
    return model.double().eval()


def _inputs(adapter: Adapter) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(adapter.base)
    return dict(tokenizer(list(TEXTS), padding=True, return_tensors="pt"))


def test_adapted_logits_equal_peft_and_only_the_adapter_trains(lora: Adapter) -> None:
    loaded = load_model(lora.adapter, CheckpointSettings(device="cpu", dtype="float64"))
    assert loaded.form == "peft_adapter" and loaded.arch is None
    assert loaded.metadata["peft_type"] == "LORA"
    assert loaded.metadata["base_model"] == str(lora.base)
    reference = _peft_model(lora)
    inputs = _inputs(lora)
    with torch.no_grad():
        expected = reference(**inputs).logits
        assert torch.equal(loaded.module(inputs), expected)
        # the adapter changes the logits: the base alone gives others
        base = load_model(lora.base, CheckpointSettings(device="cpu", dtype="float64"))
        assert not torch.allclose(base.module(inputs), expected)
    trainable = [n for n, p in loaded.module.named_parameters() if p.requires_grad]
    assert trainable and all(("lora_" in n or "modules_to_save" in n) for n in trainable)
    assert any("modules_to_save" in n for n in trainable)  # the classification head
    assert not loaded.module.training


def test_hessian_over_the_adapter_equals_a_dense_float64_one(run_cli, lora: Adapter) -> None:
    model = _peft_model(lora)
    inputs = _inputs(lora)
    chosen = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    dense = dense_hessian(model, chosen, inputs, lora.labels)
    exact = torch.linalg.eigvalsh(dense)
    result = run_cli(
        "hessian", lora.adapter, "--data", lora.jsonl, "--dtype", "float64", "--device", "cpu",
        "--top-k", "2", "--tol", "1e-10", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    results = document["results"]
    assert results["eigenvalues"] == pytest.approx(exact[-2:].flip(0).tolist(), rel=1e-6)
    operator = results["operator"]
    assert operator["n_params"] == dense.shape[0] == sum(p.numel() for p in chosen.values())
    assert operator["params"] == list(chosen)
    assert "the adapter's parameters" in operator["params_choice"]
    assert "the adapter's parameters" in result.stderr
    checkpoint = document["inputs"]["checkpoint"]
    assert checkpoint["form"] == "peft_adapter"
    assert checkpoint["metadata"]["base_model"] == str(lora.base)
    # the digest covers the adapter's config and weights
    files = ("adapter_config.json", "adapter_model.safetensors")
    assert checkpoint["size_bytes"] == sum((lora.adapter / f).stat().st_size for f in files)


def test_calibration_uses_the_adapted_model(run_cli, lora: Adapter, tmp_path: Path) -> None:
    saved = tmp_path / "logits.npz"
    result = run_cli(
        "calibrate", lora.adapter, "--data", lora.jsonl, "--device", "cpu", "--method", "ts",
        "--val-split", "0.5", "--save-logits", saved,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    with torch.no_grad():
        expected = _peft_model(lora).float()(**_inputs(lora)).logits
    with np.load(saved) as arrays:
        torch.testing.assert_close(torch.from_numpy(arrays["logits"]), expected)


def test_base_model_option_and_a_relative_base_path(
    run_cli, lora: Adapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the adapter moved away from where it was trained: its base path means nothing here
    moved = tmp_path / "moved"
    shutil.copytree(lora.adapter, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "elsewhere/base"
    (moved / "adapter_config.json").write_text(json.dumps(config))
    lookups: list[object] = []

    def no_network(*args: object, **kwargs: object) -> None:
        lookups.append(args[0])
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    loaded = load_model(moved, CheckpointSettings(device="cpu", base_model=lora.base))
    assert loaded.metadata["base_model"] == str(lora.base)
    assert lookups == []  # nothing asked the hub about "elsewhere/base"
    # a base path relative to the adapter folder
    shutil.copytree(lora.base, tmp_path / "base")
    config["base_model_name_or_path"] = "../base"
    (moved / "adapter_config.json").write_text(json.dumps(config))
    elsewhere = tmp_path / "x" / "y"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # not where ../base is
    loaded = load_model(moved, CheckpointSettings(device="cpu"))
    assert loaded.metadata["base_model"] == str(moved / "../base")


def test_inspect_reads_the_adapter_config_and_header_only(run_cli, lora: Adapter) -> None:
    info = inspect_checkpoint(lora.adapter)
    assert info.format == "peft_adapter" and not info.needs_trust
    assert info.metadata["peft_type"] == "LORA" and info.metadata["r"] == "2"
    assert info.metadata["base_model"] == str(lora.base)
    reference = _peft_model(lora)
    saved = peft.get_peft_model_state_dict(reference)
    assert {t.name for t in info.tensors} == set(saved)
    assert info.num_classes == 2  # the saved head's rows, not a LoRA matrix's
    result = run_cli("inspect", lora.adapter)
    assert result.code == 0, result.stderr
    assert "peft_adapter" in result.stdout and "LORA" in result.stdout


def test_adapter_code_needs_trust(run_cli, lora: Adapter, tmp_path: Path) -> None:
    folder = tmp_path / "coded"
    shutil.copytree(lora.adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["megatron_config"] = {"tensor_model_parallel_size": 1}
    config["megatron_core"] = "evil_module"
    (folder / "adapter_config.json").write_text(json.dumps(config))
    assert inspect_checkpoint(folder).needs_trust
    result = run_cli("hessian", folder, "--data", lora.jsonl, "--device", "cpu")
    assert result.code == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "megatron_config" in line and "--trust-checkpoint" in line


def test_inspect_counts_no_classes_without_a_saved_head(lora: Adapter, tmp_path: Path) -> None:
    """An adapter of LoRA matrices alone has no head to count: a LoRA B matrix's rows (the
    projection's width) are not a class count."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "lora_only"
    shutil.copytree(lora.adapter, folder)
    weights = folder / "adapter_model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if "lora_" in k}, weights)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["modules_to_save"] = None
    (folder / "adapter_config.json").write_text(json.dumps(config))
    info = inspect_checkpoint(folder)
    assert info.tensors and all("lora_" in t.name for t in info.tensors)
    assert info.num_classes is None
