"""`torchrun --nproc-per-node 2 -m curvcal calibrate --method laplace` (gloo, CPU): each rank
catches the features of its shard, rank 0 gathers them in dataset order and fits the same
posterior as one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands.test_calibrate import CKPT, DATA
from tests.scale.launch import torchrun_json


def test_two_processes_fit_the_posterior_of_one(run_cli, tmp_path: Path) -> None:
    args = ["calibrate", CKPT, *DATA, "--device", "cpu", "--method", "laplace"]
    distributed = torchrun_json(args, tmp_path)["results"]
    single = run_cli(*args, "--json")
    assert single.code == 0, single.stderr
    expected = json.loads(single.stdout)["results"]
    got_fit, want_fit = distributed["fits"]["laplace"], expected["fits"]["laplace"]
    assert got_fit["n_samples"] == want_fit["n_samples"] == 398
    # float32 features of differently composed batches round alike to about 1e-7
    for key in ("prior_precision", "log_marginal_likelihood", "nll_after"):
        assert got_fit[key] == pytest.approx(want_fit[key], rel=1e-5), key
    for metric in ("nll", "ece", "brier"):
        assert distributed["evaluation"]["laplace"][metric] == pytest.approx(
            expected["evaluation"]["laplace"][metric], rel=1e-5, abs=1e-9
        ), metric
