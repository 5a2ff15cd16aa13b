"""Text classifiers end to end: a tiny BERT built from a config with a fast WordPiece tokenizer,
both saved by transformers' own save_pretrained; numbers against the library's own forward."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from curvcal.errors import InputError  # noqa: E402
from curvcal.load.checkpoint import CheckpointOptions, load_model  # noqa: E402
from curvcal.load.data import DataOptions, iter_batches, load_dataset  # noqa: E402
from curvcal.load.text import text_model_of  # noqa: E402

WORDS = ["good", "bad", "movie", "film", "great", "awful", "plot", "actor", "very", "not"]
TEXTS = [
    "good movie",
    "bad film",
    "very good plot",
    "not great",
    "awful actor very bad",
    "great film great actor",
    "plot",
    "not bad at all",  # 'at' and 'all' are unknown words
    "very very awful movie plot",
    "good",
    "bad actor",
]
LABELS = [1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 0]
NAMES = ("negative", "positive")


@dataclass(frozen=True)
class TextFiles:
    folder: Path
    jsonl: Path
    root: Path


def _write_tokenizer(root: Path) -> object:
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return transformers.BertTokenizerFast(vocab_file=str(vocab), model_max_length=12)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> TextFiles:
    root = tmp_path_factory.mktemp("bert_text")
    folder = root / "model"
    torch.manual_seed(3)
    config = transformers.BertConfig(
        vocab_size=15,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
        num_labels=2,
        id2label=dict(enumerate(NAMES)),
        label2id={name: i for i, name in enumerate(NAMES)},
    )
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():  # a classifier that is not near zero, so the Hessian is not tiny
        model.classifier.weight.normal_(0, 2.0)
    model.save_pretrained(folder)
    _write_tokenizer(root).save_pretrained(folder)
    jsonl = root / "reviews.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, LABELS))
    )
    return TextFiles(folder, jsonl, root)


def _library(folder: Path) -> tuple[torch.nn.Module, object]:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, attn_implementation="eager"
    )
    return model.double().eval(), transformers.AutoTokenizer.from_pretrained(folder)


def _reference_logits(folder: Path, texts: list[str]) -> torch.Tensor:
    model, tokenizer = _library(folder)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits


def _ece_by_hand(logits: torch.Tensor, labels: list[int], bins: int = 15) -> float:
    """Top-label ECE with bins (m/M, (m+1)/M], written out sample by sample."""
    probs = torch.softmax(logits.double(), dim=1)
    groups: dict[int, list[tuple[float, bool]]] = {}
    for row, label in enumerate(labels):
        confidence = float(probs[row].max())
        predicted = int(probs[row].argmax())
        index = min(max(int(np.ceil(confidence * bins)) - 1, 0), bins - 1)
        groups.setdefault(index, []).append((confidence, predicted == label))
    total = 0.0
    for members in groups.values():
        conf = sum(c for c, _ in members) / len(members)
        acc = sum(1.0 for _, ok in members if ok) / len(members)
        total += len(members) / len(labels) * abs(acc - conf)
    return total


def test_jsonl_is_tokenized_once_and_padded_per_batch(text_model: TextFiles) -> None:
    loaded = load_model(text_model.folder, CheckpointOptions(device="cpu"))
    data = load_dataset(DataOptions(spec=str(text_model.jsonl)), None, text_model_of(loaded))
    assert data.n_samples == len(TEXTS) and data.labels.tolist() == LABELS
    assert data.text is not None
    assert data.text["max_length"] == 12  # tokenizer 12 < config 16
    assert data.text["max_length_source"] == "tokenizer model_max_length"
    assert data.text["truncated"] == 0 and data.text["tokenizer"] == str(text_model.folder)
    _, tokenizer = _library(text_model.folder)
    batches = list(iter_batches(data.dataset, 4))
    assert [len(y) for _, y in batches] == [4, 4, 3]
    for start, (x, _y) in zip(range(0, len(TEXTS), 4), batches):
        expected = tokenizer(TEXTS[start : start + 4], padding=True, return_tensors="pt")
        assert set(x) == set(expected)
        for key in expected:
            assert torch.equal(x[key], expected[key])


def test_truncation_is_counted(text_model: TextFiles) -> None:
    loaded = load_model(text_model.folder, CheckpointOptions(device="cpu"))
    options = DataOptions(spec=str(text_model.jsonl), max_length=5)
    data = load_dataset(options, None, text_model_of(loaded))
    lengths = [len(t.split()) + 2 for t in TEXTS]  # [CLS] ... [SEP], one token per word here
    assert data.text is not None and data.text["truncated"] == sum(n > 5 for n in lengths)
    x, _ = next(iter_batches(data.dataset, len(TEXTS)))
    assert x["input_ids"].shape[1] == 5


def test_csv_parquet_and_saved_datasets_read_the_same(text_model: TextFiles, tmp_path: Path) -> None:
    loaded = load_model(text_model.folder, CheckpointOptions(device="cpu"))
    facts = text_model_of(loaded)
    # CSV with label names mapped through the model's label2id, under other column names
    path = tmp_path / "reviews.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for text, label in zip(TEXTS, LABELS):
            writer.writerow([text, NAMES[label]])
    options = DataOptions(spec=str(path), text_key="review", label_key="sentiment")
    csv_data = load_dataset(options, None, facts)
    assert csv_data.labels.tolist() == LABELS
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": TEXTS, "label": LABELS}), tmp_path / "r.parquet")
    parquet = load_dataset(DataOptions(spec=str(tmp_path / "r.parquet")), None, facts)
    datasets = pytest.importorskip("datasets")
    saved = datasets.DatasetDict(
        {"test": datasets.Dataset.from_dict({"text": TEXTS, "label": LABELS})}
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    folder = load_dataset(DataOptions(spec=f"{tmp_path / 'saved'}:test"), None, facts)
    reference = next(iter_batches(csv_data.dataset, 11))[0]
    for other in (parquet, folder):
        assert other.labels.tolist() == LABELS
        x = next(iter_batches(other.dataset, 11))[0]
        assert all(torch.equal(x[k], reference[k]) for k in reference)
    with pytest.raises(InputError, match="folder of splits"):
        load_dataset(DataOptions(spec=str(tmp_path / "saved")), None, facts)


def test_bad_text_inputs_name_the_file_and_the_problem(
    text_model: TextFiles, tmp_path: Path
) -> None:
    loaded = load_model(text_model.folder, CheckpointOptions(device="cpu"))
    facts = text_model_of(loaded)
    with pytest.raises(InputError, match=r"no column 'sentence' \(columns: text, label\)"):
        load_dataset(DataOptions(spec=str(text_model.jsonl), text_key="sentence"), None, facts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "good", "label": "neutral"}\n')
    with pytest.raises(InputError, match="label 'neutral'") as refused:
        load_dataset(DataOptions(spec=str(bad)), None, facts)
    assert refused.value.what == str(bad)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(InputError, match="--tokenizer"):
        load_dataset(DataOptions(spec=str(text_model.jsonl), tokenizer=bare), None, facts)
    with pytest.raises(InputError, match="--tokenizer"):
        load_dataset(DataOptions(spec=str(text_model.jsonl)), None, None)
