"""Holes an adversarial pass found in the rules every part inherits (every file read is an
input, every saved map is checked, every rank agrees, every library setting is bounded), each
fixed where all the parts go through it:

- model ``config.json`` sizes and counts (head counts 0, a negative layer count or position
  table, 10⁹ labels without ``id2label``) reached transformers: exit 70 (``ZeroDivisionError``,
  ``OverflowError``, a ``MemoryError`` after 40 s) or an error blaming the data; a
  ``tokenizer_config.json`` ``model_max_length`` of ``"x"`` was a ``TypeError`` inside the
  tokenizer's call (exit 70). Now the one reader of library configs refuses them, exit 2,
  naming the file and the key.

Each case runs the real CLI in-process: exit 2, one ``curvcal: error:`` line naming the file
and the key.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from console_text import said, shown


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


def test_config_sizes_nested_and_per_layer_lists() -> None:
    """The rule reads nested configs (a ``text_config``) and leaves per-layer lists to the
    library; whole sizes at their least pass."""
    from curvcal.errors import InputError
    from curvcal.load.models.library_limits import check_config

    path = Path("config.json")
    check_config(path, {"num_hidden_layers": 0, "hidden_size": 1, "intermediate_size": [8, 16]})
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
    check_config(Path("tokenizer_config.json"), {"model_max_length": 10**30})  # "no limit"
