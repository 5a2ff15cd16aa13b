"""`curvcal hessian --density`: the table says when the runs went without their basis."""

from __future__ import annotations

import json
from pathlib import Path

from curvcal.assets import demo_checkpoint

LIGHT = (
    "--data", "curvcal:digits", "--max-samples", "40", "--device", "cpu", "--tol", "1e-2",
    "--top-k", "1", "--no-trace", "--density", "--density-runs", "1", "--density-steps", "6",
)  # fmt: skip


def test_a_basis_bound_below_the_steps_runs_the_three_term_recurrence(
    run_cli, tmp_path: Path
) -> None:
    kept = run_cli("hessian", demo_checkpoint(), *LIGHT)
    assert kept.code == 0, kept.output
    assert "eigenvalue density (SLQ)" in kept.stdout and "three-term" not in kept.stdout
    out = tmp_path / "bare.json"
    bare = run_cli("hessian", demo_checkpoint(), *LIGHT, "--max-basis", "5", "--json", "-o", out)
    assert bare.code == 0, bare.output
    density = json.loads(out.read_text())["results"]["density"]
    assert density["reorthogonalised"] is False and density["steps"] == 6
    table = run_cli("hessian", demo_checkpoint(), *LIGHT, "--max-basis", "5")
    assert "three-term Lanczos recurrence" in " ".join(table.stdout.split())
