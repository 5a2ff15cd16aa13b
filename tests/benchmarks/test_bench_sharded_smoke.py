"""Smoke test of benchmarks/bench_sharded.py at a tiny width: every mode runs and prints its line
(the products under torchrun, the others as one plain process, the script's own world of one),
with its parameter count, time, peak resident set and vector length."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r"world=1 rank=0 mode=(\S+) P=(\d+) s_per_pass=([0-9.]+) peak_rss_MiB=(\d+) vector=(\d+)"
)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(mode: str, torchrun: bool = False) -> tuple[str, int, float, int, int]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "BENCH_WIDTH": "16",
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    }
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_sharded.py"), mode]
    if torchrun:
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    else:  # the script's own group of one, on a free port (its default may be taken)
        env["MASTER_PORT"] = str(_free_port())
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = LINE.search(done.stdout)
    assert found is not None, done.stdout
    return found[1], int(found[2]), float(found[3]), int(found[4]), int(found[5])


@pytest.mark.slow  # four processes, two of them under torchrun
def test_every_mode_prints_its_line() -> None:
    idle = _run("sharded-idle")
    gradient = _run("sharded-gradient")
    product = _run("sharded", torchrun=True)
    whole = _run("sharded-whole", torchrun=True)
    # 4 blocks of width 16 (feed-forward 64) between Linear(8, 16) and Linear(16, 10)
    block = 3 * 16 * 16 + 3 * 16 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16 + 4 * 16
    assert (
        idle[1] == gradient[1] == product[1] == whole[1] == 8 * 16 + 16 + 4 * block + 16 * 10 + 10
    )
    assert idle[2] == 0.0 and gradient[2] > 0.0 and product[2] > 0.0 and whole[2] > 0.0
    # every mode reports a peak; peaks of separate processes are not compared (under load a
    # torchrun child's product peak was measured below a plain process's idle one)
    assert min(idle[3], gradient[3], product[3], whole[3]) > 0
    # one rank: its slice of a vector is the whole vector
    assert product[4] == whole[4] == product[1]
