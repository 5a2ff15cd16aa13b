"""Bad decoder classifiers, adapter folders and Trainer checkpoints: one clear line naming the
file or option and the problem, exit 2, no traceback, nothing written next to the inputs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from hf_decoder_builders import copy_adapter, save_decoder, save_lora, write_reviews

from tests.console_text import shown


@dataclass(frozen=True)
class Files:
    base: Path
    adapter: Path
    jsonl: Path
    root: Path


def llama_adapter_files(root: Path) -> Files:
    """A tiny Llama base, a LoRA adapter over it and a JSON Lines review set, under ``root``."""
    base = save_decoder(root / "base", "llama", seed=4)
    save_lora(base, root / "adapter")
    return Files(base, root / "adapter", write_reviews(root / "reviews.jsonl"), root)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return llama_adapter_files(tmp_path_factory.mktemp("bad_adapters"))


def _missing_base(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = copy_adapter(files.adapter, tmp, base_model_name_or_path=str(tmp / "gone" / "base"))
    return ["hessian", folder, "--data", files.jsonl], (
        shown(folder / "adapter_config.json", ":"),
        "gone/base",
        "not a model folder here",
        "--base-model DIR",
    )


def _hub_id(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = copy_adapter(files.adapter, tmp, base_model_name_or_path="meta-llama/Llama-3.2-1B")
    return ["calibrate", folder, "--data", files.jsonl], (
        shown(folder / "adapter_config.json", ":"),
        "'meta-llama/Llama-3.2-1B', which is not a local folder",
        "never downloads",
        "--base-model DIR",
    )


def _no_base_named(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = copy_adapter(files.adapter, tmp, base_model_name_or_path=None)
    return ["hessian", folder, "--data", files.jsonl], (
        "names no base_model_name_or_path",
        "--base-model DIR",
    )


def _base_option_not_a_folder(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    return ["hessian", files.adapter, "--data", files.jsonl, "--base-model", tmp / "nope"], (
        f"--base-model {shown(tmp / 'nope', ':')}",
        "does not exist",
    )


def _mismatched_width(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    """A base of another hidden size: the LoRA matrices do not fit its projections."""
    import transformers

    other = tmp / "wide"
    config = json.loads((files.base / "config.json").read_text())
    config.update(hidden_size=24, intermediate_size=40, head_dim=12)
    model = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(**config))
    model.save_pretrained(other)
    return ["hessian", files.adapter, "--data", files.jsonl, "--base-model", other], (
        shown(files.adapter, ":"),
        "the adapter does not fit its base model",
        "size mismatch",
        "--base-model DIR",
    )


def _mismatched_modules(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    """A LoRA folder whose tensors name modules the base lacks (a layer it does not have):
    peft's non-strict load would drop them without a word."""
    from safetensors.torch import load_file, save_file

    folder = copy_adapter(files.adapter, tmp)
    weights = folder / "adapter_model.safetensors"
    state = load_file(weights)
    state.update(
        {
            k.replace("layers.0.", "layers.7."): v.clone()
            for k, v in state.items()
            if "layers.0." in k
        }
    )
    save_file(state, weights)
    return ["calibrate", folder, "--data", files.jsonl], (
        shown(weights, ":"),
        "the adapter does not fit its base model",
        "saved tensors fit no module of the base",
        "layers.7.",
    )


def _base_not_a_classifier(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    """A bare transformer (no head); a causal LM base is built into the classifier instead
    (tests/load/test_adapter_causal_base.py)."""
    import transformers

    bare = tmp / "bare"
    config = transformers.AutoConfig.from_pretrained(files.base)
    transformers.LlamaModel(config).save_pretrained(bare)
    return ["hessian", files.adapter, "--data", files.jsonl, "--base-model", bare], (
        shown(bare, ":"),
        "LlamaModel, not the classifier the adapter was trained on",
        "AutoModelForSequenceClassification.from_pretrained(BASE, num_labels=K)",
        "--base-model DIR",
    )


def _no_weights(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = copy_adapter(files.adapter, tmp)
    (folder / "adapter_model.safetensors").unlink()
    return ["inspect", folder], (shown(folder, ":"), "no adapter_model.safetensors")


def _trainer_state_without_step(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = tmp / "checkpoint-3"
    shutil.copytree(files.base, folder)
    (folder / "trainer_state.json").write_text('{"global_step": "three"}')
    return ["inspect", folder], (
        shown(folder / "trainer_state.json", ":"),
        "no integer global_step",
    )


def _no_pad_token_id(files: Files, tmp: Path) -> tuple[list[object], tuple[str, ...]]:
    folder = tmp / "no_pad"
    shutil.copytree(files.base, folder)
    config = json.loads((folder / "config.json").read_text())
    config["pad_token_id"] = None
    (folder / "config.json").write_text(json.dumps(config))
    return ["calibrate", folder, "--data", files.jsonl], (
        shown(folder, ":"),
        "sets no pad_token_id",
        "--batch-size 1",
    )


CASES: dict[str, Callable[[Files, Path], tuple[list[object], tuple[str, ...]]]] = {
    "adapter base missing": _missing_base,
    "adapter base a hub id": _hub_id,
    "adapter names no base": _no_base_named,
    "--base-model not a folder": _base_option_not_a_folder,
    "LoRA on a base of another width": _mismatched_width,
    "LoRA naming modules the base lacks": _mismatched_modules,
    "adapter base not a classifier": _base_not_a_classifier,
    "adapter folder without weights": _no_weights,
    "trainer_state.json without a step": _trainer_state_without_step,
    "decoder without pad_token_id": _no_pad_token_id,
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line(run_cli, files: Files, tmp_path: Path, name: str) -> None:
    args, needles = CASES[name](files, tmp_path)
    before = sorted(p.relative_to(files.root) for p in files.root.rglob("*"))
    device = [] if args[0] == "inspect" else ["--device", "cpu"]
    result = run_cli(*args, *device)
    assert result.code == 2, (name, result.output)
    assert "Traceback" not in result.stderr, name
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    line = lines[-1]
    assert line.startswith("curvcal: error: "), (name, line)
    for needle in needles:
        assert needle in line, (name, needle, line)
    assert sorted(p.relative_to(files.root) for p in files.root.rglob("*")) == before
