"""`curvcal study --maps`: every calibration map of the registry in the study, each map's ECE
and NLL equal to what `curvcal calibrate` reports for the same checkpoint and split, its ECE
column's Spearman ρ equal to scipy's, and a map that does not apply refused up front."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from scipy.stats import spearmanr

from curvcal.calibration.analysis import analyse_calibration
from curvcal.settings.calibration import CalibrationSettings
from curvcal.study.summary import calibration_summary

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "regenerate.py"
NAMES = ("a_ce", "b_flsd", "c_focal")
SEED = "1"
#: a cheap Hessian: the study's curvature is not under test here
FAST = ("--probes", "4", "--tol", "1e-3", "--batch-size", "16", "--seed", SEED, "--quiet")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden study's three tiny DigitsCNN checkpoints (10 classes) and data."""
    spec = importlib.util.spec_from_file_location("golden_regenerate_maps", GOLDEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("study_maps")
    module.build_workspace(folder)
    return folder


def _study(run_cli: Callable[..., Any], folder: Path, maps: str, names: tuple[str, ...]) -> Any:
    checkpoints = [str(folder / f"{name}.safetensors") for name in names]
    data = str(folder / "data.safetensors")
    return run_cli("study", *checkpoints, "--data", data, "--maps", maps, *FAST, "--json")


def _calibrate(run_cli: Callable[..., Any], folder: Path, name: str, method: str) -> dict[str, Any]:
    """The ground truth: `calibrate`'s own JSON for the same checkpoint, split and seed."""
    result = run_cli(
        "calibrate",
        str(folder / f"{name}.safetensors"),
        "--data",
        str(folder / "data.safetensors"),
        "--method",
        method,
        "--val-split",
        "0.5",
        "--seed",
        SEED,
        "--batch-size",
        "16",
        "--quiet",
        "--json",
    )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)["results"]["evaluation"]


def test_vector_map_matches_calibrate_and_scipy_spearman(
    workspace: Path, run_cli: Callable[..., Any]
) -> None:
    result = _study(run_cli, workspace, "vector", NAMES)
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["study"]["maps"] == "vector"
    assert document["settings"]["calibration"]["method"] == "vector"
    rows = document["results"]["rows"]
    for name, row in zip(NAMES, rows, strict=True):
        calibration = row["calibration"]
        # only the maps fitted: no TS/focal-TS keys, no ranking
        assert set(calibration["maps"]) == {"vector"}
        assert "ece_after_ts" not in calibration and "temperature" not in calibration
        assert "best" not in calibration
        truth = _calibrate(run_cli, workspace, name, "vector")
        assert calibration["maps"]["vector"]["ece"] == pytest.approx(
            truth["vector"]["ece"], rel=1e-9, abs=1e-12
        )
        assert calibration["maps"]["vector"]["nll"] == pytest.approx(
            truth["vector"]["nll"], rel=1e-9
        )
        assert calibration["ece"] == pytest.approx(truth["uncalibrated"]["ece"], rel=1e-9)
    after = [row["calibration"]["maps"]["vector"]["ece"] for row in rows]
    assert len(set(after)) == len(after)  # distinct, so ρ is defined
    by_pair = {(c["curvature"], c["calibration"]): c for c in document["results"]["correlations"]}
    assert {key for _, key in by_pair} == {"ece", "adaece", "nll", "ece_after_vector"}
    for curvature in ("lambda_max", "trace"):
        xs = [row["curvature"][curvature] for row in rows]
        assert by_pair[curvature, "ece_after_vector"]["rho"] == pytest.approx(
            spearmanr(xs, after).statistic, abs=1e-12
        )
    markdown = run_cli(
        "study",
        *(str(workspace / f"{name}.safetensors") for name in NAMES),
        "--data",
        str(workspace / "data.safetensors"),
        "--maps",
        "vector",
        *FAST,
        "--format",
        "markdown",
    )
    assert markdown.code == 0, markdown.stderr
    assert "after calibration: each map per checkpoint" in markdown.stdout
    first = rows[0]["calibration"]["maps"]["vector"]
    assert f"| a_ce.safetensors | vector | {first['ece']:.4g} | {first['nll']:.4g} |" in (
        markdown.stdout
    )
    assert "| λmax | ECE after vector |" in markdown.stdout


def test_laplace_in_study_uses_the_model_as_calibrate_does(
    workspace: Path, run_cli: Callable[..., Any]
) -> None:
    names = NAMES[:2]
    result = _study(run_cli, workspace, "laplace", names)
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)["results"]["rows"]
    for name, row in zip(names, rows, strict=True):
        truth = _calibrate(run_cli, workspace, name, "laplace")["laplace"]
        score = row["calibration"]["maps"]["laplace"]
        assert score["ece"] == pytest.approx(truth["ece"], rel=1e-9, abs=1e-12)
        assert score["nll"] == pytest.approx(truth["nll"], rel=1e-9)


def test_binary_map_on_ten_classes_is_one_line_exit_2(
    workspace: Path, run_cli: Callable[..., Any]
) -> None:
    result = _study(run_cli, workspace, "platt", NAMES[:2])
    assert result.code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "--maps platt" in lines[0] and "a_ce.safetensors" in lines[0]
    assert "10 classes" in lines[0]
    assert result.stdout == ""


def test_best_by_nll_is_the_lowest_nll_of_method_all() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(400, 4, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 4, (400,), generator=generator)
    settings = CalibrationSettings(method="all", seed=0)
    analysis = analyse_calibration(
        logits[:200], labels[:200], logits[200:], labels[200:], "logits", settings, "val-split"
    )
    summary = calibration_summary(analysis, "all")
    assert summary.maps is not None and summary.skipped is not None
    assert set(summary.skipped) == {"laplace", "platt", "beta"}  # K = 4, no model
    nll = {stage: score.nll for stage, score in summary.maps.items()}
    nll["uncalibrated"] = summary.nll
    assert summary.best == min(nll, key=nll.__getitem__)
    assert summary.temperature == analysis.fits.ts.calibrator.temperature  # type: ignore[union-attr]
