"""Saved calibrators edited by hand or crafted, given to ``metrics --apply``: a fault of the file
is named as the file's (one line, exit 2), never read as a default, never blamed on the scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.commands.test_metrics import logits_file, one_line_error


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Scores of 3 classes and a calibrator file of TS, focal TS, vector, matrix, Dirichlet and
    isotonic maps fitted on other scores of the same kind."""
    from click.testing import CliRunner

    from curvcal.cli import main

    folder = tmp_path_factory.mktemp("saved")
    fit = logits_file(folder / "fit.npz", 120, 3, seed=0)
    test = logits_file(folder / "test.npz", 80, 3, seed=1)
    for method in ("both", "vector", "matrix", "dirichlet", "isotonic", "histogram"):
        part = folder / f"{method}.json"
        with CliRunner().isolation():
            args = ["metrics", str(test), "--fit", str(fit), "--method", method]
            assert main([*args, "--save-calibrator", str(part), "--quiet"]) == 0
        document = json.loads(part.read_text())
        if method == "both":
            merged = document
        else:
            merged.update({key: value for key, value in document.items() if key == method})
    return test, merged


def _write(tmp_path: Path, document: dict, **entries: dict | None) -> Path:
    """The calibrator file holding only ``entries`` (stage: entry) and ``document``'s
    provenance."""
    path = tmp_path / "edited.json"
    only = {"schema": "1.3", "curvcal": document["curvcal"], "ts": None, "focal_ts": None}
    path.write_text(json.dumps({**only, **entries, "provenance": document["provenance"]}))
    return path


@pytest.mark.parametrize(
    ("stage", "dropped"),
    [("ts", "temperature"), ("focal_ts", "temperature"), ("focal_ts", "gamma")],
)
def test_a_temperature_map_without_its_parameter_is_refused(
    run_cli, tmp_path: Path, saved: tuple[Path, dict], stage: str, dropped: str
) -> None:
    # Before: the missing value took its default (T = 1, γ = 0), and the uncalibrated scores
    # (or plain TS) were reported under the map's name with exit 0.
    test, document = saved
    entry = {key: value for key, value in document[stage].items() if key != dropped}
    path = _write(tmp_path, document, **{stage: entry})
    one_line_error(
        run_cli("metrics", test, "--apply", path), str(path), f"missing keys ['{dropped}']"
    )


def test_a_temperature_map_without_gamma_is_still_read(
    run_cli, tmp_path: Path, saved: tuple[Path, dict]
) -> None:
    """γ of plain TS can only be 0: leaving it out changes nothing."""
    test, document = saved
    entry = {key: value for key, value in document["ts"].items() if key != "gamma"}
    whole = run_cli("metrics", test, "--apply", _write(tmp_path, document, ts=document["ts"]))
    left_out = run_cli("metrics", test, "--apply", _write(tmp_path, document, ts=entry), "--json")
    assert whole.code == 0 and left_out.code == 0, left_out.stderr
    nll = json.loads(left_out.stdout)["results"]["evaluation"]["ts"]["nll"]
    z = np.load(test)["logits"] / document["ts"]["temperature"]
    labels = np.load(test)["labels"]
    logp = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1)[:, None]
    assert nll == pytest.approx(-logp[np.arange(len(labels)), labels].mean(), rel=1e-10)


@pytest.mark.parametrize(
    ("stage", "edit"),
    [
        ("isotonic", {"n_classes": 4}),
        ("histogram", {"n_classes": 5}),
        ("matrix", {"weights": [[1.0, 0.0], [0.0, 1.0]], "bias": [0.0, 0.0]}),
        ("vector", {"weights": [1.0, 1.0], "bias": [0.0, 0.0]}),
    ],
)
def test_a_map_of_other_classes_than_its_provenance_is_the_files_fault(
    run_cli, tmp_path: Path, saved: tuple[Path, dict], stage: str, edit: dict
) -> None:
    # Before: the provenance (3 classes) matched the scores, and the map's own class count
    # was found only when applied, as an error naming the scores file.
    test, document = saved
    path = _write(tmp_path, document, **{stage: {**document[stage], **edit}})
    result = run_cli("metrics", test, "--apply", path)
    one_line_error(result, str(path), f"'{stage}' is a map of", "provenance records 3")
    assert str(test) not in result.stderr


