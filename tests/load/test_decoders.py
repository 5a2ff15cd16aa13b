"""Decoder sequence classifiers (Llama- and Qwen2-style ``*ForSequenceClassification``, which
read each text's logits at its last non-padding token) from save_pretrained folders with their
own BPE tokenizers: no --arch, no trust; predictions against the library's own forward on the
same padded batch, Hessians against dense float64 ones of the library's forward."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from hf_decoder_builders import (  # noqa: E402
    LABELS,
    TEXTS,
    dense_hessian,
    library_logits,
    save_decoder,
    train_tokenizer,
    write_reviews,
)

from curvcal.errors import InputError  # noqa: E402
from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.data import load_dataset  # noqa: E402
from curvcal.load.datasets.batches import iter_batches  # noqa: E402
from curvcal.load.texts.text import text_model_of  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402
from curvcal.settings.data import DataSettings  # noqa: E402

KINDS = ("llama", "qwen2")
ARCHITECTURES = {
    "llama": "LlamaForSequenceClassification",
    "qwen2": "Qwen2ForSequenceClassification",
}


@dataclass(frozen=True)
class Decoder:
    kind: str
    folder: Path
    jsonl: Path
    labels: torch.Tensor


@pytest.fixture(scope="module", params=KINDS)
def decoder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    root = tmp_path_factory.mktemp(request.param)
    folder = save_decoder(root / "model", request.param)
    labels = torch.tensor([i % 2 for i in range(len(TEXTS))])
    return Decoder(request.param, folder, write_reviews(root / "reviews.jsonl"), labels)


def _library(folder: Path) -> torch.nn.Module:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, attn_implementation="eager"
    )
    return model.double().eval()


def _dense_hessian(decoder: Decoder, prefixes: tuple[str, ...]) -> torch.Tensor:
    """Dense float64 Hessian of the mean cross-entropy over the parameters whose names start
    with one of ``prefixes``, from the library's own forward on the padded batch of every
    text (torch.func.hessian of a functional_call)."""
    model = _library(decoder.folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(decoder.folder)
    inputs = dict(tokenizer(list(TEXTS), padding=True, return_tensors="pt"))
    chosen = {n: p.detach() for n, p in model.named_parameters() if n.startswith(prefixes)}
    return dense_hessian(model, chosen, inputs, decoder.labels)


def test_loads_without_arch_or_trust_and_equals_the_library_on_padded_batches(
    decoder: Decoder,
) -> None:
    loaded = load_model(decoder.folder, CheckpointSettings(device="cpu", dtype="float64"))
    assert loaded.form == "hf_folder" and loaded.arch is None
    assert loaded.architecture == ARCHITECTURES[decoder.kind]
    assert loaded.labels == LABELS and loaded.modality == "text"
    data = load_dataset(DataSettings(data=str(decoder.jsonl)), None, text_model_of(loaded))
    assert data.text is not None and data.text["truncated"] == 0
    assert data.text["pad_token_id"] == 3 and data.text["pad_token_source"] == "tokenizer"
    assert data.labels.tolist() == decoder.labels.tolist()  # names through label2id
    ((inputs, _y),) = list(iter_batches(data.dataset, len(TEXTS)))
    lengths = inputs["attention_mask"].sum(1)
    assert lengths.min() < lengths.max()  # the batch is padded: the pooling position matters
    with torch.no_grad():
        ours = loaded.module(inputs)
    assert torch.equal(ours, library_logits(_library(decoder.folder), decoder.folder))


def test_hessian_equals_the_dense_float64_reference(run_cli, decoder: Decoder) -> None:
    prefixes = ("score.", "model.layers.0.self_attn.v_proj.")
    exact = torch.linalg.eigvalsh(_dense_hessian(decoder, prefixes))
    result = run_cli(
        "hessian", decoder.folder, "--data", decoder.jsonl, "--dtype", "float64",
        "--device", "cpu", "--params", "score.*", "--params", "model.layers.0.self_attn.v_proj.*",
        "--top-k", "2", "--tol", "1e-10", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )
    assert document["inputs"]["checkpoint"]["architecture"] == ARCHITECTURES[decoder.kind]


def test_calibrate_saves_the_library_logits_and_metrics_reads_them(
    run_cli, decoder: Decoder, tmp_path: Path
) -> None:
    saved = tmp_path / "logits.npz"
    result = run_cli(
        "calibrate", decoder.folder, "--data", decoder.jsonl, "--device", "cpu",
        "--method", "ts", "--val-split", "0.5", "--save-logits", saved, "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    with np.load(saved) as arrays:
        logits = torch.from_numpy(arrays["logits"]).double()
        labels = arrays["labels"].tolist()
    expected = library_logits(_library(decoder.folder), decoder.folder)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)  # run in float32
    assert labels == decoder.labels.tolist()
    metrics = run_cli("metrics", saved, "--json")
    assert metrics.code == 0, metrics.stderr
    results = json.loads(metrics.stdout)["results"]["evaluation"]["uncalibrated"]
    accuracy = float((expected.argmax(1) == decoder.labels).double().mean())
    nll = float(torch.nn.functional.cross_entropy(expected, decoder.labels))
    assert results["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert results["nll"] == pytest.approx(nll, rel=1e-5)  # from the float32 logits


def test_a_tokenizer_without_pad_token_pads_with_the_config_id(
    decoder: Decoder, tmp_path: Path
) -> None:
    folder = tmp_path / "no_tokenizer_pad"
    shutil.copytree(decoder.folder, folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    tokenizer = train_tokenizer(pad=False)
    assert tokenizer.pad_token is None
    tokenizer.save_pretrained(folder)
    loaded = load_model(folder, CheckpointSettings(device="cpu", dtype="float64"))
    if decoder.kind == "qwen2":
        # transformers' Qwen2 tokenizer class adds its own "<|endoftext|>" pad token, a new id
        # past the vocabulary: the model would read that padding as text
        with pytest.raises(InputError, match=f"pads with token id {len(tokenizer)} but config"):
            load_dataset(DataSettings(data=str(decoder.jsonl)), None, text_model_of(loaded))
        return
    data = load_dataset(DataSettings(data=str(decoder.jsonl)), None, text_model_of(loaded))
    assert data.text is not None
    assert data.text["pad_token_id"] == 3
    assert data.text["pad_token_source"] == "config.json pad_token_id"
    ((inputs, _y),) = list(iter_batches(data.dataset, len(TEXTS)))
    with torch.no_grad():
        ours = loaded.module(inputs)
    assert torch.equal(ours, library_logits(_library(decoder.folder), decoder.folder))


def test_no_pad_token_id_is_one_clear_line_and_batch_size_one_still_runs(
    run_cli, decoder: Decoder, tmp_path: Path
) -> None:
    folder = tmp_path / "no_pad"
    shutil.copytree(decoder.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["pad_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    for command in ("hessian", "calibrate"):
        result = run_cli(command, folder, "--data", decoder.jsonl, "--device", "cpu")
        assert result.code == 2, result.output
        assert "Traceback" not in result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert str(folder) in line and "no pad_token_id" in line
        assert "set pad_token_id in config.json" in line and "eos_token_id 2" in line
        assert "--batch-size 1" in line
    # one text per batch needs no padding: transformers reads the last position
    result = run_cli(
        "calibrate", folder, "--data", decoder.jsonl, "--device", "cpu", "--batch-size", "1",
        "--method", "none", "--save-logits", tmp_path / "one.npz",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    model = _library(decoder.folder).float()
    tokenizer = transformers.AutoTokenizer.from_pretrained(decoder.folder)
    with torch.no_grad():
        expected = torch.cat([model(**tokenizer([t], return_tensors="pt")).logits for t in TEXTS])
    with np.load(tmp_path / "one.npz") as arrays:
        torch.testing.assert_close(torch.from_numpy(arrays["logits"]), expected)


def test_a_tokenizer_padding_with_another_id_is_refused(decoder: Decoder, tmp_path: Path) -> None:
    folder = tmp_path / "other_pad"
    shutil.copytree(decoder.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["pad_token_id"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_model(folder, CheckpointSettings(device="cpu"))
    with pytest.raises(
        InputError, match=r"pads with token id 3 but config\.json's pad_token_id is 2"
    ):
        load_dataset(DataSettings(data=str(decoder.jsonl)), None, text_model_of(loaded))


@pytest.mark.parametrize(
    ("config_name", "architecture", "expected"),
    [
        ("LlamaConfig", "LlamaForSequenceClassification", True),
        ("Qwen2Config", "Qwen2ForSequenceClassification", True),
        ("MistralConfig", "MistralForSequenceClassification", True),
        ("GPT2Config", "GPT2ForSequenceClassification", True),  # its own pooling code
        ("BertConfig", "BertForSequenceClassification", False),  # reads [CLS]
    ],
)
def test_which_classifiers_read_the_last_non_padding_token(
    tmp_path: Path, config_name: str, architecture: str, expected: bool
) -> None:
    """Decided from config.json alone (the class transformers names, or the model type), and
    the same as transformers' own forward: a pad token appended to a text changes the logits
    of a last-token classifier unless it is the config's pad id."""
    from curvcal.load.models.hf import pools_last_token, read_folder

    config = getattr(transformers, config_name)(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, num_labels=2, pad_token_id=0, n_embd=8, n_layer=1, n_head=2,
        num_key_value_heads=2,
    )  # fmt: skip
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    assert pools_last_token(read_folder(tmp_path, need_weights=False)) is expected
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    ids = torch.tensor([[5, 6, 7, 0]])
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0]])).logits
        config.pad_token_id = 29  # the same batch, read as if 0 were text
        unpadded = model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0]])).logits
    assert (not torch.equal(padded, unpadded)) is expected
