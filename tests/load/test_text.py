"""Text classifiers end to end: a tiny BERT built from a config with a fast WordPiece tokenizer,
both saved by transformers' own save_pretrained; numbers against the library's own forward."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from curvcal.errors import InputError  # noqa: E402
from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.data import load_dataset  # noqa: E402
from curvcal.load.datasets.batches import iter_batches  # noqa: E402
from curvcal.load.texts.text import text_model_of  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402
from curvcal.settings.data import DataSettings  # noqa: E402
from tests.console_text import said, shown, times_said  # noqa: E402

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
        "".join(
            json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, LABELS, strict=True)
        )
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
    loaded = load_model(text_model.folder, CheckpointSettings(device="cpu"))
    data = load_dataset(DataSettings(data=str(text_model.jsonl)), None, text_model_of(loaded))
    assert data.n_samples == len(TEXTS) and data.labels.tolist() == LABELS
    assert data.text is not None
    assert data.text["max_length"] == 12  # tokenizer 12 < config 16
    assert data.text["max_length_source"] == "tokenizer model_max_length"
    assert data.text["truncated"] == 0 and data.text["tokenizer"] == str(text_model.folder)
    _, tokenizer = _library(text_model.folder)
    batches = list(iter_batches(data.dataset, 4))
    assert [len(y) for _, y in batches] == [4, 4, 3]
    for start, (x, _y) in zip(range(0, len(TEXTS), 4), batches, strict=True):
        expected = tokenizer(TEXTS[start : start + 4], padding=True, return_tensors="pt")
        assert set(x) == set(expected)
        for key in expected:
            assert torch.equal(x[key], expected[key])


def test_truncation_is_counted(text_model: TextFiles) -> None:
    loaded = load_model(text_model.folder, CheckpointSettings(device="cpu"))
    options = DataSettings(data=str(text_model.jsonl), max_length=5)
    data = load_dataset(options, None, text_model_of(loaded))
    lengths = [len(t.split()) + 2 for t in TEXTS]  # [CLS] ... [SEP], one token per word here
    assert data.text is not None and data.text["truncated"] == sum(n > 5 for n in lengths)
    x, _ = next(iter_batches(data.dataset, len(TEXTS)))
    assert x["input_ids"].shape[1] == 5


def test_csv_parquet_and_saved_datasets_read_the_same(
    text_model: TextFiles, tmp_path: Path
) -> None:
    loaded = load_model(text_model.folder, CheckpointSettings(device="cpu"))
    facts = text_model_of(loaded)
    # CSV with label names mapped through the model's label2id, under other column names
    path = tmp_path / "reviews.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "sentiment"])
        for text, label in zip(TEXTS, LABELS, strict=True):
            writer.writerow([text, NAMES[label]])
    options = DataSettings(data=str(path), text_key="review", label_key="sentiment")
    csv_data = load_dataset(options, None, facts)
    assert csv_data.labels.tolist() == LABELS
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": TEXTS, "label": LABELS}), tmp_path / "r.parquet")
    parquet = load_dataset(DataSettings(data=str(tmp_path / "r.parquet")), None, facts)
    datasets = pytest.importorskip("datasets")
    saved = datasets.DatasetDict(
        {"test": datasets.Dataset.from_dict({"text": TEXTS, "label": LABELS})}
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    folder = load_dataset(DataSettings(data=f"{tmp_path / 'saved'}:test"), None, facts)
    reference = next(iter_batches(csv_data.dataset, 11))[0]
    for other in (parquet, folder):
        assert other.labels.tolist() == LABELS
        x = next(iter_batches(other.dataset, 11))[0]
        assert all(torch.equal(x[k], reference[k]) for k in reference)
    with pytest.raises(InputError, match="folder of splits"):
        load_dataset(DataSettings(data=str(tmp_path / "saved")), None, facts)


def test_bad_text_inputs_name_the_file_and_the_problem(
    text_model: TextFiles, tmp_path: Path
) -> None:
    loaded = load_model(text_model.folder, CheckpointSettings(device="cpu"))
    facts = text_model_of(loaded)
    with pytest.raises(InputError, match=r"no column 'sentence' \(columns: text, label\)"):
        load_dataset(DataSettings(data=str(text_model.jsonl), text_key="sentence"), None, facts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "good", "label": "neutral"}\n')
    with pytest.raises(InputError, match="label 'neutral'") as refused:
        load_dataset(DataSettings(data=str(bad)), None, facts)
    assert refused.value.what == str(bad)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(InputError, match="--tokenizer"):
        load_dataset(DataSettings(data=str(text_model.jsonl), tokenizer=bare), None, facts)
    with pytest.raises(InputError, match="--tokenizer"):
        load_dataset(DataSettings(data=str(text_model.jsonl)), None, None)


def _eigsh_lambda_max(folder: Path, texts: list[str], labels: list[int], skip: str) -> float:
    """λmax of the mean cross-entropy Hessian over every parameter but ``skip``, from the
    library's own forward on the texts padded together (torch.func products, scipy eigsh)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    model, tokenizer = _library(folder)
    encoded = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    y = torch.tensor(labels)
    params = {n: p.detach() for n, p in model.named_parameters() if n != skip}
    fixed = {n: p.detach() for n, p in model.named_parameters() if n == skip}

    def loss(values: dict[str, torch.Tensor]) -> torch.Tensor:
        out = torch.func.functional_call(model, {**values, **fixed}, args=(), kwargs=encoded)
        return torch.nn.functional.cross_entropy(out.logits, y)

    sizes = [p.numel() for p in params.values()]

    def hvp(vector: object) -> object:
        v = torch.as_tensor(vector, dtype=torch.float64).reshape(-1)
        pieces = [c.reshape(p.shape) for c, p in zip(v.split(sizes), params.values(), strict=True)]
        _, product = torch.func.jvp(
            torch.func.grad(loss), (params,), (dict(zip(params, pieces, strict=True)),)
        )
        return torch.cat([product[n].reshape(-1) for n in params]).numpy()

    total = sum(sizes)
    operator = LinearOperator((total, total), matvec=hvp, dtype="float64")
    (value,) = eigsh(operator, k=1, which="LA", tol=1e-12, return_eigenvectors=False)
    return float(value)


