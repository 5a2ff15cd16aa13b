"""No option but --trust-checkpoint lets a file run code: --allow-global admits plain data classes.

Each payload below is real (a full unpickling creates the marker file, checked first), and each is
handed to every command that loads a checkpoint together with the --allow-global names it would
need. Every command must stop with exit 2 and one line naming the refused global, and the marker
must never appear.
"""

from __future__ import annotations

import functools
import operator
import os
import subprocess
from pathlib import Path

import pytest
import torch
from test_malicious_checkpoints import _Reduce

from curvcal.models import DigitsCNN


class _Callable(_Reduce):
    """A reduce whose result is then called (the pickler wants the callable slot callable)."""

    def __call__(self, *args: object) -> object:
        raise AssertionError("only the unpickled object is ever called")


def _payload(kind: str, marker: Path) -> tuple[object, tuple[str, ...]]:
    """A pickle payload that creates ``marker``, and the --allow-global names it needs."""
    touch = f"touch {marker}"
    if kind == "exec":
        return _Reduce(exec, f"open({str(marker)!r}, 'w').close()"), ("builtins.exec",)
    if kind == "eval":
        return _Reduce(eval, f"open({str(marker)!r}, 'w')"), ("builtins.eval",)
    if kind == "system":
        return _Reduce(os.system, touch), (f"{os.system.__module__}.system", "os.system")
    if kind == "getattr-chain":
        system = _Callable(getattr, _Reduce(__import__, "os"), "system")
        return _Reduce(system, touch), ("builtins.getattr", "builtins.__import__")
    if kind == "popen":
        return _Reduce(subprocess.Popen, ["touch", str(marker)]), ("subprocess.Popen",)
    if kind == "partial":
        call = _Callable(functools.partial, subprocess.call, ["touch", str(marker)])
        return _Reduce(call), ("functools.partial", "subprocess.call")
    if kind == "methodcaller":
        caller = _Callable(operator.methodcaller, "system", touch)
        return _Reduce(caller, _Reduce(__import__, "os")), (
            "operator.methodcaller",
            "builtins.__import__",
        )
    raise AssertionError(kind)


KINDS = ("exec", "eval", "system", "getattr-chain", "popen", "partial", "methodcaller")


def _checkpoint(folder: Path, kind: str) -> tuple[Path, Path, tuple[str, ...]]:
    marker = folder / f"pwned-{kind}"
    payload, names = _payload(kind, marker)
    state = DigitsCNN(num_classes=3, width=1).state_dict()
    path = folder / f"{kind}.pt"
    torch.save({"state_dict": state, "extra": payload}, path)
    return path, marker, names


@pytest.mark.parametrize("kind", KINDS)
def test_the_payloads_are_real(kind: str, tmp_path: Path) -> None:
    """A full unpickling (what --trust-checkpoint does) runs each payload: the tests below
    cannot pass because a payload is broken."""
    path, marker, _names = _checkpoint(tmp_path, kind)
    loaded = torch.load(path, weights_only=False)
    if isinstance(loaded["extra"], subprocess.Popen):
        loaded["extra"].wait()
    assert marker.exists()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "d.pt"
    torch.save({"x": torch.randn(6, 1, 8, 8), "y": torch.tensor([0, 1, 2, 0, 1, 2])}, path)
    return path


def _command(command: str, path: Path, data: Path) -> list[object]:
    arch = ["--arch", "curvcal:DigitsCNN", "-k", "width=1", "--device", "cpu"]
    if command == "inspect":
        return ["inspect", path]
    if command == "check":
        policy = path.parent / "gate.toml"
        policy.write_text(f'[settings]\ndata = "{data}"\n[ece]\nmax = 0.9\n')
        return ["check", path, "--policy", policy, *arch]
    if command == "study":
        return ["study", path, "--data", data, "--probes", "4", *arch]
    return [command, path, "--data", data, *arch]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["inspect", "hessian", "calibrate", "check", "study"])
def test_allow_global_never_admits_code(
    command: str, kind: str, tmp_path: Path, data: Path, run_cli
) -> None:
    path, marker, names = _checkpoint(tmp_path, kind)
    before = path.read_bytes()
    for name in names:
        result = run_cli(*_command(command, path, data), "--allow-global", name)
        assert result.code == 2 and result.stdout == "", result.stderr
        line = result.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert line.startswith("curvcal: error: ")  # study puts the checkpoint's name first
        assert f"--allow-global {name}: " in line
        assert "only --trust-checkpoint runs code from a file" in line
    together = [arg for name in names for arg in ("--allow-global", name)]
    result = run_cli(*_command(command, path, data), *together)
    assert result.code == 2 and f"--allow-global {names[0]}: " in result.stderr
    assert not marker.exists()
    assert path.read_bytes() == before


def test_the_refusal_of_a_payload_does_not_suggest_allow_global(tmp_path: Path, run_cli) -> None:
    path, marker, _names = _checkpoint(tmp_path, "exec")
    result = run_cli("inspect", path, "--json")
    assert result.code == 0
    refused = run_cli("hessian", path, "--arch", "curvcal:DigitsCNN", "--data", "curvcal:digits")
    assert refused.code == 2 and "builtins.exec" in refused.stderr
    assert "--trust-checkpoint" in refused.stderr and "--allow-global" not in refused.stderr
    assert not marker.exists()
