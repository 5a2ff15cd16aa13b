"""`curvcal study` end to end on tiny checkpoints written by the test."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

WIDTH = 2


def _checkpoint(path: Path, seed: int, loss: dict[str, str]) -> Path:
    torch.manual_seed(seed)
    model = DigitsCNN(width=WIDTH)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(
        state,
        str(path),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"width": WIDTH}),
            **loss,
        },
    )
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 8, 8, generator=generator)
    y = torch.arange(40) % 10
    save_file({"x": x, "y": y}, str(tmp_path / "data.safetensors"))
    save_file(
        {"x": x[:20].contiguous(), "y": y[:20].contiguous()}, str(tmp_path / "train.safetensors")
    )
    _checkpoint(tmp_path / "a_ce.safetensors", 1, {"curvcal.loss": "ce", "curvcal.gamma": "0"})
    _checkpoint(tmp_path / "b_flsd.safetensors", 2, {"curvcal.loss": "flsd53"})
    return tmp_path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


FAST = ("--probes", "4", "--tol", "1e-3", "--gammas", "0,1,2", "--batch-size", "16")


def test_study_two_checkpoints_json_and_table(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    args = (
        str(workspace / "a_ce.safetensors"),
        str(workspace / "b_flsd.safetensors"),
        "--data",
        str(workspace / "data.safetensors"),
        "--curvature-data",
        str(workspace / "train.safetensors"),
        "--loss",
        "own",
        *FAST,
    )
    result = run_cli("study", *args, "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["command"] == "study" and document["status"] == "ok"
    rows = document["results"]["rows"]
    assert [r["checkpoint"] for r in rows] == ["a_ce.safetensors", "b_flsd.safetensors"]
    assert rows[0]["curvature"]["loss"] == "ce" and rows[1]["curvature"]["loss"] == "flsd53"
    assert rows[1]["training_loss"] == "flsd53" and rows[1]["training_gamma"] is None
    for row in rows:
        assert row["curvature"]["n_samples"] == 20  # the Hessian on --curvature-data
        assert row["calibration"]["n_eval"] + row["calibration"]["n_fit"] == 40
        assert row["curvature"]["lambda_max"] > 0 and row["calibration"]["temperature"] > 0
    assert sum(n for _, n in rows[1]["curvature"]["groups"]) == 20
    inputs = document["inputs"]
    for described, name in zip(inputs["checkpoints"], ("a_ce", "b_flsd"), strict=True):
        assert described["sha256"] == _sha256(workspace / f"{name}.safetensors")
    assert inputs["data"]["files"][0]["sha256"] == _sha256(workspace / "data.safetensors")
    assert inputs["curvature_data"]["files"][0]["sha256"] == _sha256(
        workspace / "train.safetensors"
    )
    assert inputs["data"]["n_samples"] == 40 and inputs["data"]["num_classes"] == 10
    correlations = document["results"]["correlations"]
    assert len(correlations) == 16
    assert all(c["rho"] is None and "at least 3" in c["note"] for c in correlations)
    assert "train.safetensors" in document["results"]["columns"]["λmax"]

    table = run_cli("study", *args, "--format", "markdown")
    assert table.code == 0, table.stderr
    for heading in (
        "H loss",
        "λmax",
        "tr(H)",
        "ECE after FTS",
        "flsd53",
        "Spearman",
        "evaluation split",
    ):
        assert heading in table.stdout


def test_study_glob_three_checkpoints_and_plots(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    _checkpoint(
        workspace / "c_focal.safetensors", 3, {"curvcal.loss": "focal", "curvcal.gamma": "2"}
    )
    plots = workspace / "plots"
    result = run_cli(
        "study",
        str(workspace / "*_*.safetensors"),
        "--data",
        str(workspace / "data.safetensors"),
        "--plot",
        str(plots),
        *FAST,
        "--json",
    )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert len(document["results"]["rows"]) == 3
    assert all(r["curvature"]["loss"] == "ce" for r in document["results"]["rows"])
    defined = [c for c in document["results"]["correlations"] if c["rho"] is not None]
    assert defined and all(-1 <= c["rho"] <= 1 and 0 <= c["p_value"] <= 1 for c in defined)
    assert (plots / "lambda_max_vs_gamma.png").stat().st_size > 0
    assert (plots / "trace_vs_ece.png").stat().st_size > 0


def test_study_bad_inputs(workspace: Path, run_cli: Callable[..., object]) -> None:
    data = ("--data", str(workspace / "data.safetensors"))
    ckpt = str(workspace / "a_ce.safetensors")
    missing = run_cli("study", str(workspace / "nope*.safetensors"), *data)
    assert missing.code == 2 and "no such checkpoint" in missing.stderr
    focal = run_cli("study", ckpt, *data, "--loss", "focal")
    assert focal.code == 2 and "--gamma" in focal.stderr
    twice = run_cli("study", ckpt, ckpt, *data)
    assert twice.code == 2 and "twice" in twice.stderr
    untagged = workspace / "untagged.safetensors"
    save_file(
        {k: v.contiguous() for k, v in DigitsCNN(width=WIDTH).state_dict().items()},
        str(untagged),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"width": WIDTH}),
        },
    )
    own = run_cli("study", str(untagged), *data, "--loss", "own", *FAST)
    assert own.code == 2 and "records no training loss" in own.stderr
