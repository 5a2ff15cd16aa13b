"""`torchrun -m curvcal hessian|calibrate --shard-model blocks` on a text classifier (gloo, CPU):
the sharded run gives one process's figures and says its products are central differences; a
rank that fails on a sharded model stops every rank with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.test_catalogue_interrupt_hangs import CHECKPOINT, RANKED

from .launch import text_classifier, torchrun, torchrun_json


@pytest.mark.slow  # two torchrun launches and two one-process runs
def test_sharded_bert_matches_one_process(run_cli, tmp_path: Path) -> None:
    folder, data = text_classifier(tmp_path, layers=2)
    common = ["--data", str(data), "--dtype", "float64", "--device", "cpu", "--batch-size", "4"]
    hessian = ["hessian", str(folder), *common, "--trace-method", "hutchinson", "--probes", "4",
               "--tol", "1e-8"]  # fmt: skip
    sharded = torchrun_json([*hessian, "--shard-model", "blocks"], tmp_path)
    single = run_cli(*hessian, "--json")
    assert single.code == 0, single.stderr
    expected = json.loads(single.stdout)["results"]
    got = sharded["results"]
    assert got["operator"]["engine"] == "central-difference"
    assert got["operator"]["world_size"] == 2
    product = got["operator"]["product"]
    assert product["method"] == "central-difference" and product["stencil"] == "3-point"
    assert 0 < product["relative_error_bound"] < 1e-7
    # products good to 5e-9 here, but Lanczos stops at the precision floor the products'
    # asymmetry sets (a true residual near 7e-7 against --tol 1e-8): λmax within 1.1e-6
    assert got["lambda_max"] == pytest.approx(expected["lambda_max"], rel=1e-5)
    assert got["trace"]["estimate"] == pytest.approx(expected["trace"]["estimate"], rel=1e-7)
    assert sharded["settings"]["checkpoint"]["shard_model"] == "blocks"

    calibrate = ["calibrate", str(folder), *common, "--method", "ts"]
    sharded = torchrun_json([*calibrate, "--shard-model", "blocks"], tmp_path)
    single = run_cli(*calibrate, "--json")
    assert single.code == 0, single.stderr
    got = sharded["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece", "brier"):
        assert got[metric] == pytest.approx(expected[metric], rel=1e-10, abs=1e-12)


@pytest.mark.slow
def test_a_rank_failing_on_a_sharded_model_stops_every_rank(tmp_path: Path) -> None:
    """Rank 1 fails on its last sample while rank 0 waits in the sharded model's parameter
    gather: both stop with one line each, and nothing is written."""
    (tmp_path / "ranked.py").write_text(RANKED)
    done = torchrun(
        ["calibrate", str(CHECKPOINT), "--data", "py:ranked:failing_late", "--trust-checkpoint",
         "--device", "cpu", "--shard-model", "modules", "-o", "report.json"],
        tmp_path,
        path=(tmp_path,),
        env={"NO_COLOR": "1", "CURVCAL_DIST_TIMEOUT": "300"},
        timeout=120,
    )  # fmt: skip
    cause = "internal error: RuntimeError: sample 39 is unreadable"
    lines = done.stderr.splitlines()
    assert done.returncode != 0
    assert any(line.startswith(f"curvcal: error: rank 1: {cause}") for line in lines), done.stderr
    assert any(
        line.startswith(f"curvcal: error: rank 1 failed, so rank 0 stopped: {cause}")
        for line in lines
    ), done.stderr
    assert not (tmp_path / "report.json").exists()
