"""Bad inputs of histogram binning, isotonic regression, Platt and beta calibration: one line,
exit 2, naming the option or file, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.commands.test_metrics import logits_file, one_line_error
from tests.console_text import said


def scores_file(path: Path, n: int, k: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, logits=3 * rng.standard_normal((n, k)), labels=rng.integers(0, k, n))
    return path


@pytest.mark.parametrize("method", ["platt", "beta"])
def test_binary_maps_refuse_ten_classes(run_cli, tmp_path: Path, method: str) -> None:
    fit = scores_file(tmp_path / "fit.npz", 60, 10)
    test = scores_file(tmp_path / "test.npz", 40, 10, seed=1)
    out = tmp_path / "cal.json"
    result = run_cli("metrics", test, "--fit", fit, "--method", method, "--save-calibrator", out)
    one_line_error(result, f"--method {method}", "binary problems (K = 2)", "10 classes")
    assert not out.exists()


@pytest.mark.parametrize("method", ["histogram", "histogram-ovr"])
def test_too_few_fit_samples_for_the_bins(run_cli, tmp_path: Path, method: str) -> None:
    fit = scores_file(tmp_path / "fit.npz", 12, 3)
    test = scores_file(tmp_path / "test.npz", 20, 3, seed=1)
    args = ("--fit", fit, "--method", method, "--histogram-bins", "15")
    one_line_error(
        run_cli("metrics", test, *args), "--histogram-bins", "15 bins need at least 15", "has 12"
    )


def test_histogram_options_without_a_histogram_method(run_cli, tmp_path: Path) -> None:
    test = scores_file(tmp_path / "test.npz", 40, 3)
    result = run_cli("metrics", test, "--val-split", "0.5", "--method", "isotonic",
                     "--histogram-bins", "5")  # fmt: skip
    assert result.code == 2 and "--histogram-bins" in result.stderr
    result = run_cli("metrics", test, "--val-split", "0.5", "--method", "histogram",
                     "--histogram-scheme", "quantile")  # fmt: skip
    assert result.code == 2 and "equal-mass" in result.stderr


def test_beta_with_one_class_in_the_fit_split(run_cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    fit = tmp_path / "fit.npz"
    np.savez(fit, logits=rng.standard_normal((30, 2)), labels=np.ones(30, dtype=np.int64))
    test = scores_file(tmp_path / "test.npz", 20, 2, seed=1)
    result = run_cli("metrics", test, "--fit", fit, "--method", "beta")
    # the fit file is described (its missing class warned about) before the map refuses it
    errors = [line for line in result.stderr.splitlines() if line.startswith("curvcal: error:")]
    assert result.code == 2 and "Traceback" not in result.stderr
    assert len(errors) == 1 and "needs both classes" in errors[0]
    assert said(f"{fit}: the labels hold 1 of the model's 2 classes", result.stderr)


def test_saved_binary_map_applied_to_ten_classes(run_cli, tmp_path: Path) -> None:
    fit = scores_file(tmp_path / "fit.npz", 60, 2)
    test = scores_file(tmp_path / "test.npz", 40, 2, seed=1)
    wide = scores_file(tmp_path / "wide.npz", 40, 10, seed=2)
    calibrator = tmp_path / "cal.json"
    run_cli("metrics", test, "--fit", fit, "--method", "platt", "--save-calibrator", calibrator)
    refused = run_cli("metrics", wide, "--apply", calibrator)
    assert refused.code == 2 and "fitted on 2 classes, applied to 10" in refused.stderr
    # forced past the provenance check, the map itself refuses (after the notes and warnings
    # --apply-anyway prints): one error line naming the scores
    result = run_cli("metrics", wide, "--apply", calibrator, "--apply-anyway")
    errors = [line for line in result.stderr.splitlines() if line.startswith("curvcal: error:")]
    assert result.code == 2 and "Traceback" not in result.stderr
    assert len(errors) == 1 and "wide.npz" in errors[0] and "needs 2" in errors[0]


def _flip(row: list) -> list:
    return [row[-1], *row[1:-1], row[0]] if len(row) > 1 else [2.0]


@pytest.mark.parametrize(
    ("stage", "key", "change", "needle"),
    [
        ("isotonic", "x", lambda rows: [_flip(rows[0])], "x must rise strictly"),
        ("isotonic", "y", lambda rows: [[*rows[0][:-1], 2.0]], "y 2.0 is outside 0..1"),
        ("isotonic", "x", lambda rows: "__import__('os')", "list of lists of numbers"),
        ("histogram", "edges", lambda rows: [_flip(rows[0])], "edges must rise strictly"),
        ("histogram", "values", lambda rows: [rows[0][:-1]], "one edge more than it has"),
        ("histogram", "scheme", lambda value: "quantile", "unknown scheme"),
        ("histogram_ovr", "n_classes", lambda value: 5, "needs 5 row(s)"),
        ("isotonic_ovr", "y", lambda rows: rows[:-1], "needs 3 row(s)"),
    ],
)
def test_tampered_saved_maps(
    run_cli, tmp_path: Path, stage: str, key: str, change, needle: str
) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 100, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", stage.replace("_", "-"), "--save-calibrator", calibrator)
    assert run_cli("metrics", test, "--fit", fit, *args).code == 0
    saved = json.loads(calibrator.read_text())
    entry = {**saved[stage], key: change(saved[stage][key])}
    calibrator.write_text(json.dumps({**saved, stage: entry}))
    one_line_error(run_cli("metrics", test, "--apply", calibrator), str(calibrator), needle)


def test_tampered_binary_map_and_old_schema(run_cli, tmp_path: Path) -> None:
    fit = scores_file(tmp_path / "fit.npz", 80, 2)
    test = scores_file(tmp_path / "test.npz", 40, 2, seed=1)
    calibrator = tmp_path / "cal.json"
    run_cli("metrics", test, "--fit", fit, "--method", "beta", "--save-calibrator", calibrator)
    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.3"
    for entry, needle in (
        ({**saved["beta"], "a": "1"}, "a must be a number, got '1'"),
        # a coefficient past 1/T_min: a·ln p overflows and every probability rounds to 0 or 1
        ({**saved["beta"], "a": 1e308}, "a 1e+308 is outside 0..8.5e+37"),
        ({**saved["beta"], "c": 1e308}, "c 1e+308 is outside -8.5e+37..8.5e+37"),
        ({**saved["beta"], "a": float("inf")}, "must be finite"),
        ({"method": "beta", "a": 1.0, "b": 1.0}, "missing keys ['c']"),
        ({**saved["beta"], "slope": 1.0}, "unknown calibrator keys"),
    ):
        calibrator.write_text(json.dumps({**saved, "beta": entry}))
        one_line_error(run_cli("metrics", test, "--apply", calibrator), str(calibrator), needle)
    calibrator.write_text(json.dumps({**saved, "schema": "1.2"}))
    one_line_error(
        run_cli("metrics", test, "--apply", calibrator), "schema 1.2 calibrator file has no 'beta'"
    )
