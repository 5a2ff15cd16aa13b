"""A SEQ_CLS LoRA adapter over a causal-LM base folder (``LlamaForCausalLM``,
``Qwen2ForCausalLM``), as decoder classifiers are usually fine-tuned: curvcal builds the
sequence classifier from the base (``lm_head`` dropped, the head from the adapter). Logits
against peft's own merged model over a classifier assembled by hand from the causal LM's
weights; the Hessian over the adapter's parameters against a dense float64 one; each refusal
one line, exit 2."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_decoder_builders import (  # noqa: E402
    LABELS,
    TEXTS,
    copy_adapter,
    decoder_config,
    dense_hessian,
    save_lora,
    train_tokenizer,
)

from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402
from tests.console_text import shown  # noqa: E402


@dataclass(frozen=True)
class CausalAdapter:
    kind: str
    base: Path
    adapter: Path
    jsonl: Path
    num_labels: int
    pad_token_id: int


def _causal_config(kind: str, vocab_size: int, pad_in_config: int | None) -> object:
    """The decoder config of :func:`decoder_config` as a language model's: Llama with no label
    names and no pad id (as Llama releases ship), Qwen2 with its labels named, its pad id set and
    the output embedding tied to the input one (no lm_head weight saved)."""
    values = decoder_config(kind, vocab_size, pad_in_config).to_dict()
    if kind == "llama":
        for key in ("id2label", "label2id", "num_labels"):
            values.pop(key, None)
    else:
        values["tie_word_embeddings"] = True
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    return config_class(**values)


def _causal_class(kind: str) -> type:
    return {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[kind]


def _classifier_class(kind: str) -> type:
    return {
        "llama": transformers.LlamaForSequenceClassification,
        "qwen2": transformers.Qwen2ForSequenceClassification,
    }[kind]


@pytest.fixture(scope="module", params=("llama", "qwen2"))
def causal(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> CausalAdapter:
    kind = request.param
    root = tmp_path_factory.mktemp(f"causal_{kind}")
    tokenizer = train_tokenizer()
    pad = tokenizer.pad_token_id
    num_labels = 3 if kind == "llama" else len(LABELS)
    torch.manual_seed(5)
    config = _causal_config(kind, len(tokenizer), None if kind == "llama" else pad)
    _causal_class(kind)(config).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    # fine-tuning as people do it: the classifier from the language model, then LoRA on it
    save_lora(root / "base", root / "adapter", seed=6, num_labels=num_labels, pad_token_id=pad)
    jsonl = root / "reviews.jsonl"
    with jsonl.open("w") as handle:
        for i, text in enumerate(TEXTS):
            handle.write(json.dumps({"text": text, "label": i % num_labels}) + "\n")
    return CausalAdapter(kind, root / "base", root / "adapter", jsonl, num_labels, pad)


def _reference(causal: CausalAdapter, merge: bool) -> torch.nn.Module:
    """peft's own model over a classifier assembled by hand: the class built from the causal
    config with the causal LM's state dict loaded into it (all but lm_head; the head missing)."""
    config = transformers.AutoConfig.from_pretrained(causal.base)
    config.num_labels = causal.num_labels
    config.pad_token_id = causal.pad_token_id
    config._attn_implementation = "eager"
    language_model = _causal_class(causal.kind).from_pretrained(causal.base)
    state = {k: v for k, v in language_model.state_dict().items() if not k.startswith("lm_head.")}
    classifier = _classifier_class(causal.kind)(config)
    result = classifier.load_state_dict(state, strict=False)
    assert result.missing_keys == ["score.weight"] and result.unexpected_keys == []
    model = peft.PeftModel.from_pretrained(
        classifier.double(), causal.adapter, is_trainable=not merge
    ).double()
    if merge:  # in float64: the merged weights W + BA carry no float32 rounding
        model = model.merge_and_unload()
    return model.eval()


