"""One fitness check before any pass over the data, on every command that runs a model; and the
warning for one-class scores (K = 1)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN


def _checkpoint(path: Path, num_classes: int) -> Path:
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=num_classes, width=1)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(path),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"num_classes": num_classes, "width": 1}),
        },
    )
    return path


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Digits-shaped data (10 labels), three-channel data the model cannot take, a model that
    fits, one with 3 classes and one with a single output."""
    generator = torch.Generator().manual_seed(0)
    save_file(
        {"x": torch.randn(20, 1, 8, 8, generator=generator), "y": torch.arange(20) % 10},
        str(tmp_path / "digits.safetensors"),
    )
    save_file(
        {"x": torch.randn(20, 3, 8, 8, generator=generator), "y": torch.arange(20) % 10},
        str(tmp_path / "rgb.safetensors"),
    )
    save_file(
        {
            "x": torch.randn(20, 1, 8, 8, generator=generator),
            "y": torch.zeros(20, dtype=torch.int64),
        },
        str(tmp_path / "one_class.safetensors"),
    )
    _checkpoint(tmp_path / "fits.safetensors", 10)
    _checkpoint(tmp_path / "three.safetensors", 3)
    _checkpoint(tmp_path / "single.safetensors", 1)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _no_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass over the data fails the test: the misfit must be found before one."""

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a pass over the data started before the fitness check")

    for target in (
        "curvcal.pipeline.inference.predict_logits",
        "curvcal.curvature.analysis.analyse_hessian_with_messages",
        "curvcal.curvature.analysis.analyse_batches",
    ):
        monkeypatch.setattr(target, forbidden)


def _policy(path: Path, data: str, fit_data: str | None = None) -> Path:
    fit = f'fit_data = "{fit_data}"\n' if fit_data else ""
    path.write_text(f'[settings]\ndata = "{data}"\n{fit}\n[ts.ece]\nmax = 1\n')
    return path


SHAPE = "cannot run on inputs of shape (3, 8, 8)"
LABELS = "out of range for a model with 3 outputs"

# (command line, the checkpoint and data the refusal names, why)
MISFITS = [
    (["hessian", "fits.safetensors", "--data", "rgb.safetensors"], "fits", "--data rgb", SHAPE),
    (["hessian", "three.safetensors", "--data", "digits.safetensors"], "three", "--data", LABELS),
    (["calibrate", "fits.safetensors", "--data", "rgb.safetensors"], "fits", "--data rgb", SHAPE),
    (
        ["calibrate", "three.safetensors", "--data", "digits.safetensors"],
        "three",
        "--data digits",
        LABELS,
    ),
    (
        [
            "calibrate",
            "fits.safetensors",
            "--data",
            "digits.safetensors",
            "--fit-data",
            "rgb.safetensors",
        ],
        "fits",
        "--fit-data rgb",
        SHAPE,
    ),
    (["check", "fits.safetensors", "--policy", "rgb.toml"], "fits", "data rgb", SHAPE),
    (["check", "three.safetensors", "--policy", "digits.toml"], "three", "data digits", LABELS),
    (["check", "fits.safetensors", "--policy", "fit.toml"], "fits", "fit_data rgb", SHAPE),
    (
        ["study", "fits.safetensors", "three.safetensors", "--data", "digits.safetensors"],
        "three",
        "--data digits",
        LABELS,
    ),
    (
        [
            "study",
            "fits.safetensors",
            "--data",
            "digits.safetensors",
            "--curvature-data",
            "rgb.safetensors",
        ],
        "fits",
        "--curvature-data rgb",
        SHAPE,
    ),
    (["demo"], "three", "--data curvcal:digits", "has 10 classes but the model has 3 outputs"),
]


@pytest.mark.parametrize(
    ("args", "checkpoint", "data", "why"),
    MISFITS,
    ids=[f"{m[0][0]}:{m[1]}:{m[2]}" for m in MISFITS],
)
def test_a_misfit_is_refused_before_any_pass(
    args: list[str],
    checkpoint: str,
    data: str,
    why: str,
    workspace: Path,
    run_cli: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _policy(workspace / "rgb.toml", "rgb.safetensors")
    _policy(workspace / "digits.toml", "digits.safetensors")
    _policy(workspace / "fit.toml", "digits.safetensors", "rgb.safetensors")
    if args == ["demo"]:
        monkeypatch.setattr(
            "curvcal.assets.demo_checkpoint", lambda: workspace / "three.safetensors"
        )
    _no_pass(monkeypatch)

    result = run_cli(*args, "--batch-size", "8") if args[0] != "check" else run_cli(*args)

    assert result.code == 2, result.output
    lines = result.stderr.strip().splitlines()
    error = [line for line in lines if line.startswith("curvcal: error: ")]
    assert len(error) == 1, result.stderr
    assert f"{checkpoint}.safetensors on {data}" in error[0]
    assert why in error[0]


def test_metrics_warns_that_one_class_has_no_calibration(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    np.savez(
        workspace / "k1.npz",
        logits=np.random.default_rng(0).normal(size=(30, 1)).astype(np.float32),
        labels=np.zeros(30, np.int64),
    )
    result = run_cli("metrics", "k1.npz", "--json")
    assert result.code == 0, result.output
    assert "one class (K = 1): calibration is undefined" in result.stderr
    report = json.loads(result.stdout)
    assert any("calibration is undefined" in w for w in report["warnings"])
    # the metrics are still reported, and are the trivial ones the warning announces
    uncalibrated = report["results"]["evaluation"]["uncalibrated"]
    assert uncalibrated["ece"] == 0.0 and uncalibrated["accuracy"] == 1.0


def test_metrics_with_two_classes_does_not_warn(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    np.savez(
        workspace / "k2.npz",
        logits=np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32),
        labels=np.arange(30) % 2,
    )
    result = run_cli("metrics", "k2.npz", "--json")
    assert result.code == 0, result.output
    assert "K = 1" not in result.stderr
    assert json.loads(result.stdout)["warnings"] == []


def test_calibrate_warns_for_a_one_output_model(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    result = run_cli("calibrate", "single.safetensors", "--data", "one_class.safetensors", "--json")
    assert result.code == 0, result.output
    assert "single.safetensors: one class (K = 1)" in result.stderr
    report = json.loads(result.stdout)
    assert any("calibration is undefined" in w for w in report["warnings"])