@pytest.mark.parametrize(
    ("stage", "edit"),
    [
        ("vector", {"weights": [1e308, 1e308, 1e308]}),
        ("matrix", {"weights": [[1e308] * 3] * 3}),
        ("dirichlet", {"weights": [[-1e308] * 3] * 3}),
    ],
)
def test_parameters_that_overflow_on_the_scores_name_the_calibrator(
    run_cli, tmp_path: Path, saved: tuple[Path, dict], stage: str, edit: dict
) -> None:
    # Before: the NaN the map made was reported as "log-probabilities contain NaN" of the
    # scores file, which holds nothing wrong. Then: an overflow named on the calibrator when
    # applied. Now the file is refused as it is read: a coefficient past 1/T_min (the bound
    # every saved linear coefficient shares) is out of its declared range.
    test, document = saved
    path = _write(tmp_path, document, **{stage: {**document[stage], **edit}})
    result = run_cli("metrics", test, "--apply", path, "--quiet")
    one_line_error(result, f"{path} ({stage})", "weights", "is outside -8.5e+37..8.5e+37")


def test_large_but_finite_parameters_are_applied_as_written(
    run_cli, tmp_path: Path, saved: tuple[Path, dict]
) -> None:
    """A valid file is measured as it says: vector scaling w = (10, 10, 10), b = 0 is TS with
    T = 0.1, whose NLL is worked here in float64."""
    test, document = saved
    entry = {"method": "vector", "weights": [10.0] * 3, "bias": [0.0] * 3}
    result = run_cli("metrics", test, "--apply", _write(tmp_path, document, vector=entry), "--json")
    assert result.code == 0, result.stderr
    z = 10.0 * np.load(test)["logits"].astype(np.float64)
    labels = np.load(test)["labels"]
    top = z.max(1, keepdims=True)
    logp = z - top - np.log(np.exp(z - top).sum(1, keepdims=True))
    nll = json.loads(result.stdout)["results"]["evaluation"]["vector"]["nll"]
    assert nll == pytest.approx(-logp[np.arange(len(labels)), labels].mean(), rel=1e-10)


@pytest.mark.parametrize("gated", ["platt.ece", "beta.nll"])
def test_a_policy_gating_a_map_that_does_not_apply_is_refused(
    run_cli, tmp_path: Path, gated: str
) -> None:
    # Before: with a second map gated, every map was fitted, the binary map was skipped on the
    # 10-class model, and its rule failed as 'not in the report' (exit 1: a broken bound no
    # model could meet); gated alone the same rule was refused (exit 2).
    from curvcal.assets import demo_checkpoint
    from tests.commands.test_check_command import SETTINGS

    policy = tmp_path / "gate.toml"
    policy.write_text(f"{SETTINGS}\n[{gated}]\nmax = 0.9\n\n[ts.ece]\nmax = 0.9\n")
    result = run_cli("check", demo_checkpoint(), "--policy", policy)
    one_line_error(result, str(policy), f"[{gated}]", "binary problems (K = 2) only")


@pytest.mark.parametrize("fitted", ["val-split", "whole file"])
def test_a_map_applied_to_the_scores_it_was_fitted_on_is_refused(
    run_cli, tmp_path: Path, fitted: str
) -> None:
    # Before: metrics --fit refused a fit file with the evaluation file's contents, but a map
    # saved from such a fit (or from --val-split of the file) and applied to the same file was
    # measured on every row, the fitted ones included, as evaluation data (exit 0).
    scores = logits_file(tmp_path / "scores.npz", 120, 3, seed=4)
    other = logits_file(tmp_path / "other.npz", 120, 3, seed=5)
    calibrator = tmp_path / "cal.json"
    if fitted == "val-split":
        fit = ("metrics", scores, "--val-split", "0.5")
    else:
        fit = ("metrics", other, "--fit", scores)
    assert run_cli(*fit, "--method", "vector", "--save-calibrator", calibrator).code == 0
    result = run_cli("metrics", scores, "--apply", calibrator, "--quiet")
    one_line_error(result, str(calibrator), "fitted on rows of these very scores")
    # forced, it is measured and said
    forced = run_cli("metrics", scores, "--apply", calibrator, "--apply-anyway", "--json")
    assert forced.code == 0
    assert any("these very scores" in line for line in json.loads(forced.stdout)["warnings"])
    # to other scores it applies as before
    assert run_cli("metrics", other, "--apply", calibrator).code == 0


def test_calibrate_warns_when_a_map_is_measured_on_its_fit_rows(run_cli, tmp_path: Path) -> None:
    # Before: calibrate --apply measured a map fitted on --val-split of the same data on every
    # row, and said only 'nothing fitted: every sample evaluated'.
    from curvcal.assets import demo_checkpoint

    data = ("--data", "curvcal:digits", "--max-samples", "120")
    calibrator = tmp_path / "cal.json"
    fitted = run_cli("calibrate", demo_checkpoint(), *data, "--method", "ts",
                     "--save-calibrator", calibrator)  # fmt: skip
    assert fitted.code == 0, fitted.stderr
    applied = run_cli("calibrate", demo_checkpoint(), *data, "--apply", calibrator, "--json")
    assert applied.code == 0, applied.stderr
    warnings = json.loads(applied.stdout)["warnings"]
    assert any(f"{calibrator} is fitted on rows of these very scores" in w for w in warnings)
