"""Holes an adversarial pass found in the rules every part inherits (every file read is an
input, every saved map is checked, every rank agrees, every library setting is bounded), each
fixed where all the parts go through it:

- model ``config.json`` sizes and counts (head counts 0, a negative layer count or position
  table, 10⁹ labels without ``id2label``) reached transformers: exit 70 (``ZeroDivisionError``,
  ``OverflowError``, a ``MemoryError`` after 40 s) or an error blaming the data; a
  ``tokenizer_config.json`` ``model_max_length`` of ``"x"`` was a ``TypeError`` inside the
  tokenizer's call (exit 70). Now the one reader of library configs refuses them, exit 2,
  naming the file and the key; a config field of the wrong type (huggingface_hub's strict
  dataclass error) escaped as exit 70: every call into the libraries now catches one list;
  the same library warning raised by two loads of one folder was said twice: once now;
  transformers' error for weights of another shape pointed at "the above report", a log
  record curvcal holds back: the report now stands in its place;
- a saved beta map with a or b below 0 (a map that falls as p_1 rises, which the fit never
  gives) and a calibrator file whose ``curvcal`` version is an object or a NaN were applied,
  exit 0. Now the bound is declared with the field and the envelope's version is read by the
  one schema reader: exit 2 naming the file and the field;
- importing a ``py:`` factory wrote a ``__pycache__`` folder beside the user's module; the one
  import of user code now writes nothing;
- (tests/scale/test_ranks_agree.py) ranks that build other models around the same weights (a
  ``py:`` architecture whose source differs) were summed, exit 0; now they stop.

Each case runs the real CLI in-process: exit 2, one ``curvcal: error:`` line naming the file
and the key.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from console_text import said, shown, times_said


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# library settings: a model's sizes and a tokenizer's limit, bounded before transformers runs


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A one-layer Llama classifier with its tokenizer, and reviews for it."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parent / "load"))
    from hf_decoder_builders import save_decoder, write_reviews

    root = tmp_path_factory.mktemp("decoder")
    return save_decoder(root / "m", "llama"), write_reviews(root / "r.jsonl")


#: (file, edit, key named): each was exit 70, or an error blaming the data, before
CONFIG_CASES: dict[str, tuple[str, Callable[[dict[str, Any]], None], str]] = {
    "no attention heads": (
        "config.json",
        lambda c: c.update(num_attention_heads=0),
        "num_attention_heads",
    ),
    "no key-value heads": (
        "config.json",
        lambda c: c.update(num_key_value_heads=0),
        "num_key_value_heads",
    ),
    "negative position table": (
        "config.json",
        lambda c: c.update(max_position_embeddings=-1),
        "max_position_embeddings",
    ),
    "negative layer count": (
        "config.json",
        lambda c: c.update(num_hidden_layers=-1),
        "num_hidden_layers",
    ),
    "a text as the tokenizer's limit": (
        "tokenizer_config.json",
        lambda c: c.update(model_max_length="x"),
        "model_max_length",
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_library_config_size_is_refused_naming_file_and_key(
    case: str, decoder: tuple[Path, Path], tmp_path: Path, run_cli
) -> None:
    import shutil

    name, edit, key = CONFIG_CASES[case]
    folder = tmp_path / "m"
    shutil.copytree(decoder[0], folder)
    config = json.loads((folder / name).read_text())
    edit(config)
    (folder / name).write_text(json.dumps(config))
    result = run_cli("calibrate", folder, "--data", decoder[1], "--method", "ts", "-q")
    assert result.code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("curvcal: error:"), result.stderr
    assert said(f"{shown(folder / name)} ({key}):", result.stderr), result.stderr
    assert "Traceback" not in result.output


def _edited_copy(source: Path, folder: Path, **changes: Any) -> Path:
    from hf_decoder_builders import copy_with_config

    return copy_with_config(source, folder, "config.json", **changes)


def test_a_config_field_of_the_wrong_type_is_the_folder_s_error(
    decoder: tuple[Path, Path], tmp_path: Path, run_cli
) -> None:
    """transformers' config classes check their fields with huggingface_hub's strict
    dataclasses, whose error is none of the builtin ones: it escaped the load as exit 70.
    Every call into the libraries now catches the same list of failures."""
    folder = _edited_copy(decoder[0], tmp_path / "m", hidden_act=["silu"])
    result = run_cli("calibrate", folder, "--data", decoder[1], "--method", "ts", "-q")
    assert result.code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and said(f"{shown(folder, ':')} transformers cannot load", lines[0])
    assert said("Field 'hidden_act' expected str", lines[0]), lines[0]


def test_a_library_warning_is_said_once_though_two_loads_raise_it(
    decoder: tuple[Path, Path], tmp_path: Path, run_cli
) -> None:
    """The model's load and its tokenizer's both read the folder's config, and transformers
    warns about its rope factor each time: the same line was said twice. A run says each
    warning once (and records it once in the JSON)."""
    rope = {"rope_theta": 10000.0, "rope_type": "linear", "factor": 0.5}
    folder = _edited_copy(decoder[0], tmp_path / "m", rope_parameters=rope)
    result = run_cli("calibrate", folder, "--data", decoder[1], "--method", "ts", "-q", "--json")
    assert result.code == 0, result.output
    warning = "factor field must be a float or int >= 1, got 0.5"
    assert times_said(warning, result.stderr) == 1, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert sum(warning in text for text in warnings) == 1, warnings


def test_weights_of_another_shape_are_named_not_sent_to_a_report_never_shown(
    decoder: tuple[Path, Path], tmp_path: Path, run_cli
) -> None:
    """transformers' error for a config whose sizes do not fit the weights says only "For
    details look at the above report!", and that report (a log record) is held back: the one
    line named no tensor. The held report now stands in its place."""
    folder = _edited_copy(decoder[0], tmp_path / "m", intermediate_size=48)
    result = run_cli("calibrate", folder, "--data", decoder[1], "--method", "ts", "-q")
    assert result.code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("curvcal: error:"), result.stderr
    assert "above report" not in result.stderr
    # the report's rows, as many as its 300 characters hold: one of the MLP's resized tensors
    assert said("LOAD REPORT", result.stderr), result.stderr
    assert re.search(r"mlp\.\w+_proj\.weight \| MISMATCH", " ".join(result.stderr.split()))


def test_config_sizes_nested_and_per_layer_lists() -> None:
    """The rule reads nested configs (a ``text_config``) and leaves per-layer lists to the
    library; whole sizes at their least pass."""
    from curvcal.errors import InputError
    from curvcal.load.models.library_limits import check_config

    path = Path("config.json")
    check_config(path, {"num_hidden_layers": 0, "hidden_size": 1, "intermediate_size": [8, 16]})
    check_config(path, {"type_vocab_size": 0, "num_key_value_heads": None})  # DeBERTa-v3, Llama
    with pytest.raises(InputError) as refused:
        check_config(path, {"text_config": {"num_attention_heads": 0}})
    assert refused.value.what == "config.json (text_config.num_attention_heads)"
    with pytest.raises(InputError, match="is not a whole number >= 1"):
        check_config(path, {"hidden_size": True})
    # num_labels without id2label: transformers builds that many names first (a MemoryError)
    with pytest.raises(InputError, match="more than the 1,000,000 curvcal reads") as refused:
        check_config(path, {"num_labels": 10**9})
    assert refused.value.what == "config.json (num_labels)"
    with pytest.raises(InputError, match="more than the 1,000,000 curvcal reads"):
        check_config(path, {"id2label": dict.fromkeys(map(str, range(1_000_001)), "x")})
    for no_limit in (10**30, 1e30):  # "no limit", as tokenizers write it
        check_config(Path("tokenizer_config.json"), {"model_max_length": no_limit})
    for bad in (0, -5, float("nan"), True, "512"):
        with pytest.raises(InputError, match="is not a number >= 1"):
            check_config(Path("tokenizer_config.json"), {"model_max_length": bad})


# ---------------------------------------------------------------------------------------------
# saved maps: every field through the one schema reader, with the bounds the fit keeps


@pytest.fixture(scope="module")
def binary_maps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Platt and beta maps fitted on half of 120 binary logits, and 80 others to apply them to."""
    import numpy as np

    root = tmp_path_factory.mktemp("binary")
    rng = np.random.default_rng(0)
    for name, n in (("fit.npz", 120), ("new.npz", 80)):
        logits = rng.normal(size=(n, 2)).astype(np.float32) * 2
        labels = (logits[:, 1] - logits[:, 0] + rng.normal(size=n) > 0).astype(np.int64)
        np.savez(root / name, logits=logits, labels=labels)
    saved = root / "maps.json"
    from click.testing import CliRunner

    from curvcal.cli import main

    with CliRunner().isolation() as (_stdout, stderr, _):
        code = main(
            ["metrics", str(root / "fit.npz"), "--method", "beta", "--val-split", "0.5",
             "--save-calibrator", str(saved), "-q"]
        )  # fmt: skip
    assert code == 0, stderr.getvalue()
    return saved, root / "new.npz"


