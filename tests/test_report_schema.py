"""Every report curvcal writes follows the JSON Schema it ships (``curvcal/assets/report.schema.json``,
shown in the documentation): the golden reports of tests/golden/ and a fresh ``--json`` run of
every command validate against it, and documents that break the envelope do not."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from curvcal.assets import demo_checkpoint, demo_data, demo_policy, report_schema
from curvcal.commands import COMMANDS

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the dev extra")

GOLDEN = Path(__file__).resolve().parent / "golden"

#: Stand-ins for the values tests/golden/regenerate.py masks, of the type a real report holds.
UNMASKED: dict[str, Any] = {
    "timings": {},
    "environment": {
        "curvcal": "0",
        "python": "3",
        "torch": "2",
        "platform": "p",
        "command_line": "curvcal",
    },
    "path": "file",
    "size_bytes": 0,
    "sha256": "0" * 64,
}


def _unmasked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: UNMASKED[k] if v == "<masked>" and k in UNMASKED else _unmasked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_unmasked(v) for v in value]
    return value


@pytest.fixture(scope="module")
def validator() -> Any:
    schema = json.loads(report_schema().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: Any, document: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '$'}: {e.message[:200]}"
        for e in validator.iter_errors(document)
    ]


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden_reports_follow_the_schema(path: Path, validator: Any) -> None:
    document = _unmasked(json.loads(path.read_text()))
    assert _errors(validator, document) == []


def test_the_schema_names_every_command() -> None:
    schema = json.loads(report_schema().read_text())
    assert set(schema["properties"]["command"]["enum"]) == set(COMMANDS)


def _logits(path: Path) -> None:
    from curvcal.models import DigitsCNN

    data = load_file(str(demo_data()))
    model = DigitsCNN(num_classes=10)
    model.load_state_dict(load_file(str(demo_checkpoint())))
    with torch.no_grad():
        scores = model.eval()(data["x"][:300]).double()
    np.savez(path, logits=scores.numpy(), labels=data["y"][:300].numpy())


_SMALL = ("--data", "curvcal:digits", "--max-samples", "120", "--batch-size", "60")
RUNS: dict[str, list[str]] = {
    "version": ["version"],
    "inspect": ["inspect", "{ckpt}"],
    "hessian": ["hessian", "{ckpt}", *_SMALL, "--top-k", "2", "--probes", "4", "--per-layer"],
    "calibrate": ["calibrate", "{ckpt}", *_SMALL],
    "landscape": ["landscape", "{ckpt}", *_SMALL, "--steps", "3"],
    "metrics": ["metrics", "logits.npz", "--val-split", "0.5"],
    "check": ["check", "{ckpt}", "--policy", "{policy}", "--max-samples", "200", "-o", "new.json"],
    "compare": ["compare", "new.json", "new.json", "--policy", "{policy}"],
    "study": ["study", "{ckpt}", "copy.safetensors", *_SMALL, "--probes", "4", "--gammas", "0,1"],
    "demo": ["demo"],
}


def test_every_command_has_a_fresh_run() -> None:
    assert set(RUNS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(RUNS))
def test_fresh_reports_follow_the_schema(
    command: str, validator: Any, run_cli, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _logits(tmp_path / "logits.npz")
    (tmp_path / "copy.safetensors").write_bytes(demo_checkpoint().read_bytes())
    names = {"ckpt": demo_checkpoint(), "policy": demo_policy()}
    if command == "compare":
        check = [w.format(**names) for w in RUNS["check"]]
        assert run_cli(*check, "-q").code in (0, 1)
    argv = [w.format(**names) for w in RUNS[command]]
    result = run_cli(*argv, "--json")
    assert result.code in (0, 1), result.output
    document = json.loads(result.stdout)
    assert document["command"] == command
    assert _errors(validator, document) == []


def test_broken_envelopes_are_rejected(validator: Any) -> None:
    """The schema is not vacuous: each of these breaks it."""
    good = _unmasked(json.loads((GOLDEN / "hessian_float64.json").read_text()))
    assert _errors(validator, good) == []
    breakages = [
        lambda d: d.pop("results"),
        lambda d: d.update(schema="3.0"),
        lambda d: d.update(status="passed"),
        lambda d: d.update(command="train"),
        lambda d: d.update(extra=1),
        lambda d: d["results"].pop("lambda_max"),
        lambda d: d.update(nonfinite=[{"path": "results.trace", "value": "NaN"}]),
        lambda d: d["inputs"]["checkpoint"].update(sha256="abc"),
        lambda d: d.update(timings={"total": -1.0}),
    ]
    for index, breakage in enumerate(breakages):
        document = copy.deepcopy(good)
        breakage(document)
        assert _errors(validator, document), index
