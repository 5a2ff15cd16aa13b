"""The report of `calibrate --apply` with a Laplace calibrator holds a summary of it (its
kind, P, δ, log Z, structure and the digest of its saved form), not its P² covariance, which
stays in the calibrator file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
import pytest

from curvcal.assets import report_schema
from tests.commands.test_calibrate import CKPT, DATA, as_json


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_applied_laplace_is_summarised_in_the_report(run_cli, tmp_path: Path, structure) -> None:
    calibrator = tmp_path / "lap.json"
    fitted = as_json(
        run_cli("calibrate", CKPT, *DATA, "--method", "laplace", "--laplace-structure",
                structure, "--save-calibrator", calibrator, "--json")
    )["results"]  # fmt: skip
    report = tmp_path / "report.json"
    applied = run_cli("calibrate", CKPT, *DATA, "--apply", calibrator, "--out", report)
    assert applied.code == 0, applied.output
    document = json.loads(report.read_text())
    summary = document["results"]["applied"]["laplace"]
    saved = json.loads(calibrator.read_text())["laplace"]
    text = json.dumps(saved, sort_keys=True, separators=(",", ":"))
    assert summary["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    fit = fitted["fits"]["laplace"]
    assert summary["summary"] is True and summary["method"] == "laplace"
    assert summary["structure"] == structure == fit["structure"]
    assert summary["n_parameters"] == fit["n_parameters"] == 32 * 10 + 10
    assert summary["prior_precision"] == fit["prior_precision"]
    assert summary["prior_rule"] == "marglik"
    assert summary["log_marginal_likelihood"] == fit["log_marginal_likelihood"]
    shapes = {"full": {"covariance": [330, 330]}, "kron": {"kron_a": [32, 32], "kron_g": [10, 10]}}
    assert summary["shapes"] == shapes[structure]
    assert not {"covariance", "kron_a", "kron_g", "weight"} & set(summary)
    # the file holds the numbers; the report is much smaller than it
    assert len(report.read_bytes()) < len(calibrator.read_bytes())
    schema = json.loads(report_schema().read_text())
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(document))
    # the evaluation is the applied posterior's, unchanged by the summary
    assert document["results"]["evaluation"]["laplace"]["n_samples"] == 797
