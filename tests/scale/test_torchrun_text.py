"""`torchrun --nproc-per-node 2 -m curvcal hessian|calibrate` on a text classifier folder (gloo,
CPU): each rank tokenizes the texts, takes its shard of them padded per batch, and the sharded
run gives the numbers of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .launch import TEXTS, text_classifier, torchrun_json


@pytest.mark.slow
def test_two_processes_match_one_on_texts(run_cli, tmp_path: Path) -> None:
    folder, data = text_classifier(tmp_path, layers=1)
    common = ["--data", str(data), "--dtype", "float64", "--device", "cpu", "--batch-size", "4"]
    hessian = ["hessian", str(folder), *common, "--no-trace", "--tol", "1e-8"]
    distributed = torchrun_json(hessian, tmp_path)
    single = run_cli(*hessian, "--json")
    assert single.code == 0, single.stderr
    assert distributed["results"]["operator"]["n_samples"] == len(TEXTS)
    assert distributed["results"]["lambda_max"] == pytest.approx(
        json.loads(single.stdout)["results"]["lambda_max"], rel=1e-6
    )
    calibrate = ["calibrate", str(folder), *common, "--method", "none"]
    distributed = torchrun_json(calibrate, tmp_path)
    single = run_cli(*calibrate, "--json")
    assert single.code == 0, single.stderr
    got = distributed["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece"):
        assert got[metric] == pytest.approx(expected[metric], abs=1e-12)
