"""`torchrun -m curvcal calibrate --shard-model modules` (gloo, CPU): a rank that fails on a
sharded model stops every rank with one line. (That a sharded run gives one process's figures
is tests/scale/test_torchrun_text.py's.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.test_catalogue_interrupt_hangs import CHECKPOINT, RANKED

from .launch import torchrun


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
    # what the user's dataset raised is the data's error, named by the option and the sample
    cause = "--data py:ranked:failing_late: reading sample 39 failed: RuntimeError: sample 39 is"
    lines = done.stderr.splitlines()
    assert done.returncode != 0
    assert any(line.startswith(f"curvcal: error: rank 1: {cause}") for line in lines), done.stderr
    assert any(
        line.startswith(f"curvcal: error: rank 1 failed, so rank 0 stopped: {cause}")
        for line in lines
    ), done.stderr
    assert not (tmp_path / "report.json").exists()
