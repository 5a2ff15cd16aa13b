"""`curvcal study` takes its curvature options from HessianSettings (declared once, so the
defaults cannot drift from `curvcal hessian`'s), measures through the same analysis as
`curvcal hessian`, and its table's columns say what was asked (the bin count)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import torch
from safetensors.torch import save_file

from curvcal.commands.hessian import hessian
from curvcal.commands.study import study
from curvcal.models import DigitsCNN
from curvcal.settings.fields import defaults
from curvcal.settings.hessian import HessianSettings
from curvcal.settings.study import STUDY_HESSIAN_OPTIONS

WIDTH = 2


def _defaults(command: click.Command) -> dict[str, object]:
    """``{parameter: value}`` the command receives when none of its options is typed."""
    context = command.make_context(str(command.name), ["model.pt", "--data", "data.pt"])
    return dict(context.params)


def test_study_curvature_options_are_hessian_settings_fields_with_its_defaults() -> None:
    ours, theirs = _defaults(study), _defaults(hessian)
    declared = defaults(HessianSettings)
    for name in STUDY_HESSIAN_OPTIONS:
        assert name in ours and name in theirs, name
        assert ours[name] == theirs[name] == declared[name], name
    assert ours["probes"] == 100  # was 50 in study, 100 in hessian
    assert ours["method"] is None  # Lanczos, as in hessian


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 8, 8, generator=generator)
    y = torch.arange(40) % 10
    save_file({"x": x, "y": y}, str(tmp_path / "data.safetensors"))
    torch.manual_seed(1)
    model = DigitsCNN(width=WIDTH)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "model.safetensors"),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"width": WIDTH}),
            "curvcal.loss": "focal",
            "curvcal.gamma": "2",
        },
    )
    return tmp_path


def test_study_measures_what_hessian_measures(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    """The same checkpoint, data and options: study's λmax and tr(H) are hessian's, bit for bit
    (one analysis, one auto trace choice), and its settings record the Hessian's group."""
    data = str(workspace / "data.safetensors")
    model = str(workspace / "model.safetensors")
    shared = ("--loss", "own", "--probes", "6", "--tol", "1e-8", "--seed", "5")
    common = ("--data", data, "--dtype", "float64", "--device", "cpu", "--batch-size", "16")
    studied = run_cli("study", model, *common, *shared, "--gammas", "0,1", "--json")
    assert studied.code == 0, studied.stderr  # type: ignore[attr-defined]
    measured = run_cli("hessian", model, *common, *shared, "--json")
    assert measured.code == 0, measured.stderr  # type: ignore[attr-defined]
    document = json.loads(studied.stdout)  # type: ignore[attr-defined]
    reference = json.loads(measured.stdout)  # type: ignore[attr-defined]
    (row,) = document["results"]["rows"]
    curvature, results = row["curvature"], reference["results"]
    assert curvature["lambda_max"] == results["lambda_max"]
    assert curvature["trace"] == results["trace"]["estimate"]
    assert curvature["trace_method"] == results["trace"]["method"]
    assert curvature["loss"] == results["operator"]["loss"] == "focal"
    assert curvature["gamma"] == results["operator"]["gamma"] == 2.0
    assert curvature["mean_loss"] == results["operator"]["mean_loss"]
    assert document["settings"]["hessian"] == reference["settings"]["hessian"]
    assert document["settings"]["study"] == {
        "curvature_data": None,
        "maps": "both",
        "plot": None,
        "plot_format": "png",
    }


def test_the_ece_column_names_the_bins_asked_for(
    workspace: Path, run_cli: Callable[..., object]
) -> None:
    data = str(workspace / "data.safetensors")
    model = str(workspace / "model.safetensors")
    fast = ("--probes", "4", "--tol", "1e-3", "--gammas", "0,1", "--batch-size", "16")
    result = run_cli("study", model, "--data", data, *fast, "--bins", "7", "--json")
    assert result.code == 0, result.stderr  # type: ignore[attr-defined]
    columns = json.loads(result.stdout)["results"]["columns"]  # type: ignore[attr-defined]
    assert columns["ECE"].startswith("7-bin top-label ECE")
    assert json.loads(result.stdout)["settings"]["calibration"]["bins"] == 7  # type: ignore[attr-defined]