def _inputs(causal: CausalAdapter, folder: Path | None = None) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder or causal.base)
    return dict(tokenizer(list(TEXTS), padding=True, return_tensors="pt"))


def test_logits_equal_peft_merged_model(causal: CausalAdapter) -> None:
    loaded = load_model(causal.adapter, CheckpointSettings(device="cpu", dtype="float64"))
    assert loaded.form == "peft_adapter"
    classifier = _classifier_class(causal.kind).__name__
    assert loaded.metadata["sequence_classifier"] == classifier
    built = loaded.metadata["classifier_built"]
    assert built.startswith(f"built {classifier} from the {_causal_class(causal.kind).__name__}")
    assert f"{causal.num_labels} labels from the adapter's score head" in built
    source = "the base folder's tokenizer" if causal.kind == "llama" else "config.json"
    assert f"pad_token_id {causal.pad_token_id} from {source}" in built
    assert loaded.num_classes == causal.num_labels
    library = loaded.module.__dict__["library_model"]
    assert library.config.pad_token_id == causal.pad_token_id
    inputs = _inputs(causal)
    assert (inputs["input_ids"] == causal.pad_token_id).any()  # padding is read in this batch
    with torch.no_grad():
        expected = _reference(causal, merge=True)(**inputs).logits
        got = loaded.module(inputs)
    assert got.shape == (len(TEXTS), causal.num_labels)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    trainable = [n for n, p in loaded.module.named_parameters() if p.requires_grad]
    assert trainable and all(("lora_" in n or "modules_to_save" in n) for n in trainable)
    assert any("score.modules_to_save" in n for n in trainable)


