"""`curvcal check`: verdicts on the bundled checkpoint, exit codes 0/1/2/3, baselines, agreement
with `hessian`, `calibrate` and `compare` on the same numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.policy.baseline import metric_values
from curvcal.results import Report

# Light settings: a subset of the digits, a short γ grid, a loose Lanczos tolerance, few probes.
SETTINGS = """\
[settings]
data = "curvcal:digits"
device = "cpu"
max_samples = 120
gammas = [0, 1]
top_k = 1
eigen_method = "lanczos"
tol = 1e-2
probes = 4
"""
CALIBRATION_PASS = SETTINGS + "\n[accuracy]\nmin = 0.5\n[ece]\nmax = 0.5\n[ts.ece]\nmax = 0.5\n"


def policy(tmp_path: Path, text: str, name: str = "gate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_check(run_cli, tmp_path: Path, text: str, *extra: Any) -> tuple[int, dict[str, Any]]:
    result = run_cli(
        "check", demo_checkpoint(), "--policy", policy(tmp_path, text), "--json", *extra
    )
    assert result.code in (0, 1), result.output
    return result.code, json.loads(result.stdout)


def row(document: dict[str, Any], metric: str, bound: str) -> dict[str, Any]:
    (found,) = [
        r for r in document["results"]["rows"] if r["metric"] == metric and r["bound"] == bound
    ]
    return found


def test_passing_policy_exits_0_and_measures_only_calibration(run_cli, tmp_path) -> None:
    code, document = run_check(run_cli, tmp_path, CALIBRATION_PASS)
    assert code == 0 and document["status"] == "pass" and document["command"] == "check"
    assert [(r["metric"], r["passed"]) for r in document["results"]["rows"]] == [
        ("accuracy", True),
        ("ece", True),
        ("ts.ece", True),
    ]
    assert document["results"]["hessian"] is None  # no curvature gated: no Hessian
    calibration = document["results"]["calibration"]
    assert calibration["settings"]["method"] == "ts"  # only the map the rules need
    assert calibration["settings"]["gammas"] == [0.0, 1.0]
    assert document["inputs"]["data"]["n_samples"] == 120
    assert document["inputs"]["data"]["files"][0]["sha256"]
    assert document["inputs"]["policy"]["sha256"]


def test_failing_policy_exits_1_with_that_row_marked(run_cli, tmp_path) -> None:
    text = SETTINGS + "\n[accuracy]\nmin = 0.5\n[ece]\nmax = 0.0001\n"
    result = run_cli("check", demo_checkpoint(), "--policy", policy(tmp_path, text))
    assert result.code == 1, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "FAIL" in lines["ece"] and "above max" in lines["ece"]
    assert "pass" in lines["accuracy"]
    assert "FAIL: 1 of 2 bounds broken" in result.stdout


def test_baseline_regression_beyond_max_increase_and_decrease_fails(run_cli, tmp_path) -> None:
    text = SETTINGS + "\n[ece]\nmax_increase = 0.01\n[accuracy]\nmax_decrease = 0.02\n"
    _, first = run_check(run_cli, tmp_path, text)
    ece, accuracy = (first["results"]["values"][k]["value"] for k in ("ece", "accuracy"))
    # the same numbers as baseline: every change is 0 and passes
    same = tmp_path / "same.json"
    same.write_text(json.dumps(first))
    code, document = run_check(run_cli, tmp_path, text, "--baseline", same)
    assert code == 0 and row(document, "ece", "max_increase")["change"] == 0.0
    # a baseline 0.02 better in ECE and 0.03 better in accuracy (the digits' ECE is 0.028 and
    # accuracy 0.958; a saved value outside [0, 1] is refused as no run's): both regressions fail
    better = Report(
        command="calibrate",
        results={"evaluation": {"uncalibrated": {"ece": ece - 0.02, "accuracy": accuracy + 0.03}}},
    ).to_dict()
    old = tmp_path / "old.json"
    old.write_text(json.dumps(better))
    code, document = run_check(
        run_cli, tmp_path, text, "--baseline", old, "-o", tmp_path / "new.json"
    )
    assert code == 1 and document["status"] == "fail"
    ece_row, accuracy_row = (
        row(document, "ece", "max_increase"),
        row(document, "accuracy", "max_decrease"),
    )
    assert not ece_row["passed"] and ece_row["reason"] == "increase too large"
    assert ece_row["change"] == pytest.approx(0.02) and ece_row["baseline"] == pytest.approx(
        ece - 0.02
    )
    assert not accuracy_row["passed"] and accuracy_row["reason"] == "decrease too large"
    assert accuracy_row["change"] == pytest.approx(-0.03)
    # compare judges the saved check report against the same baseline with the same rows
    compared = run_cli(
        "compare", tmp_path / "new.json", old, "--policy", tmp_path / "gate.toml", "--json"
    )
    assert compared.code == 1
    assert json.loads(compared.stdout)["results"]["rows"] == document["results"]["rows"]


def test_calibration_values_agree_with_calibrate_and_compare(run_cli, tmp_path) -> None:
    text = SETTINGS + (
        "\n[ece]\nmax_increase = 0\n[focal_ts.nll]\nmax_increase = 0\n"
        "[temperature]\nmax_increase = 0\n[focal_gamma]\nmax_increase = 0\n"
    )
    code, document = run_check(run_cli, tmp_path, text, "-o", tmp_path / "check.json")
    assert code == 1  # change bounds without a baseline
    assert {r["reason"] for r in document["results"]["rows"]} == {"no baseline"}
    calibrated = run_cli(
        "calibrate", demo_checkpoint(), "--data", "curvcal:digits", "--max-samples", "120",
        "--device", "cpu", "--gammas", "0,1", "--val-split", "0.5", "-o", tmp_path / "cal.json",
        "--quiet",
    )  # fmt: skip
    assert calibrated.code == 0, calibrated.output
    from_calibrate = metric_values(json.loads((tmp_path / "cal.json").read_text()))
    for key, measured in document["results"]["values"].items():
        assert from_calibrate[key].value == measured["value"], key
    compared = run_cli(
        "compare", tmp_path / "cal.json", tmp_path / "check.json", "--policy",
        tmp_path / "gate.toml", "--json",
    )  # fmt: skip
    assert compared.code == 0, compared.output
    assert all(r["change"] == 0.0 for r in json.loads(compared.stdout)["results"]["rows"])


def test_hessian_values_agree_with_hessian_command(run_cli, tmp_path) -> None:
    text = SETTINGS + "\n[lambda_max]\nmax = 1000\n[trace]\nmax = 100000\n"
    code, document = run_check(run_cli, tmp_path, text)
    assert code == 0
    assert document["results"]["calibration"] is None  # nothing calibrated was gated
    measured = run_cli(
        "hessian", demo_checkpoint(), "--data", "curvcal:digits", "--max-samples", "120",
        "--device", "cpu", "--method", "lanczos", "--tol", "1e-2", "--probes", "4",
        "-o", tmp_path / "h.json", "--quiet",
    )  # fmt: skip
    assert measured.code == 0, measured.output
    from_hessian = metric_values(json.loads((tmp_path / "h.json").read_text()))
    values = document["results"]["values"]
    assert from_hessian["lambda_max"].value == values["lambda_max"]["value"]
    assert from_hessian["trace"].value == values["trace"]["value"]
    assert list(from_hessian["trace"].interval or ()) == values["trace"]["interval"]
    trace_row = row(document, "trace", "max")
    low, high = trace_row["interval"]
    assert low < trace_row["value"] < high  # judged on the estimate, interval shown


def test_command_line_option_overrides_the_policy(run_cli, tmp_path) -> None:
    code, document = run_check(run_cli, tmp_path, CALIBRATION_PASS, "--max-samples", "60")
    assert code == 0
    assert document["inputs"]["data"]["n_samples"] == 60
    assert document["results"]["sources"]["max_samples"] == "option"
    assert document["results"]["sources"]["data"] == "policy"
    assert document["results"]["sources"]["bins"] == "default"
    assert document["settings"]["data"]["max_samples"] == 60


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        (SETTINGS + "\n[ece]\nmax = 0.1\nmux = 2\n", 13, "unknown bound 'mux'"),
        (SETTINGS + 'method = "ts"\n[focal_ts.ece]\nmax = 0.1\n', 10, "fits no focal_ts map"),
        (SETTINGS + "trace = false\n[trace]\nmax = 1\n", 10, "the policy gates [trace]"),
        (SETTINGS + 'loss = "hinge"\n[trace]\nmax = 1\n', 10, "loss 'hinge' is not one of"),
        # a loader's complaint about a value the policy set names the policy's line, not
        # the option the user never gave
        (SETTINGS + 'arch = "curvcal:Nope"\n[ece]\nmax = 0.5\n', 10, "no bundled architecture"),
        # a kernel's complaint names the setting too, not only its line (3 passes the field's
        # declared bound, 2, which the policy's reading checks; the trace methods need 4)
        (
            SETTINGS.replace("probes = 4", "probes = 3") + "[trace]\nmax = 1000\n",
            9,
            "probes must be an integer ≥ 4",
        ),
        (
            SETTINGS + 'fit_data = "curvcal:digits"\nval_split = 0.3\n[ts.ece]\nmax = 0.5\n',
            11,
            "val_split and fit_data",
        ),
    ],
)
def test_malformed_policy_or_setting_exits_2_naming_the_line(
    run_cli, tmp_path, text: str, line: int, why: str
) -> None:
    path = policy(tmp_path, text)
    result = run_cli("check", demo_checkpoint(), "--policy", path)
    assert result.code == 2, result.output
    assert f"{path}:{line}:" in result.stderr and why in result.stderr
    assert "--arch" not in result.stderr
    assert result.stdout == ""


def test_no_data_anywhere_is_input_error(run_cli, tmp_path) -> None:
    result = run_cli("check", demo_checkpoint(), "--policy", policy(tmp_path, "[ece]\nmax = 1\n"))
    assert result.code == 2 and "no data to measure on" in result.stderr


def test_nan_weights_are_refused_naming_the_checkpoint(run_cli, tmp_path) -> None:
    """A NaN weight is the file's fault, refused at load (it was exit 3, NaN logits)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(demo_checkpoint()), "pt") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    name = next(key for key, tensor in tensors.items() if tensor.dtype.is_floating_point)
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    broken = tmp_path / "nan.safetensors"
    save_file(tensors, str(broken), metadata=metadata)
    path = policy(tmp_path, CALIBRATION_PASS)
    result = run_cli("check", broken, "--policy", path, "-o", tmp_path / "r.json")
    assert result.code == 2, result.output
    assert f"parameter {name} holds" in result.stderr and result.stderr.count("\n") == 1


def test_markdown_summary_is_a_pipe_table(run_cli, tmp_path) -> None:
    result = run_cli(
        "check", demo_checkpoint(), "--policy", policy(tmp_path, CALIBRATION_PASS),
        "--format", "markdown",
    )  # fmt: skip
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "## ✅ PASS: all 3 bounds hold"  # the verdict first, not under the table
    header = lines.index("| metric | value | bound | baseline | change | result | note |")
    assert lines[header + 1] == "|:---|---:|:---|---:|---:|:---|:---|"
    assert lines[header + 2].startswith("| accuracy |") and "| pass |" in lines[header + 2]
    assert "PASS: all 3 bounds hold" in result.stdout
