"""gather_rows: shards of rows put back in dataset order on rank 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.distributed import gather_rows
from tests.scale.launch import torchrun_json


def test_one_process_returns_the_rows_unchanged() -> None:
    rows = torch.randn(5, 3)
    assert gather_rows(rows, 5) is rows


@pytest.mark.slow
def test_calibrate_under_torchrun_matches_one_process(run_cli, tmp_path: Path) -> None:
    """Two gloo ranks take the samples r, r + 2, ... (797 is odd: uneven shards); rank 0 gathers
    the logits back in dataset order, so the split, the fit and the metrics are those of one
    process, and only rank 0 writes to stdout."""
    args = ["calibrate", str(demo_checkpoint()), "--data", "curvcal:digits", "--method", "ts"]
    one = run_cli(*args, "--json")
    assert one.code == 0, one.stderr
    sharded = torchrun_json(args, tmp_path)
    single = json.loads(one.stdout)
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
