"""`torchrun --nproc-per-node 2 -m curvcal hessian --warm-start F` (gloo, CPU): each rank draws
its share of its own shard by the seed, the sample's products are summed across the ranks, and
the full run from the warm start finds one process' λmax."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .launch import digits_problem, torchrun_json

N_SAMPLES = 51  # odd: the two shards differ in size (26 and 25)


# slow: two torchrun processes start, each importing torch (7 s on an idle machine, more loaded)
@pytest.mark.slow
def test_two_processes_warm_start_finds_one_process_lambda_max(run_cli, tmp_path: Path) -> None:
    checkpoint, data = digits_problem(tmp_path, N_SAMPLES)
    args = ["hessian", str(checkpoint), "--data", str(data), "--dtype", "float64",
            "--device", "cpu", "--no-trace", "--tol", "1e-8", "--batch-size", "10"]  # fmt: skip

    out = tmp_path / "warm.json"
    distributed = torchrun_json([*args, "--warm-start", "0.25", "-o", str(out)], tmp_path)
    single = run_cli(*args, "--json")
    assert single.code == 0, single.stderr
    reference = json.loads(single.stdout)["results"]
    got = distributed["results"]
    assert got["operator"]["world_size"] == 2
    assert got["lambda_max"] == pytest.approx(reference["lambda_max"], rel=1e-7)
    record = got["operator"]["warm_start"]
    # ⌈0.25 · 26⌉ + ⌈0.25 · 25⌉ rows, summed over the ranks
    assert record["n_samples"] == math.ceil(0.25 * 26) + math.ceil(0.25 * 25) == 14
    assert record["n_matvecs"] >= 2
