"""`--method vector|matrix` through `curvcal metrics`: fitted, tabled, saved, applied, gated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from curvcal.policy.parse import load_policy
from curvcal.policy.settings import needs
from tests.commands.test_metrics import as_json, logits_file, one_line_error


@pytest.mark.parametrize("method", ["vector", "matrix"])
def test_fit_save_and_apply_reproduce_the_evaluation(run_cli, tmp_path: Path, method: str) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", method, "--save-calibrator", calibrator, "--json")
    fitted = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    assert fitted["evaluation"]["ts"] is None and fitted["evaluation"]["focal_ts"] is None
    assert set(fitted["evaluation"]) == {"uncalibrated", "ts", "focal_ts", method}
    record = fitted["fits"][method]
    assert record["converged"] and record["gradient_max"] < record["gradient_tol"]
    assert record["nll_after"] < record["nll_before"]  # over-confident scores
    assert fitted["evaluation"][method]["nll"] < fitted["evaluation"]["uncalibrated"]["nll"]

    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.2" and saved["ts"] is None and saved["focal_ts"] is None
    assert saved[method]["method"] == method and len(saved[method]["bias"]) == 4
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    assert applied["applied"][method] == saved[method]
    for metric in ("ece", "nll", "brier", "adaece"):
        assert applied["evaluation"][method][metric] == pytest.approx(
            fitted["evaluation"][method][metric], rel=1e-12
        )
    table = run_cli("metrics", test, "--fit", fit, "--method", method)
    assert table.code == 0 and "linear maps" in table.stdout and "converged" in table.stdout


def test_ts_runs_keep_their_keys_and_schema(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 150, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--fit", fit, "--gammas", "0,1", "--save-calibrator", calibrator, "--json")
    results = as_json(run_cli("metrics", test, *args))["results"]
    assert set(results["evaluation"]) == {"uncalibrated", "ts", "focal_ts"}
    assert set(results["fits"]) == {"ts", "focal_ts"}
    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.1"
    assert set(saved) == {"schema", "curvcal", "ts", "focal_ts", "provenance"}


def test_tampered_saved_map_is_one_line_naming_the_file(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 150, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    run_cli("metrics", test, "--fit", fit, "--method", "vector", "--save-calibrator", calibrator)
    saved = json.loads(calibrator.read_text())
    for entry, needle in (
        ({**saved["vector"], "weights": "__import__('os')"}, "non-empty list of numbers"),
        ({**saved["vector"], "bias": [0.0, 0.0]}, "bias has 2 entries where K = 3"),
        ({**saved["vector"], "method": "matrix"}, "'vector' must be a 'vector' calibrator"),
    ):
        calibrator.write_text(json.dumps({**saved, "vector": entry}))
        one_line_error(run_cli("metrics", test, "--apply", calibrator), str(calibrator), needle)
    calibrator.write_text(json.dumps({**saved, "schema": "1.1"}))
    one_line_error(
        run_cli("metrics", test, "--apply", calibrator), "schema 1.1 calibrator file has no"
    )


@pytest.mark.parametrize("method", ["vector", "matrix"])
def test_nan_in_the_fit_file_is_one_line(run_cli, tmp_path: Path, method: str) -> None:
    test = logits_file(tmp_path / "test.npz", 50, 3, seed=3)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((40, 3))
    logits[7, 2] = np.nan
    fit = tmp_path / "fit.npz"
    np.savez(fit, logits=logits, labels=rng.integers(0, 3, 40))
    one_line_error(run_cli("metrics", test, "--fit", fit, "--method", method), str(fit), "row 7")


def test_unknown_method_names_the_choices(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 50, 3, seed=3)
    result = run_cli("metrics", test, "--val-split", "0.5", "--method", "dirichlet-l3")
    assert result.code == 2 and "vector" in result.stderr and "matrix" in result.stderr


def test_policy_gates_a_linear_map_alone(tmp_path: Path) -> None:
    path = tmp_path / "gate.toml"
    path.write_text("[vector.ece]\nmax = 0.1\n[matrix.nll]\nmax = 2\n")
    assert needs(load_policy(path).rules, str(path)).method == "all"  # one method fits both
    path.write_text("[vector.ece]\nmax = 0.1\n[ece]\nmax = 0.5\n")
    need = needs(load_policy(path).rules, str(path))
    assert need.method == "vector" and need.predictions and not need.ts
    path.write_text("[matrix.ece]\nmax = 0.1\n[ts.ece]\nmax = 0.5\n")
    assert needs(load_policy(path).rules, str(path)).method == "all"


def test_compare_gates_the_vector_stage(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    report = tmp_path / "new.json"
    assert run_cli("metrics", test, "--fit", fit, "--method", "vector", "-o", report).code == 0
    ece = json.loads(report.read_text())["results"]["evaluation"]["vector"]["ece"]
    policy = tmp_path / "gate.toml"
    policy.write_text(f"[vector.ece]\nmax = {ece + 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 0
    policy.write_text(f"[vector.ece]\nmax = {ece - 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 1
