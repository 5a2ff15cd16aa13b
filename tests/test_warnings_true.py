"""Warnings that are true: every warning said on stderr is in the JSON ``warnings`` too (one
path: the run's reporter), and ``compare`` names differing settings by their options."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from curvcal.assets import demo_checkpoint
from curvcal.policy.baseline import setting_differences
from tests.console_text import said, unwrapped
from tests.load.test_text import TextFiles, text_model  # noqa: F401  (the module's fixture)

PACKAGE = Path(__file__).resolve().parents[1] / "curvcal"
WARNING = "curvcal: warning:"


def printed_only(stderr: str, document: dict) -> list[str]:
    """The warnings said on stderr that the JSON ``warnings`` lack (rich may wrap a long one
    over lines, so both are compared with their white space collapsed)."""
    recorded = [unwrapped(warning) for warning in document["warnings"]]
    printed = [unwrapped(chunk) for chunk in stderr.split(WARNING)[1:]]
    return [text for text in printed if not any(text.startswith(w) for w in recorded)]


def test_no_module_prints_a_warning_around_the_reporter() -> None:
    """Every warning goes through ``Reporter.warn``, which keeps it for the report: no other
    module writes a ``warning:`` line or prints to stderr on its own."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "console.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            quoted = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if quoted and re.search(r"curvcal: warning", node.value):
                offenders.append(f"{path.name}:{node.lineno}")
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if called and node.func.id == "stderr_console":
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_the_token_embedding_exclusion_is_in_the_json(run_cli, text_model: TextFiles) -> None:  # noqa: F811
    result = run_cli(
        "hessian", text_model.folder, "--data", text_model.jsonl, "--device", "cpu",
        "--no-trace", "--max-iter", "5", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert said("token embeddings", result.stderr)
    assert any("token embeddings" in warning for warning in document["warnings"])
    assert printed_only(result.stderr, document) == []


def test_check_and_compare_say_each_warning_once_in_both_places(run_cli, tmp_path: Path) -> None:
    common = ("--data", "curvcal:digits", "--max-samples", "40", "--quiet")
    for probes in ("8", "4"):
        result = run_cli(
            "hessian", demo_checkpoint(), *common, "--probes", probes,
            "--trace-method", "hutchinson", "--tol", "1e-2", "-o", tmp_path / f"h{probes}.json",
        )  # fmt: skip
        assert result.code == 0, result.stderr
    policy = tmp_path / "gate.toml"
    policy.write_text("[lambda_max]\nmax_rel_increase = 10\n")
    compared = run_cli(
        "compare", tmp_path / "h4.json", tmp_path / "h8.json", "--policy", policy, "--json"
    )
    document = json.loads(compared.stdout)
    assert document["warnings"] == [
        "the reports were computed with different settings (OLD → NEW): --probes: 8 → 4"
    ]
    assert printed_only(compared.stderr, document) == []
    checked = run_cli(
        "check", demo_checkpoint(), "--policy", policy, *common, "--params", "classifier.*",
        "--baseline", tmp_path / "h8.json", "--json",
    )  # fmt: skip
    document = json.loads(checked.stdout)
    assert printed_only(checked.stderr, document) == []
    assert len(document["warnings"]) == len(set(document["warnings"]))
    assert any("--params: unset → classifier.*" in w for w in document["warnings"])
    assert not any("{'" in warning for warning in document["warnings"])


# ------------------------------------------------------------------ compare's differences


def _report(**groups: dict) -> dict:
    return {"schema": "2.0", "command": "hessian", "settings": groups}


def test_differences_are_named_by_option_and_read_old_to_new() -> None:
    old = _report(
        checkpoint={"arch_kwargs": {}, "device": "cpu"},
        data={"data": "curvcal:digits", "mean": None},
        hessian={"probes": 100, "trace": True, "seed": 0, "method": "power"},
        calibration={"seed": 0, "method": "ts"},
    )
    new = _report(
        checkpoint={"arch_kwargs": {"width": 16}, "device": "cpu"},
        data={"data": "curvcal:digits", "mean": [0.5, 0.25]},
        hessian={"probes": 50, "trace": False, "seed": 7, "method": "lanczos"},
        calibration={"seed": 7, "method": "both"},
    )
    assert setting_differences(new, old) == [
        '--arch-kwargs: {} → {"width": 16}',
        "--mean: unset → 0.5,0.25",
        "--method (calibration): ts → both",
        "--method (hessian): power → lanczos",
        "--probes: 100 → 50",
        "--seed: 0 → 7",
        "--trace: true → false",
    ]


def test_identical_data_and_settings_differ_in_nothing() -> None:
    """Two checks of the same data under different policies: their rules and policy paths are
    how they were judged, not how the numbers were measured."""
    data = {"data": "curvcal:digits", "max_samples": 60, "mean": [0.5], "x_key": "x"}
    old = {
        "schema": "2.0",
        "command": "check",
        "settings": {
            "data": dict(data),
            "check": {"policy": "a.toml", "rules": [{"metric": "ece", "max": 0.1}]},
        },
    }
    new = {
        "schema": "2.0",
        "command": "check",
        "settings": {
            "data": dict(data),
            "check": {"policy": "b.toml", "rules": [{"metric": "nll", "max": 1}]},
        },
    }
    assert setting_differences(new, old) == []


@pytest.mark.parametrize("value", [{"a": 1}, [1, 2], None, True, 0.5, "x"])
def test_no_difference_is_written_as_python(value: object) -> None:
    old = _report(hessian={"probes": value})
    new = _report(hessian={"probes": "changed"})
    (line,) = setting_differences(new, old)
    assert "'" not in line and "None" not in line and "True" not in line