#: (edit of the saved file, field named): each was applied with exit 0 before
SAVED_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    # a, b < 0 make q_1 = σ(a·ln p_1 − b·ln p_0 + c) fall as p_1 rises; the fit sets them to 0
    "beta a below 0": (lambda d: d["beta"].update(a=-1.0), "a -1.0 is outside 0..8.5e+37"),
    "beta b below 0": (lambda d: d["beta"].update(b=-5.0), "b -5.0 is outside 0..8.5e+37"),
    "the version an object": (
        lambda d: d.update(curvcal={"x": [1e308]}),
        "curvcal must be a string",
    ),
    "the version a number": (lambda d: d.update(curvcal=float("nan")), "curvcal must be a string"),
}


@pytest.mark.parametrize("case", list(SAVED_CASES))
def test_a_saved_field_outside_its_schema_is_refused_naming_the_file(
    case: str, binary_maps: tuple[Path, Path], tmp_path: Path, run_cli
) -> None:
    saved, scores = binary_maps
    edit, why = SAVED_CASES[case]
    document = json.loads(saved.read_text())
    edit(document)
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(document))  # NaN written as JSON's NaN token
    result = run_cli("metrics", scores, "--apply", tampered, "-q")
    assert result.code == 2, result.output
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("curvcal: error:"), result.stderr
    assert said(shown(tampered), result.stderr) and said(why, result.stderr), result.stderr


