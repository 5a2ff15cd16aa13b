"""A run that ends with a result and exit 3 (``--strict``'s unconverged estimate) keeps the
outputs it wrote, as docs/guide/output.md promises: the report that says ``status: error`` and
why, the plots, the eigenvector file. Raising the failure after the report was out removed them
all, and with ``--force`` the files they had replaced were lost with them."""

from __future__ import annotations

import json
from pathlib import Path

from curvcal.assets import demo_checkpoint
from tests.commands.test_check_command import SETTINGS, policy

UNCONVERGED = ["--max-iter", "2", "--tol", "1e-12", "--no-trace", "--strict"]


def test_hessian_strict_keeps_the_report_it_replaced_a_file_with(run_cli, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text('{"old": true}')
    vectors = tmp_path / "vectors.safetensors"
    result = run_cli(
        "hessian", demo_checkpoint(), "--data", "curvcal:digits", "--max-samples", "60",
        "--device", "cpu", *UNCONVERGED, "-o", report, "--force",
        "--save-eigenvectors", vectors,
    )  # fmt: skip
    assert result.code == 3, result.output
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("curvcal: error: --strict: eigenvalue 1") and "did not converge" in line
    document = json.loads(report.read_text())  # the new report, kept
    assert document["status"] == "error" and document["results"]["converged"] is False
    assert vectors.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "vectors.safetensors"]


def test_check_strict_keeps_its_report(run_cli, tmp_path: Path) -> None:
    text = (
        SETTINGS.replace("tol = 1e-2", "tol = 1e-12\nmax_iter = 2") + "\n[lambda_max]\nmax = 1e9\n"
    )
    out = tmp_path / "check.json"
    result = run_cli(
        "check", demo_checkpoint(), "--policy", policy(tmp_path, text), "--strict", "-o", out
    )
    assert result.code == 3, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("curvcal: error: --strict: ")
    document = json.loads(out.read_text())
    assert document["status"] == "error"
