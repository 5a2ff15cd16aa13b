"""`curvcal compare`: verdicts from two saved reports, exit codes 0/1/2, table and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from curvcal.results import Report
from tests.console_text import said, shown

POLICY = """\
[settings]
seed = 0

[ece]
max = 0.10

[ts.ece]
max = 0.03

[lambda_max]
max_rel_increase = 0.2

[trace]
max_increase = 5.0
"""


def calibrate_and_hessian(
    ece: float, ts_ece: float, lambda_max: float, trace: float, seed: int = 0
) -> dict[str, Any]:
    """A saved report as curvcal writes it (the real envelope, synthetic numbers)."""
    results = {
        "evaluation": {"uncalibrated": {"ece": ece}, "ts": {"ece": ts_ece}},
        "hessian": {
            "lambda_max": lambda_max,
            "trace": {"estimate": trace, "ci95": [trace - 1.0, trace + 1.0]},
        },
    }
    return Report(command="calibrate", results=results, settings={"seed": seed}).to_dict()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    policy = tmp_path / "gate.toml"
    policy.write_text(POLICY)
    reports = {
        "old": calibrate_and_hessian(ece=0.08, ts_ece=0.02, lambda_max=10.0, trace=100.0),
        "good": calibrate_and_hessian(ece=0.09, ts_ece=0.02, lambda_max=11.0, trace=104.0),
        "bad_ts": calibrate_and_hessian(ece=0.09, ts_ece=0.05, lambda_max=11.0, trace=104.0),
        "regressed": calibrate_and_hessian(ece=0.09, ts_ece=0.02, lambda_max=11.0, trace=106.0),
    }
    paths = {"policy": policy}
    for name, document in reports.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(document))
    return paths


def rows_of(stdout: str) -> list[dict[str, Any]]:
    document = json.loads(stdout)
    assert document["command"] == "compare"
    return document["results"]["rows"]


def test_passing_policy_exits_0(run_cli, files) -> None:
    result = run_cli("compare", files["good"], files["old"], "--policy", files["policy"])
    assert result.code == 0, result.output
    assert "PASS: all 4 bounds hold" in result.stdout
    assert "FAIL" not in result.stdout


def test_failing_bound_exits_1_with_that_row_marked(run_cli, files) -> None:
    result = run_cli(
        "compare", files["bad_ts"], files["old"], "--policy", files["policy"], "--json"
    )
    assert result.code == 1, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "fail"
    assert document["results"]["passed"] is False
    marked = {(row["metric"], row["bound"]): row["passed"] for row in rows_of(result.stdout)}
    assert marked == {
        ("ece", "max"): True,
        ("ts.ece", "max"): False,
        ("lambda_max", "max_rel_increase"): True,
        ("trace", "max_increase"): True,
    }


def test_baseline_regression_beyond_max_increase_fails(run_cli, files) -> None:
    result = run_cli(
        "compare", files["regressed"], files["old"], "--policy", files["policy"], "--json"
    )
    assert result.code == 1, result.output
    (failed,) = [row for row in rows_of(result.stdout) if not row["passed"]]
    assert failed["metric"] == "trace" and failed["bound"] == "max_increase"
    assert failed["value"] == 106.0 and failed["baseline"] == 100.0 and failed["change"] == 6.0
    assert failed["interval"] == [105.0, 107.0]
    assert failed["reason"] == "increase too large"


def test_markdown_output_is_a_pipe_table(run_cli, files) -> None:
    result = run_cli(
        "compare",
        files["bad_ts"],
        files["old"],
        "--policy",
        files["policy"],
        "--format",
        "markdown",
    )
    assert result.code == 1
    lines = result.stdout.splitlines()
    assert "| metric | value | bound | baseline | change | result | note |" in lines
    # the verdict first; text columns left-aligned, numbers right-aligned
    assert lines[0] == "## ❌ FAIL: 1 of 4 bounds broken"
    assert any(line.startswith("baseline: old.json (sha256 ") for line in lines[:5])
    assert "|:---|---:|:---|---:|---:|:---|:---|" in lines
    (ts_row,) = [line for line in lines if line.startswith("| ts.ece |")]
    assert ts_row == "| ts.ece | 0.05 | <= 0.03 | - | - | FAIL | above max |"
    (trace_row,) = [line for line in lines if line.startswith("| trace |")]
    assert trace_row == "| trace | 104 [103, 105] | change <= +5 | 100 | +4 | pass |  |"
    assert "FAIL: 1 of 4 bounds broken" in result.stdout


def test_output_file_and_a_compare_report_as_baseline(run_cli, files, tmp_path: Path) -> None:
    saved = tmp_path / "verdict.json"
    result = run_cli(
        "compare", files["good"], files["old"], "--policy", files["policy"], "-o", saved
    )
    assert result.code == 0
    document = json.loads(saved.read_text())
    assert document["status"] == "pass"
    assert document["inputs"]["policy"]["path"] == str(files["policy"])
    # the verdict document carries the judged values, so it can serve as the next baseline
    again = run_cli("compare", files["regressed"], saved, "--policy", files["policy"], "--json")
    assert again.code == 0, again.output  # trace 106 vs 104: within +5


def test_policy_from_pyproject_in_working_directory(run_cli, files, tmp_path, monkeypatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.curvcal.ts.ece]\nmax = 0.03\n'
    )
    monkeypatch.chdir(project)
    assert run_cli("compare", files["good"], files["old"]).code == 0
    assert run_cli("compare", files["bad_ts"], files["old"]).code == 1


def test_no_policy_anywhere_is_input_error(run_cli, files, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml here
    result = run_cli("compare", files["good"], files["old"])
    assert result.code == 2
    assert "--policy: no policy given" in result.stderr


def test_malformed_policy_is_input_error_naming_the_line(run_cli, files, tmp_path) -> None:
    policy = tmp_path / "bad.toml"
    policy.write_text("[ece]\nmax = 0.1\n\n[ts.ece]\nmax = 0.1\nmin = 0.5\n")
    result = run_cli("compare", files["good"], files["old"], "--policy", policy)
    assert result.code == 2
    line = f"curvcal: error: {shown(f'{policy}:6', ':')} [ts.ece] min 0.5 is above max 0.1"
    assert line in result.stderr


@pytest.mark.parametrize(
    ("content", "where", "why"),
    [
        ("{not json", ":1", "not valid JSON"),
        ('{"name": "x"}', "", "not a curvcal report"),
        ('{"schema": "9.0", "command": "hessian", "results": {}}', "", "schema 9.0"),
    ],
)
def test_bad_report_files_are_input_errors(run_cli, files, tmp_path, content, where, why) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for args in ((bad, files["old"]), (files["good"], bad)):
        result = run_cli("compare", *args, "--policy", files["policy"])
        assert result.code == 2
        assert f"{shown(f'{bad}{where}', ':')} " in result.stderr and why in result.stderr
        assert result.stdout == ""


def test_missing_report_file_is_input_error(run_cli, files, tmp_path) -> None:
    result = run_cli("compare", tmp_path / "absent.json", files["old"], "--policy", files["policy"])
    assert result.code == 2 and "no such report file" in result.stderr


def test_reports_with_different_settings_warn(run_cli, files, tmp_path) -> None:
    other = tmp_path / "other_seed.json"
    other.write_text(json.dumps(calibrate_and_hessian(0.09, 0.02, 11.0, 104.0, seed=7)))
    result = run_cli("compare", other, files["old"], "--policy", files["policy"], "--json")
    assert result.code == 0
    assert said("different settings (OLD → NEW): --seed: 0 → 7", result.stderr)
    assert json.loads(result.stdout)["warnings"] == [
        "the reports were computed with different settings (OLD → NEW): --seed: 0 → 7"
    ]
