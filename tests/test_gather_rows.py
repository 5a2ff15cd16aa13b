"""gather_rows: shards of rows put back in dataset order on rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.distributed import gather_rows


def test_one_process_returns_the_rows_unchanged() -> None:
    rows = torch.randn(5, 3)
    assert gather_rows(rows, 5) is rows


@pytest.mark.slow
def test_calibrate_under_torchrun_matches_one_process(tmp_path: Path) -> None:
    """Two gloo ranks take the samples r, r + 2, ... (797 is odd: uneven shards); rank 0 gathers
    the logits back in dataset order, so the split, the fit and the metrics are those of one
    process, and only rank 0 writes to stdout."""
    args = [str(demo_checkpoint()), "--data", "curvcal:digits", "--method", "ts", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    one = subprocess.run(
        [sys.executable, "-m", "curvcal", "calibrate", *args],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    two = subprocess.run(
        [*launcher, "-m", "curvcal", "calibrate", *args],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    )  # fmt: skip
    single, sharded = json.loads(one.stdout), json.loads(two.stdout)
    assert sharded["environment"]["world_size"] == 2
    assert sharded["results"]["split"] == single["results"]["split"]
    assert sharded["results"]["fits"]["ts"]["temperature"] == pytest.approx(
        single["results"]["fits"]["ts"]["temperature"], rel=1e-6
    )
    for stage in ("uncalibrated", "ts"):
        for metric in ("accuracy", "ece", "nll"):
            assert sharded["results"]["evaluation"][stage][metric] == pytest.approx(
                single["results"]["evaluation"][stage][metric], rel=1e-6
            )
