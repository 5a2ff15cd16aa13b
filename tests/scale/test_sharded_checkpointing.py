"""``--checkpoint-activations`` on a sharded model: the same products (λmax, the Hutchinson
trace, one product) and logits as without it, the same parameter names, fewer values kept by a
forward; refused without ``--shard-model`` (a double-backward product saves nothing by it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("checkpointing_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.slow  # two ranks, two sharded models, each product 2 gradient passes
def test_checkpointed_units_give_the_same_products(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(WORKER), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        figures = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
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
