"""Precise one-line messages through the real CLI: plain pickles, path failures, long values."""

from __future__ import annotations

import collections
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from test_malicious_checkpoints import _Reduce

from tests.console_text import said, shown

DIGITS = ["--arch", "curvcal:DigitsCNN", "--device", "cpu"]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A working checkpoint, dataset, logits file and policy for the commands to start from."""
    from curvcal.assets import demo_checkpoint

    root = tmp_path_factory.mktemp("good")
    torch.save({"x": torch.randn(6, 1, 8, 8), "y": torch.tensor([0, 1, 2, 0, 1, 2])}, root / "d.pt")
    np.savez(root / "l.npz", logits=np.eye(3) * 2, labels=np.arange(3))
    (root / "p.toml").write_text("[ece]\nmax = 0.9\n")
    return {"model": demo_checkpoint(), "data": root / "d.pt", "logits": root / "l.npz",
            "policy": root / "p.toml"}  # fmt: skip


def _one_line(result: object, starts: str) -> str:
    assert result.code == 2 and result.stdout == "", result.stderr  # type: ignore[attr-defined]
    line = result.stderr.strip()  # type: ignore[attr-defined]
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"curvcal: error: {starts}"), line
    return line


def test_a_plain_pickle_is_named_and_inspected_without_running(
    tmp_path: Path, good: dict[str, Path], run_cli
) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    payload = [collections.OrderedDict(a=1), _Reduce(os.system, f"touch {marker}")]
    path.write_bytes(pickle.dumps(payload))
    result = run_cli("inspect", path, "--json")
    assert result.code == 0, result.stderr
    info = json.loads(result.stdout)["results"]
    assert info["format"] == "plain_pickle" and info["container"] == "pickle"
    system = f"{os.system.__module__}.system"
    assert info["pickle_globals"] == ["collections.OrderedDict", system]
    assert info["unsafe_globals"] == [system]  # OrderedDict is on torch's weights-only list
    assert "not a torch.save checkpoint" in info["metadata"]["note"]
    table = run_cli("inspect", path)
    assert said("pickle globals", table.stdout)
    assert said("not a torch.save checkpoint", table.stdout)
    for command in ("hessian", "calibrate"):
        args = [command, path, "--data", good["data"], *DIGITS, "--trust-checkpoint"]
        line = _one_line(
            run_cli(*args), f"{shown(path, ':')} is a plain Python pickle, not a torch.save"
        )
        assert system in line
    assert not marker.exists()


def test_a_plain_pickle_of_a_dict_is_not_called_corrupt(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "raw.pkl"
    path.write_bytes(pickle.dumps({"a": 1}))
    line = _one_line(run_cli("check", path, "--policy", path), f"{shown(path, ':')} ")
    assert "corrupt" not in line
    result = run_cli("inspect", path, "--json")
    assert json.loads(result.stdout)["results"]["pickle_globals"] == []


def _bad_paths(folder: Path) -> dict[str, tuple[Path, str]]:
    loop = folder / "loop.pt"
    loop.symlink_to(loop)
    broken = folder / "broken.npz"
    broken.symlink_to(folder / "gone.npz")
    return {
        "loop": (loop, "is a symbolic link loop (too many levels of symbolic links)"),
        "broken": (broken, "is a broken symbolic link"),
        "missing": (folder / "absent.pt", "no such"),
    }


@pytest.mark.parametrize("failure", ["loop", "broken", "missing"])
@pytest.mark.parametrize(
    "role", ["inspect", "hessian", "study", "data", "logits", "policy", "baseline", "apply"]
)
def test_every_input_path_failure_is_told_apart(
    role: str, failure: str, tmp_path: Path, good: dict[str, Path], run_cli
) -> None:
    bad, why = _bad_paths(tmp_path)[failure]
    model, data = good["model"], good["data"]
    args: list[object] = {
        "inspect": ["inspect", bad],
        "hessian": ["hessian", bad, "--data", data, *DIGITS],
        "study": ["study", bad, "--data", data, *DIGITS],
        "data": ["hessian", model, "--data", bad, "--device", "cpu"],
        "logits": ["metrics", bad],
        "policy": ["check", model, "--policy", bad, "--device", "cpu"],
        "baseline": ["check", model, "--policy", good["policy"], "--baseline", bad],
        "apply": ["metrics", good["logits"], "--apply", bad],
    }[role]
    line = _one_line(run_cli(*args), f"{shown(bad, ':')} ")
    assert why in line


def test_a_directory_is_not_a_checkpoint(tmp_path: Path, good: dict[str, Path], run_cli) -> None:
    for args in (["inspect", tmp_path], ["hessian", tmp_path, "--data", good["data"], *DIGITS]):
        _one_line(run_cli(*args), f"{shown(tmp_path, ':')} is a directory, not a checkpoint file")


def test_a_trainer_output_folder_names_its_checkpoints_and_the_latest(
    tmp_path: Path, good: dict[str, Path], run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what Trainer(output_dir="out") leaves: checkpoint-N folders (N = 150 sorts before 50 as
    # text: the latest is the largest step), logs, and no config.json of its own
    monkeypatch.chdir(tmp_path)
    for step in (50, 150, 100):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
        (tmp_path / "out" / f"checkpoint-{step}" / "config.json").write_text("{}")
    (tmp_path / "out" / "runs").mkdir()
    (tmp_path / "out" / "checkpoint-notes.txt").write_text("not a checkpoint")
    for args in (["inspect", "out"], ["hessian", "out", "--data", good["data"], *DIGITS]):
        line = _one_line(run_cli(*args), "out: is a directory, not a checkpoint file")
        assert (
            "it holds Trainer checkpoints checkpoint-50, checkpoint-100, checkpoint-150 (" in line
        )
        assert line.endswith("(name one of them, such as the latest, out/checkpoint-150)")
    # a folder holding nothing of the kind keeps the plain hint
    (tmp_path / "empty").mkdir()
    assert "save_pretrained" in _one_line(run_cli("inspect", "empty"), "empty: is a directory")


def test_long_values_are_cut_in_messages(tmp_path: Path, good: dict[str, Path], run_cli) -> None:
    arch = "tv:" + "a" * 99_990 + "END"
    line = _one_line(run_cli("hessian", good["model"], "--arch", arch, "--data", good["data"],
                             "--device", "cpu"), "--arch")  # fmt: skip
    assert len(line) < 400 and "[99,993 characters]" in line and "aaaEND" in line
    long_path = Path(*(["d"] * 30_000), "x.pt")
    line = _one_line(run_cli("inspect", long_path), "d/d/d/")
    assert len(line) < 400 and "[60,004 characters]" in line and "d/d/x.pt" in line
    assert "too long" in line
