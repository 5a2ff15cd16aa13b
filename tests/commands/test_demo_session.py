"""`curvcal demo` in one run session: the digits predicted once under the NaN policy, and the
run under torchrun (gloo, CPU, two processes) judged on the numbers of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from console_text import shown
from safetensors import safe_open
from safetensors.torch import save_file

from curvcal.assets import demo_checkpoint
from tests.scale.launch import torchrun_json

ROOT = Path(__file__).resolve().parents[2]


def test_nan_weights_stop_the_demo_naming_the_checkpoint(run_cli, tmp_path, monkeypatch) -> None:
    """A NaN weight is refused at load, naming the file and the parameter (it was exit 3, the
    NaN logits blamed on --data curvcal:digits)."""
    with safe_open(str(demo_checkpoint()), "pt") as bundled:
        tensors = {name: bundled.get_tensor(name) for name in bundled.keys()}  # noqa: SIM118
        metadata = bundled.metadata()
    bias = [name for name in tensors if name.endswith("bias")][-1]  # the classifier's
    tensors[bias] = torch.full_like(tensors[bias], float("nan"))
    broken = tmp_path / "nan.safetensors"
    save_file(tensors, str(broken), metadata)
    monkeypatch.setattr("curvcal.assets.demo_checkpoint", lambda: broken)

    result = run_cli("demo", "--json")

    assert result.code == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("curvcal: error")]
    n = tensors[bias].numel()
    assert errors == [
        f"curvcal: error: {shown(broken, ':')} parameter {bias} holds {n} NaN or infinite values "
        f"(of {n}) in the file's weights; every product and metric would be NaN (check the "
        "training run that saved it)"
    ]


@pytest.mark.slow
def test_demo_under_torchrun_matches_one_process(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    distributed = torchrun_json(["demo", "-o", str(out)], tmp_path)
    assert json.loads(out.read_text()) == distributed

    single = run_cli("demo", "--json")
    assert single.code == 0, single.stderr
    reference = json.loads(single.stdout)

    assert distributed["settings"] == {**reference["settings"]}
    got, expected = distributed["results"], reference["results"]
    assert got["hessian"]["operator"]["world_size"] == 2
    assert got["hessian"]["operator"]["n_samples"] == expected["n_samples"] == 797
    assert got["accuracy"] == expected["accuracy"]
    assert got["hessian"]["eigenvalues"] == pytest.approx(
        expected["hessian"]["eigenvalues"], rel=1e-4
    )
    assert got["hessian"]["trace"]["estimate"] == pytest.approx(
        expected["hessian"]["trace"]["estimate"], rel=1e-4
    )
    for stage in ("uncalibrated", "ts", "focal_ts"):
        assert got["calibration"]["evaluation"][stage]["ece"] == pytest.approx(
            expected["calibration"]["evaluation"][stage]["ece"], rel=1e-6
        )
    assert got["check"]["passed"] is expected["check"]["passed"] is True
