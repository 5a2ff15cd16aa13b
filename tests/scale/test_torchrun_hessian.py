"""`torchrun --nproc-per-node 2 -m curvcal hessian` (gloo, CPU): the sharded run gives the numbers
of one process, and only rank 0 speaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .launch import digits_problem, torchrun_json

N_SAMPLES = 51  # odd: the two shards differ in size (26 and 25)


@pytest.mark.slow
def test_two_processes_match_one(run_cli, tmp_path: Path) -> None:
    checkpoint, data = digits_problem(tmp_path, N_SAMPLES)
    args = ["hessian", str(checkpoint), "--data", str(data), "--dtype", "float64",
            "--device", "cpu", "--top-k", "2", "--probes", "20", "--batch-size", "10"]  # fmt: skip

    out = tmp_path / "distributed.json"
    distributed = torchrun_json([*args, "-o", str(out)], tmp_path)
    assert json.loads(out.read_text()) == distributed

    single = run_cli(*args, "--json")
    assert single.code == 0, single.stderr
    reference = json.loads(single.stdout)

    assert distributed["settings"]["hessian"] == reference["settings"]["hessian"]
    assert distributed["results"]["operator"]["world_size"] == 2
    assert distributed["results"]["operator"]["n_samples"] == N_SAMPLES
    expected, got = reference["results"], distributed["results"]
    assert got["lambda_max"] == pytest.approx(expected["lambda_max"], rel=1e-6)
    assert got["eigenvalues"] == pytest.approx(expected["eigenvalues"], rel=1e-6)
    assert got["trace"]["estimate"] == pytest.approx(expected["trace"]["estimate"], rel=1e-6)
    assert got["trace"]["ci95"] == pytest.approx(expected["trace"]["ci95"], rel=1e-6)
    assert got["operator"]["mean_loss"] == pytest.approx(
        expected["operator"]["mean_loss"], rel=1e-12
    )