def test_the_untampered_maps_still_apply(binary_maps: tuple[Path, Path], run_cli) -> None:
    saved, scores = binary_maps
    assert json.loads(saved.read_text())["beta"]["a"] >= 0
    result = run_cli("metrics", scores, "--apply", saved, "-q")
    assert result.code == 0, result.output


# ---------------------------------------------------------------------------------------------
# inputs: nothing written beside what a run reads


FACTORY = "import torch\n\ndef make():\n    return torch.zeros(6, 1, 8, 8), torch.arange(6) % 3\n"


def test_importing_a_py_factory_writes_nothing_beside_it(
    tmp_path: Path, run_cli, digits_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python caches a module it imports in a ``__pycache__`` folder beside the source: a run
    given ``--data py:module:make`` wrote into the folder of the user's module. The one import
    of user code (:func:`curvcal.inputs.import_recorded`) now turns that cache off."""
    folder = tmp_path / "factory"
    folder.mkdir()
    (folder / "gap_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as outside a test run
    monkeypatch.delitem(sys.modules, "gap_factory", raising=False)
    model, _data = digits_files
    result = run_cli(
        "calibrate", model, "--data", "py:gap_factory:make", "--trust-checkpoint",
        "--method", "none", "-q",
    )  # fmt: skip
    sys.modules.pop("gap_factory", None)
    assert result.code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["gap_factory.py"]
    assert sys.dont_write_bytecode is False  # put back
