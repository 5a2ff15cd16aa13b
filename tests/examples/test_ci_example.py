"""examples/ci: the `curvcal check` line of the GitHub Actions job, run as the job runs it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from curvcal.policy.parse import load_policy

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"
POLICY = ROOT / "examples" / "ci" / "curvcal.toml"


def workflow_command(baseline: str | None) -> list[str]:
    """The job's `curvcal check` line with $MODEL and the optional baseline filled in, and the
    redirect to the summary file removed (stdout is what it captures)."""
    text = WORKFLOW.read_text()
    model = re.search(r"^\s*MODEL: (\S+)$", text, re.MULTILINE)
    policy = re.search(r"^\s*POLICY: (\S+)$", text, re.MULTILINE)
    line = re.search(r"^\s*(curvcal check .*)$", text, re.MULTILINE)
    assert model and policy and line
    command = line.group(1)
    assert command.endswith("> summary.md")
    command = command.removesuffix("> summary.md").replace('"$MODEL"', model.group(1))
    command = command.replace('"$POLICY"', policy.group(1))
    filled = "" if baseline is None else f"--baseline {baseline}"
    command = command.replace('"${baseline[@]}"', filled)
    return shlex.split(command)[1:]  # without the program name


def test_policy_parses_and_the_job_writes_the_summary(run_cli, tmp_path, monkeypatch) -> None:
    policy = load_policy(POLICY)
    assert {rule.key for rule in policy.rules} == {
        "accuracy",
        "ece",
        "ts.ece",
        "lambda_max",
        "trace",
    }
    text = WORKFLOW.read_text()
    assert 'cat summary.md >> "$GITHUB_STEP_SUMMARY"' in text
    assert "actions/upload-artifact" in text and "gh release download" in text

    # run in a user's repository holding the example policy as the job's $POLICY and the bundled
    # checkpoint as its $MODEL (tests/examples/test_ci_workflow.py runs the whole job)
    (tmp_path / "curvcal.toml").symlink_to(POLICY)
    (tmp_path / "model.safetensors").symlink_to(
        ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"
    )
    monkeypatch.chdir(tmp_path)

    # first release: no baseline, so exactly the change bounds fail ("no baseline"), exit 1
    first = run_cli(*workflow_command(None), "--quiet")
    assert first.code == 1, first.output
    report = json.loads((tmp_path / "curvcal-check.json").read_text())
    failed = [row for row in report["results"]["rows"] if not row["passed"]]
    assert {row["reason"] for row in failed} == {"no baseline"}
    assert {row["bound"] for row in failed} <= {"max_increase", "max_rel_increase", "max_decrease"}
    summary = first.stdout.splitlines()
    assert "| metric | value | bound | baseline | change | result | note |" in summary
    assert any(line.startswith("| trace |") and " [" in line for line in summary)  # interval

    # next run: the previous report is the baseline; the same numbers pass every bound
    Path("baseline").mkdir()
    Path("curvcal-check.json").rename("baseline/curvcal-check.json")
    compared = run_cli(
        "compare",
        "baseline/curvcal-check.json",
        "baseline/curvcal-check.json",
        "--policy",
        "curvcal.toml",
        "--format",
        "markdown",
    )
    assert compared.code == 0, compared.output
    assert "PASS: all 7 bounds hold" in compared.stdout
    command = workflow_command("baseline/curvcal-check.json")
    assert command[command.index("--baseline") + 1] == "baseline/curvcal-check.json"