def test_hessian_lambda_max_equals_eigsh_on_the_library_forward(
    run_cli, text_model: TextFiles
) -> None:
    skip = "bert.embeddings.word_embeddings.weight"
    reference = _eigsh_lambda_max(text_model.folder, TEXTS, LABELS, skip)
    result = run_cli(
        "hessian", text_model.folder, "--data", text_model.jsonl, "--dtype", "float64",
        "--device", "cpu", "--batch-size", "4", "--tol", "1e-10", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    # batches of 4 are padded to their own longest text; the reference pads all 11 together
    assert document["results"]["lambda_max"] == pytest.approx(reference, rel=1e-6)
    assert skip not in document["results"]["operator"]["params"]
    assert "except the token embeddings" in document["results"]["operator"]["params_choice"]
    assert said("token embeddings", result.stderr)
    jsonschema = pytest.importorskip("jsonschema")
    from curvcal.assets import report_schema

    schema = json.loads(report_schema().read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    described = document["inputs"]["data"]["text"]
    assert described["n_texts"] == len(TEXTS) and described["truncated"] == 0
    everything = run_cli(
        "hessian", text_model.folder, "--data", text_model.jsonl, "--dtype", "float64",
        "--device", "cpu", "--params", "all", "--no-trace", "--max-iter", "5", "--json",
    )  # fmt: skip
    assert everything.code == 0, everything.stderr
    document = json.loads(everything.stdout)
    settings, operator = document["settings"]["hessian"], document["results"]["operator"]
    assert settings["params"] == ["all"] and "--params all" in operator["params_choice"]


def test_calibrate_and_metrics_equal_the_library_logits(
    run_cli, text_model: TextFiles, tmp_path: Path
) -> None:
    logits = _reference_logits(text_model.folder, TEXTS)
    y = torch.tensor(LABELS)
    accuracy = float((logits.argmax(1) == y).double().mean())
    nll = float(torch.nn.functional.cross_entropy(logits, y))
    ece = _ece_by_hand(logits, LABELS)
    saved = tmp_path / "logits.npz"
    result = run_cli(
        "calibrate", text_model.folder, "--data", text_model.jsonl, "--dtype", "float64",
        "--device", "cpu", "--batch-size", "3", "--method", "none", "--save-logits", saved,
        "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    direct = document["results"]["evaluation"]["uncalibrated"]
    assert direct["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert direct["nll"] == pytest.approx(nll, abs=1e-6)
    assert direct["ece"] == pytest.approx(ece, abs=1e-6)
    assert document["inputs"]["data"]["text"]["tokenizer"] == str(text_model.folder)
    stored = np.load(saved)
    assert np.allclose(stored["logits"], logits.numpy(), rtol=0, atol=1e-6)
    metrics = run_cli("metrics", saved, "--json")
    assert metrics.code == 0, metrics.stderr
    found = json.loads(metrics.stdout)["results"]["evaluation"]["uncalibrated"]
    assert found["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert found["nll"] == pytest.approx(nll, abs=1e-6)
    assert found["ece"] == pytest.approx(ece, abs=1e-6)


def test_check_and_study_run_on_the_text_folder(
    run_cli, text_model: TextFiles, tmp_path: Path
) -> None:
    logits = _reference_logits(text_model.folder, TEXTS)
    expected = float((logits.argmax(1) == torch.tensor(LABELS)).double().mean())
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(
        "".join(
            json.dumps({"review": t, "y": NAMES[y]}) + "\n"
            for t, y in zip(TEXTS, LABELS, strict=True)
        )
    )
    policy = tmp_path / "gate.toml"
    policy.write_text(
        f'[settings]\ndata = "{renamed}"\ntext_key = "review"\nlabel_key = "y"\n'
        'device = "cpu"\ndtype = "float64"\nprobes = 4\ntol = 1e-3\n'
        "[accuracy]\nmin = 0.0\n[lambda_max]\nmax = 1e9\n"
    )
    result = run_cli("check", text_model.folder, "--policy", policy, "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    (accuracy,) = [r for r in document["results"]["rows"] if r["metric"] == "accuracy"]
    assert accuracy["value"] == pytest.approx(expected, abs=1e-12)
    assert document["inputs"]["data"]["text"]["columns"]["text"] == "review"
    # a command-line option overrides the policy's setting
    overridden = run_cli(
        "check", text_model.folder, "--policy", policy, "--text-key", "text", "--json"
    )
    assert overridden.code == 2 and "no column 'text'" in overridden.stderr
    second = tmp_path / "second"
    shutil.copytree(text_model.folder, second)
    result = run_cli(
        "study", text_model.folder, second, "--data", text_model.jsonl, "--device", "cpu",
        "--probes", "4", "--tol", "1e-3", "--gammas", "0,1", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert times_said("except the token embeddings", result.stderr) == 1  # once, not per model
    rows = json.loads(result.stdout)["results"]["rows"]
    assert len(rows) == 2 and rows[0]["curvature"]["lambda_max"] == pytest.approx(
        rows[1]["curvature"]["lambda_max"], rel=1e-5
    )


def test_text_and_image_mismatches_are_one_line_errors(
    run_cli, text_model: TextFiles, tmp_path: Path
) -> None:
    images = tmp_path / "images.pt"
    torch.save({"x": torch.randn(4, 1, 8, 8), "y": torch.tensor([0, 1, 0, 1])}, images)
    result = run_cli("hessian", text_model.folder, "--data", images, "--device", "cpu")
    assert result.code == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()  # no warning about the run before the error
    assert "text classifier" in line and "not text" in line
    from curvcal.assets import demo_checkpoint

    result = run_cli(
        "calibrate", demo_checkpoint(), "--data", text_model.jsonl, "--tokenizer",
        text_model.folder, "--device", "cpu",
    )  # fmt: skip
    assert result.code == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "not a text classifier but the data is text" in line
    bare = tmp_path / "model_without_tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(text_model.folder / name, bare / name)
    result = run_cli("hessian", bare, "--data", text_model.jsonl, "--device", "cpu")
    assert result.code == 2
    (line,) = result.stderr.strip().splitlines()
    assert shown(bare, ":") in line and "--tokenizer" in line
    result = run_cli(
        "hessian", bare, "--data", text_model.jsonl, "--device", "cpu", "--tokenizer",
        text_model.folder, "--no-trace", "--max-iter", "3", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["data"]["text"]["tokenizer"] == str(
        text_model.folder
    )


def test_sentence_pairs_are_tokenized_together(text_model: TextFiles, tmp_path: Path) -> None:
    pairs = [t.split()[0] + " plot" for t in TEXTS]
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(
            json.dumps({"a": t, "b": p, "label": y}) + "\n"
            for t, p, y in zip(TEXTS, pairs, LABELS, strict=True)
        )
    )
    loaded = load_model(text_model.folder, CheckpointSettings(device="cpu"))
    options = DataSettings(data=str(path), text_key="a", text_pair_key="b", max_length=6)
    data = load_dataset(options, None, text_model_of(loaded))
    _, tokenizer = _library(text_model.folder)
    expected = tokenizer(
        TEXTS, pairs, padding=True, truncation=True, max_length=6, return_tensors="pt"
    )
    x, _ = next(iter_batches(data.dataset, len(TEXTS)))
    assert all(torch.equal(x[key], expected[key]) for key in expected)
    assert int(x["token_type_ids"].max()) == 1  # the second text is marked as such
    full = tokenizer(TEXTS, pairs)["input_ids"]
    assert data.text is not None and data.text["truncated"] == sum(len(f) > 6 for f in full)
