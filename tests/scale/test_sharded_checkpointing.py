"""``--checkpoint-activations`` on a sharded model: the same products (λmax, the Hutchinson
trace, one product) and logits as without it, the same parameter names, fewer values kept by a
forward; refused without ``--shard-model`` (a double-backward product saves nothing by it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .launch import worker_results

WORKER = Path(__file__).with_name("checkpointing_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.slow  # two ranks, two sharded models, each product 2 gradient passes
def test_checkpointed_units_give_the_same_products(tmp_path: Path) -> None:
    for rank, figures in enumerate(worker_results(WORKER, tmp_path, 2, timeout=400)):
        plain, checkpointed = figures["plain"], figures["checkpointed"]
        for name in ("eigenvalues", "trace", "product"):
            assert _relative(checkpointed[name], plain[name]) < 1e-9, name
        assert checkpointed["names"] == plain["names"]  # state dict keys as reported
        assert not any("checkpoint" in name for name in checkpointed["names"])
        # the blocks' activations are not kept by the forward: only the rest of the model's
        assert int(checkpointed["kept"]) < int(plain["kept"]) / 4
        if rank == 0:
            assert torch.equal(checkpointed["logits"], plain["logits"])
    assert plain["eigenvalues"][0] > 1.0 and plain["trace"] > 1.0  # not trivial


def test_checkpoint_activations_without_shard_model_is_refused(run_cli) -> None:
    result = run_cli(
        "hessian", str(ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"), "--data",
        "curvcal:digits", "--device", "cpu", "--checkpoint-activations",
    )  # fmt: skip
    assert result.code == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "curvcal: error: --checkpoint-activations: is offered only with --shard-model "
        "blocks|modules: a product by double backward keeps the first backward's graph, "
        "recomputed activations included (measured to save no memory) (add --shard-model "
        "blocks under torchrun, or drop --checkpoint-activations)"
    ]


@pytest.mark.slow  # one torchrun launch of two ranks
def test_torchrun_hessian_with_checkpoint_activations(tmp_path: Path) -> None:
    """The option reaches the sharded model from the command line, and the report records it."""
    pytest.importorskip("transformers")
    from tests.console_text import said

    from .launch import text_classifier, torchrun

    folder, data = text_classifier(tmp_path, layers=2)
    done = torchrun(
        ["hessian", str(folder), "--data", str(data), "--dtype", "float64", "--device", "cpu",
         "--batch-size", "4", "--trace-method", "hutchinson", "--probes", "2",
         "--shard-model", "blocks", "--checkpoint-activations", "--json"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["settings"]["checkpoint"]["checkpoint_activations"] is True
    assert report["results"]["operator"]["engine"] == "central-difference"
    assert said("activations recomputed in each backward", done.stderr)


def test_bench_sharded_runs_checkpointed(tmp_path: Path) -> None:
    """``BENCH_CHECKPOINT=1 benchmarks/bench_sharded.py sharded-gradient`` (the scale guide's
    measurement) runs, in one process of its own group, at a tiny width."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "BENCH_WIDTH": "16",
        "BENCH_TOKENS": "4",
        "BENCH_CHECKPOINT": "1",
        "MASTER_PORT": port,
    }
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_sharded.py"), "sharded-gradient"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mode=sharded-gradient" in done.stdout and "checkpoint=1" in done.stdout
