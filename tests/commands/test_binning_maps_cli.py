"""`--method histogram|histogram-ovr|isotonic|isotonic-ovr|platt|beta` through `curvcal
metrics`: fitted, tabled, saved, applied, gated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal.policy.parse import load_policy
from curvcal.policy.settings import needs
from tests.commands.test_metrics import as_json, logits_file

ONE_DIMENSIONAL = [
    ("histogram", 4),
    ("histogram-ovr", 4),
    ("isotonic", 4),
    ("isotonic-ovr", 4),
    ("platt", 2),
    ("beta", 2),
]


@pytest.mark.parametrize(("method", "k"), ONE_DIMENSIONAL)
def test_fit_save_and_apply_reproduce_the_evaluation(
    run_cli, tmp_path: Path, method: str, k: int
) -> None:
    fit = logits_file(tmp_path / "fit.npz", 400, k, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, k, seed=3)
    calibrator = tmp_path / "cal.json"
    stage = method.replace("-", "_")
    args = ("--method", method, "--save-calibrator", calibrator, "--json")
    fitted = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    assert set(fitted["evaluation"]) == {"uncalibrated", "ts", "focal_ts", stage}
    record = fitted["fits"][stage]
    assert record["method"] == method and record["n_samples"] == 400
    assert record["nll_after"] < record["nll_before"]  # over-confident scores
    assert fitted["evaluation"][stage]["ece"] < fitted["evaluation"]["uncalibrated"]["ece"]

    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.3" and saved[stage]["method"] == method
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    assert applied["applied"][stage] == saved[stage]
    for metric in ("ece", "nll", "brier", "adaece", "accuracy"):
        assert applied["evaluation"][stage][metric] == pytest.approx(
            fitted["evaluation"][stage][metric], rel=1e-12
        )
    table = run_cli("metrics", test, "--fit", fit, "--method", method)
    assert table.code == 0 and "binning, isotonic and binary maps" in table.stdout


def test_histogram_options_reach_the_fit(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 100, 3, seed=3)
    args = ("--method", "histogram", "--histogram-bins", "6", "--histogram-scheme",
            "equal-width", "--json")  # fmt: skip
    results = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    record = results["fits"]["histogram"]
    assert record["n_bins"] == 6 and record["scheme"] == "equal-width"
    assert results["settings"]["histogram_bins"] == 6


def test_top_label_maps_keep_predictions(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 5, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 5, seed=3)
    for method in ("histogram", "isotonic"):
        args = ("--fit", fit, "--method", method, "--json")
        evaluation = as_json(run_cli("metrics", test, *args))["results"]["evaluation"]
        assert evaluation[method]["accuracy"] == evaluation["uncalibrated"]["accuracy"]


def test_policy_gates_one_new_map_alone(tmp_path: Path) -> None:
    path = tmp_path / "gate.toml"
    path.write_text("[isotonic_ovr.ece]\nmax = 0.1\n[ece]\nmax = 0.5\n")
    need = needs(load_policy(path).rules, str(path))
    assert need.method == "isotonic-ovr" and need.predictions and not need.ts
    path.write_text("[platt.ece]\nmax = 0.1\n[histogram.nll]\nmax = 2\n")
    # two maps no narrower method fits together: every map is fitted, as --method all does
    assert needs(load_policy(path).rules, str(path)).method == "all"


def test_check_gates_the_histogram_stage(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    report = tmp_path / "new.json"
    args = ("--fit", fit, "--method", "histogram-ovr", "-o", report)
    assert run_cli("metrics", test, *args).code == 0
    ece = json.loads(report.read_text())["results"]["evaluation"]["histogram_ovr"]["ece"]
    policy = tmp_path / "gate.toml"
    policy.write_text(f"[histogram_ovr.ece]\nmax = {ece + 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 0
    policy.write_text(f"[histogram_ovr.ece]\nmax = {ece - 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 1


def test_calibrate_fits_plots_and_saves_a_one_vs_rest_map(run_cli, tmp_path: Path) -> None:
    from tests.commands.test_calibrate import CKPT, DATA

    calibrator, plot = tmp_path / "cal.json", tmp_path / "rel.png"
    args = ("--method", "isotonic-ovr", "--save-calibrator", calibrator, "--plot", plot)
    document = as_json(run_cli("calibrate", CKPT, *DATA, *args, "--json"))
    results = document["results"]
    assert results["settings"]["method"] == "isotonic-ovr"
    assert results["evaluation"]["isotonic_ovr"]["n_samples"] == results["split"]["n_eval"]
    assert json.loads(calibrator.read_text())["isotonic_ovr"]["n_classes"] == 10
    assert plot.stat().st_size > 0


def test_check_fits_only_the_gated_map(run_cli, tmp_path: Path) -> None:
    from curvcal.assets import demo_checkpoint
    from tests.commands.test_check_command import SETTINGS

    policy = tmp_path / "gate.toml"
    settings = 'histogram_bins = 6\nhistogram_scheme = "equal-width"\n'
    policy.write_text(SETTINGS + settings + "\n[histogram.ece]\nmax = 0.9\n")
    result = run_cli("check", demo_checkpoint(), "--policy", policy, "--json")
    assert result.code == 0, result.output
    calibration = json.loads(result.stdout)["results"]["calibration"]
    assert calibration["settings"]["method"] == "histogram"
    assert set(calibration["fits"]) == {"ts", "focal_ts", "histogram"}
    assert calibration["fits"]["histogram"]["scheme"] == "equal-width"
    assert calibration["fits"]["histogram"]["n_bins"] == 6
