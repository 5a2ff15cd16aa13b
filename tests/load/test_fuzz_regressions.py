"""Corrupt checkpoints the fuzz harness (tests/test_fuzz.py) found ending in "internal error".

Each is rebuilt here by hand, so the regression stays pinned whatever becomes of the mutation
code: exit 2, one line naming the file, no traceback.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch


def _safetensors(path: Path, header: dict[str, object], data: bytes = b"\0" * 16) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


class _BadRebuild:
    """Pickles as a call of torch's allow-listed tensor rebuild with no arguments."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (torch._utils._rebuild_tensor_v2, ())


def _deflated_zip(path: Path) -> Path:
    """A torch-zip layout whose deflated data.pkl does not inflate (zlib.error)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"a": 1}) * 50)
    data = bytearray(buffer.getvalue())
    start = 30 + len("archive/data.pkl")
    data[start : start + 8] = b"\xff" * 8  # reserved block type 3
    path.write_bytes(bytes(data))
    return path


def _future_zip(path: Path) -> Path:
    """A torch zip whose central directory asks for zip version 20.1 (NotImplementedError)."""
    torch.save({"w": torch.zeros(2)}, path)
    data = bytearray(path.read_bytes())
    central = data.find(b"PK\x01\x02")
    data[central + 6 : central + 8] = struct.pack("<H", 201)
    path.write_bytes(bytes(data))
    return path


def _huge_string(path: Path) -> Path:
    """A pickle whose BINUNICODE8 claims 2**62 bytes (MemoryError when read as claimed)."""
    path.write_bytes(b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"abc.")
    return path


def _bad_rebuild(path: Path) -> Path:
    torch.save({"w": _BadRebuild()}, path)
    return path


CASES = {
    "zip-member-does-not-inflate": (_deflated_zip, "weights.pt", "corrupt zip archive"),
    "zip-version-unsupported": (_future_zip, "weights.pt", "zip file version"),
    "pickle-string-length-past-the-end": (_huge_string, "raw.pkl", "truncated or corrupt pickle"),
    "rebuild-called-with-wrong-arguments": (_bad_rebuild, "weights.pt", "truncated or corrupt"),
    "safetensors-shape-not-a-list": (
        lambda p: _safetensors(p, {"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}}),
        "model.safetensors",
        "corrupt safetensors header (entry 'w')",
    ),
    "safetensors-entry-without-dtype": (
        lambda p: _safetensors(p, {"w": {"shape": [4], "data_offsets": [0, 16]}}),
        "model.safetensors",
        "corrupt safetensors header (entry 'w')",
    ),
    "safetensors-offsets-reversed": (
        lambda p: _safetensors(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}),
        "model.safetensors",
        "corrupt safetensors header (entry 'w')",
    ),
    "safetensors-metadata-not-strings": (
        lambda p: _safetensors(
            p,
            {
                "__metadata__": {"curvcal.arch": 3},
                "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            },
        ),
        "model.safetensors",
        "corrupt safetensors header (__metadata__)",
    ),
}


@pytest.mark.parametrize("command", ["inspect", "calibrate"])
@pytest.mark.parametrize("name", list(CASES))
def test_corrupt_checkpoint_is_an_input_error(
    name: str, command: str, tmp_path: Path, run_cli, monkeypatch
) -> None:
    make, filename, why = CASES[name]
    path = make(tmp_path / filename)
    before = path.read_bytes()
    monkeypatch.chdir(tmp_path)
    extra = []
    if command == "calibrate":
        extra = ["--arch", "curvcal:DigitsCNN", "--data", "curvcal:digits", "--device", "cpu"]

    result = run_cli(command, path, *extra)

    assert result.code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"curvcal: error: {path}"), result.stderr
    assert why in lines[0], lines[0]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [filename]


def test_legacy_checkpoint_cut_anywhere_near_its_end(tmp_path: Path, run_cli) -> None:
    """A legacy (non-zip) torch.save file cut inside its last pickles or its storage sizes
    (struct.error, IndexError, EOFError from torch's reader) is an input error at every cut."""
    whole = tmp_path / "whole.pt"
    torch.save({"w": torch.zeros(3)}, whole, _use_new_zipfile_serialization=False)
    content = whole.read_bytes()
    path = tmp_path / "legacy.pt"
    for cut in range(len(content) - 64, len(content)):
        path.write_bytes(content[:cut])
        result = run_cli("inspect", path)
        assert result.code == 2, (cut, result.output)
        assert result.stderr.count("curvcal: error:") == 1, (cut, result.stderr)
        assert "internal error" not in result.stderr, (cut, result.stderr)


@pytest.mark.parametrize(
    "config",
    [b'{"config": {"w": "\xe5"}}', b'{"config": [1]}', b'{"config": {"w": {"tensor_meta": 3}}}'],
    ids=["not-utf8", "not-a-table", "entry-not-a-table"],
)
def test_exported_program_with_a_corrupt_weights_config_is_listed_without_weights(
    config: bytes, tmp_path: Path, run_cli
) -> None:
    """inspect reads an exported program's weight list from its JSON config; a config that is
    not UTF-8 JSON of that shape lists no weights instead of ending in "internal error"."""
    path = tmp_path / "exp.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("exp/archive_format", "pt2")
        archive.writestr("exp/data/weights/model_weights_config.json", config)
    result = run_cli("inspect", path, "--json")
    assert result.code == 0, result.output
    report = json.loads(result.stdout)
    assert report["results"]["format"] == "exported_program", report["results"]