def test_hessian_over_the_adapter_equals_a_dense_float64_one(
    run_cli, causal: CausalAdapter
) -> None:
    model = _reference(causal, merge=False)
    inputs = _inputs(causal)
    labels = torch.tensor([i % causal.num_labels for i in range(len(TEXTS))])
    chosen = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    dense = dense_hessian(model, chosen, inputs, labels)
    exact = torch.linalg.eigvalsh(dense)
    result = run_cli(
        "hessian", causal.adapter, "--base-model", causal.base, "--data", causal.jsonl,
        "--dtype", "float64", "--device", "cpu", "--top-k", "2", "--tol", "1e-10",
        "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )
    assert document["results"]["operator"]["n_params"] == dense.shape[0]
    checkpoint = document["inputs"]["checkpoint"]
    built = checkpoint["metadata"]["classifier_built"]
    assert built in document["warnings"]
    said = [line for line in result.stderr.splitlines() if "built " in line]
    assert len(said) == 1 and _classifier_class(causal.kind).__name__ in said[0]
    assert "LOAD REPORT" not in result.stderr and "lm_head.weight" not in result.stderr


@pytest.mark.parametrize("causal", ["llama"], indirect=True)
def test_pad_token_from_the_tokenizer_saved_with_the_adapter(
    causal: CausalAdapter, tmp_path: Path
) -> None:
    """A fine-tuning run that padded with the eos token saves that tokenizer with the adapter:
    the classifier reads padding as that id, and the data is padded with it."""
    folder = tmp_path / "adapter"
    shutil.copytree(causal.adapter, folder)
    tokenizer = train_tokenizer(pad=False)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(folder)
    loaded = load_model(folder, CheckpointSettings(device="cpu", dtype="float64"))
    eos = tokenizer.eos_token_id
    assert eos != causal.pad_token_id
    assert (
        f"pad_token_id {eos} from the adapter folder's tokenizer"
        in (loaded.metadata["classifier_built"])
    )
    moved = dataclasses.replace(causal, adapter=folder, pad_token_id=eos)
    inputs = _inputs(causal, folder)
    assert (inputs["input_ids"] == eos).any()  # the batch is padded with it
    with torch.no_grad():
        expected = _reference(moved, merge=True)(**inputs).logits
        torch.testing.assert_close(loaded.module(inputs), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", ["llama"], indirect=True)
def test_no_pad_token_anywhere_runs_one_text_per_batch(
    run_cli, causal: CausalAdapter, tmp_path: Path
) -> None:
    """With no pad id in config.json nor in the tokenizer, ``--batch-size 1`` pads nothing:
    each text's logits are the library's on that text alone."""
    base = _base_without_pad(causal, tmp_path)
    saved = tmp_path / "logits.npz"
    result = run_cli(
        "calibrate", causal.adapter, "--base-model", base, "--data", causal.jsonl,
        "--device", "cpu", "--method", "none", "--batch-size", "1", "--save-logits", saved,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "no pad_token_id" in " ".join(result.stderr.split())  # rich wraps the line
    import numpy as np

    model = _reference(dataclasses.replace(causal, pad_token_id=None), merge=True).float()
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    with torch.no_grad():
        expected = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in TEXTS])
    with np.load(saved) as arrays:
        torch.testing.assert_close(torch.from_numpy(arrays["logits"]), expected)


def test_calibrate_and_check_run_on_the_built_classifier(
    run_cli, causal: CausalAdapter, tmp_path: Path
) -> None:
    saved = tmp_path / "logits.npz"
    result = run_cli(
        "calibrate", causal.adapter, "--data", causal.jsonl, "--device", "cpu", "--method",
        "ts", "--val-split", "0.5", "--save-logits", saved,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    import numpy as np

    with torch.no_grad():
        expected = _reference(causal, merge=True).float()(**_inputs(causal)).logits
    with np.load(saved) as arrays:
        torch.testing.assert_close(torch.from_numpy(arrays["logits"]), expected)
    assert run_cli("metrics", saved).code == 0
    assert run_cli("inspect", causal.adapter).code == 0


# --- refusals --------------------------------------------------------------------------------


def _rewrite_head(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    from safetensors.torch import load_file, save_file

    weights = folder / "adapter_model.safetensors"
    state = load_file(weights)
    change(state)
    save_file(state, weights)
    return weights


Case = tuple[list[object], tuple[str, ...]]


def _not_seq_cls(causal: CausalAdapter, tmp: Path) -> Case:
    """A CAUSAL_LM adapter scores multiple-choice answers (tests/load/test_choice_scorer.py);
    any other task is neither that nor a sequence classifier."""
    folder = copy_adapter(causal.adapter, tmp, task_type="TOKEN_CLS")
    return ["hessian", folder, "--base-model", causal.base, "--data", causal.jsonl], (
        shown(folder / "adapter_config.json", ":"),
        "task_type 'TOKEN_CLS', not 'SEQ_CLS' nor 'CAUSAL_LM'",
        "neither a sequence classifier nor a language model",
    )


def _no_saved_head(causal: CausalAdapter, tmp: Path) -> Case:
    folder = copy_adapter(causal.adapter, tmp, modules_to_save=None)

    def drop(state: dict[str, torch.Tensor]) -> None:
        for key in [k for k in state if ".score." in k]:
            del state[key]

    weights = _rewrite_head(folder, drop)
    return ["calibrate", folder, "--base-model", causal.base, "--data", causal.jsonl], (
        shown(weights, ":"),
        "holds no classification head",
        "modules_to_save is None",
        "head would be random",
        "modules_to_save",
    )


def _head_rows_against_labels(causal: CausalAdapter, tmp: Path) -> Case:
    base = tmp / "named_base"
    shutil.copytree(causal.base, base)
    config = json.loads((base / "config.json").read_text())
    config["id2label"] = {"0": "no", "1": "yes", "2": "maybe", "3": "unsure"}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (base / "config.json").write_text(json.dumps(config))
    return ["hessian", causal.adapter, "--base-model", base, "--data", causal.jsonl], (
        shown(causal.adapter / "adapter_model.safetensors", ":"),
        f"score head has {causal.num_labels} rows",
        "names 4 labels",
    )


def _head_width(causal: CausalAdapter, tmp: Path) -> Case:
    folder = copy_adapter(causal.adapter, tmp)
    key = "base_model.model.score.weight"

    def widen(state: dict[str, torch.Tensor]) -> None:
        state[key] = torch.zeros(causal.num_labels, 24)

    weights = _rewrite_head(folder, widen)
    return ["hessian", folder, "--base-model", causal.base, "--data", causal.jsonl], (
        shown(weights, ":"),
        f"shape [{causal.num_labels}, 24]",
        "hidden_size 16",
    )


def _no_sequence_classifier(causal: CausalAdapter, tmp: Path) -> Case:
    """CodeGen is a causal LM transformers has no sequence classifier for."""
    base = tmp / "codegen"
    config = transformers.CodeGenConfig(
        vocab_size=320, n_embd=16, n_layer=1, n_head=2, n_positions=64, rotary_dim=4
    )
    transformers.CodeGenForCausalLM(config).save_pretrained(base)
    return ["hessian", causal.adapter, "--base-model", base, "--data", causal.jsonl], (
        shown(base, ":"),
        "CodeGenForCausalLM (model_type 'codegen')",
        "transformers has no sequence classifier",
    )


def _base_without_pad(causal: CausalAdapter, tmp: Path) -> Path:
    """A copy of the base whose tokenizer has no pad token (its config has no pad id)."""
    base = tmp / "no_pad"
    shutil.copytree(causal.base, base)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (base / name).unlink(missing_ok=True)
    train_tokenizer(pad=False).save_pretrained(base)
    return base


def _no_pad_token(causal: CausalAdapter, tmp: Path) -> Case:
    """No pad id in config.json nor in any tokenizer: padded batches cannot be read."""
    base = _base_without_pad(causal, tmp)
    return ["calibrate", causal.adapter, "--base-model", base, "--data", causal.jsonl], (
        shown(base, ":"),
        "LlamaForSequenceClassification reads each text at its last non-padding token",
        "sets no pad_token_id",
        "--batch-size 1",
    )


def _base_weights_missing(causal: CausalAdapter, tmp: Path) -> Case:
    """A base whose weight file lacks a tensor: transformers would start it at random."""
    from safetensors.torch import load_file, save_file

    base = tmp / "short"
    shutil.copytree(causal.base, base)
    state = load_file(base / "model.safetensors")
    del state["model.norm.weight"]
    save_file(state, base / "model.safetensors", metadata={"format": "pt"})
    return ["hessian", causal.adapter, "--base-model", base, "--data", causal.jsonl], (
        shown(base, ":"),
        "weights do not fit LlamaForSequenceClassification",
        "1 weights missing (model.norm.weight)",
    )


CASES: dict[str, Callable[[CausalAdapter, Path], Case]] = {
    "adapter task not SEQ_CLS": _not_seq_cls,
    "adapter with no saved head": _no_saved_head,
    "head rows against the base's labels": _head_rows_against_labels,
    "head width against the base's hidden size": _head_width,
    "causal LM with no sequence classifier": _no_sequence_classifier,
    "no pad token anywhere": _no_pad_token,
    "base weights missing a tensor": _base_weights_missing,
}


@pytest.mark.parametrize("causal", ["llama"], indirect=True)  # the refusals on the Llama base
@pytest.mark.parametrize("name", list(CASES))
def test_refusal_is_one_clear_line(
    run_cli, causal: CausalAdapter, tmp_path: Path, name: str
) -> None:
    args, needles = CASES[name](causal, tmp_path)
    root = causal.base.parent
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    result = run_cli(*args, "--device", "cpu")
    assert result.code == 2, (name, result.output)
    assert "Traceback" not in result.stderr, name
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("curvcal: error: "), (name, lines)
    for needle in needles:
        assert needle in lines[-1], (name, needle, lines[-1])
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
