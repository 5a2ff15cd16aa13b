"""`curvcal inspect` through the real CLI entry point."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from curvcal.report.inspect import TENSOR_ROWS

RunCli = Callable[..., Any]


def test_inspect_json_report(run_cli: RunCli, tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    path = tmp_path / "w.pt"
    torch.save({"model_state_dict": model.state_dict(), "epoch": 9}, path)

    result = run_cli("inspect", path, "--json")

    assert result.code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["command"] == "inspect" and body["status"] == "ok"
    checkpoint = body["inputs"]["checkpoint"]
    assert checkpoint["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert checkpoint["size_bytes"] == path.stat().st_size
    results = body["results"]
    assert results["format"] == "state_dict"
    assert results["state_dict_key"] == "model_state_dict"
    assert results["num_classes"] == 2
    assert results["parameter_count"] == 4 * 3 + 3 + 3 * 2 + 2
    assert results["tensors"][0] == {"name": "0.weight", "shape": [3, 4], "dtype": "float32"}
    assert results["metadata"] == {"epoch": "9"}


def test_inspect_table_truncates_long_tensor_lists(run_cli: RunCli, tmp_path: Path) -> None:
    state = {f"layer{i}.weight": torch.zeros(2, 2) for i in range(TENSOR_ROWS + 10)}
    torch.save(state, tmp_path / "many.pt")
    result = run_cli("inspect", tmp_path / "many.pt", "--format", "markdown")
    assert result.code == 0, result.stderr
    assert "layer39.weight" in result.stdout and "layer40.weight" not in result.stdout
    assert "and 10 more" in result.stdout


def test_inspect_never_runs_a_malicious_pickle(run_cli: RunCli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Payload()}, path)

    result = run_cli("inspect", path, "--format", "markdown")

    assert result.code == 0, result.stderr
    assert "io.open" in result.stdout
    assert not marker.exists()


def _empty(d: Path) -> Path:
    (d / "empty.pt").write_bytes(b"")
    return d / "empty.pt"


def _random(d: Path) -> Path:
    (d / "noise.bin").write_bytes(bytes(range(256)) * 8)
    return d / "noise.bin"


def _truncated(d: Path) -> Path:
    torch.save({"w": torch.zeros(100)}, d / "full.pt")
    (d / "cut.pt").write_bytes((d / "full.pt").read_bytes()[:-200])
    return d / "cut.pt"


def _directory(d: Path) -> Path:
    (d / "dir.pt").mkdir()
    return d / "dir.pt"


def _missing(d: Path) -> Path:
    return d / "nope.pt"


def _unknown(d: Path) -> Path:
    (d / "model.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    return d / "model.h5"


@pytest.mark.parametrize("make", [_empty, _random, _truncated, _directory, _missing, _unknown])
def test_inspect_bad_files(make: Callable[[Path], Path], run_cli: RunCli, tmp_path: Path) -> None:
    path = make(tmp_path)
    result = run_cli("inspect", path)
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"curvcal: error: {path}: ")
    assert "Traceback" not in result.stderr


def test_inspect_bad_allow_global(run_cli: RunCli, tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(1)}, tmp_path / "w.pt")
    result = run_cli("inspect", tmp_path / "w.pt", "--allow-global", "nowhere.Nothing")
    assert result.code == 2
    assert result.stderr.startswith(
        "curvcal: error: --allow-global nowhere.Nothing: cannot be imported"
    )
