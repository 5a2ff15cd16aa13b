"""Checkpoints that would run code: refused without --trust-checkpoint, through the real CLI.

The payloads are real (a full unpickling runs them, see tests/load/test_checkpoint.py); here the
marker file they would create must never appear, and the refusal must list the globals.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.models import DigitsCNN


class _Reduce:
    """Unpickling calls ``function(*args)``."""

    def __init__(self, function: object, *args: object) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (self.function, self.args)


def _payloads(marker: Path) -> dict[str, object]:
    return {
        "os.system": _Reduce(os.system, f"touch {marker}"),
        "builtins.eval": _Reduce(eval, f"open({str(marker)!r}, 'w')"),
        "builtins.exec": _Reduce(exec, f"open({str(marker)!r}, 'w').close()"),
        "io.open": _Reduce(open, str(marker), "w"),
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "d.pt"
    torch.save({"x": torch.randn(6, 1, 8, 8), "y": torch.tensor([0, 1, 2, 0, 1, 2])}, path)
    return path


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "builtins.exec", "io.open"])
@pytest.mark.parametrize("command", ["calibrate", "hessian", "inspect"])
def test_pickle_payloads_are_refused_and_never_run(
    name: str, command: str, tmp_path: Path, data: Path, run_cli
) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    state = DigitsCNN(num_classes=3, width=1).state_dict()
    torch.save({"state_dict": state, "extra": _payloads(marker)[name]}, path)
    before = path.read_bytes()
    if command == "inspect":
        result = run_cli("inspect", path, "--json")
        assert result.code == 0, result.stderr
        info = json.loads(result.stdout)["results"]
        assert name.split(".")[-1] in " ".join(info["unsafe_globals"]) and info["needs_trust"]
    else:
        args = [command, path, "--arch", "curvcal:DigitsCNN", "-k", "width=1", "--data", data]
        result = run_cli(*args, "--device", "cpu")
        assert result.code == 2 and result.stdout == ""
        line = result.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert line.startswith(f"curvcal: error: {path}: is a pickle that needs ")
        assert name.split(".")[-1] in line and "--trust-checkpoint" in line
    assert not marker.exists()
    assert path.read_bytes() == before


def test_a_raw_pickle_that_is_not_a_torch_file_is_refused(tmp_path: Path, run_cli) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pkl.pt"
    path.write_bytes(pickle.dumps(_payloads(marker)["os.system"]))
    result = run_cli("hessian", path, "--data", "curvcal:digits", "--device", "cpu")
    assert result.code == 2 and result.stderr.startswith(f"curvcal: error: {path}: ")
    assert not marker.exists()


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _script(model: nn.Module, path: Path) -> None:
    with pytest.warns(FutureWarning):
        torch.jit.save(torch.jit.script(copy.deepcopy(model)), str(path))


def _export(model: nn.Module, path: Path) -> None:
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(
        copy.deepcopy(model).eval(), (torch.randn(2, 1, 8, 8),), dynamic_shapes=({0: batch},)
    )
    torch.export.save(program, str(path))


@pytest.mark.parametrize(
    ("form", "save", "why"),
    [
        ("whole.pt", torch.save, "is a pickled"),
        ("scripted.pt", _script, "is a TorchScript archive"),
        ("exported.pt2", _export, "is a torch.export archive"),
    ],
)
def test_code_carrying_forms_need_trust_and_then_load(
    form: str, save, why: str, tmp_path: Path, data: Path, run_cli
) -> None:
    torch.manual_seed(0)
    model = _Tiny()
    path = tmp_path / form
    save(model, path)
    args = ["calibrate", path, "--data", data, "--device", "cpu", "--method", "none", "--json"]
    refused = run_cli(*args)
    assert refused.code == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"curvcal: error: {path}: {why}")
    assert "--trust-checkpoint" in refused.stderr
    if form == "whole.pt":  # the refusal lists the classes the pickle would import
        assert f"{__name__}._Tiny" in refused.stderr
        assert "torch.nn.modules.linear.Linear" in refused.stderr
    trusted = run_cli(*args, "--trust-checkpoint")
    assert trusted.code == 0, trusted.stderr
    assert json.loads(trusted.stdout)["results"]["evaluation"]["uncalibrated"]["n_samples"] == 6


def test_safetensors_never_needs_trust(tmp_path: Path, data: Path, run_cli) -> None:
    model = DigitsCNN(num_classes=3, width=1)
    meta = {
        "curvcal.arch": "curvcal:DigitsCNN",
        "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
    }
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "m.safetensors"),
        meta,
    )
    result = run_cli("calibrate", tmp_path / "m.safetensors", "--data", data, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
