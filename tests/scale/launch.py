"""``torchrun --standalone --nproc-per-node 2 -m curvcal ...`` on the CPU (gloo), as the scale
tests launch it: the checkout first on the path, one thread per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def torchrun_json(args: list[str], cwd: Path, timeout: float = 180) -> dict[str, Any]:
    """The report two ranks of ``curvcal ARGS --json`` print; asserts the run succeeded and
    that only rank 0 printed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    completed = subprocess.run(
        [*launcher, "--nproc-per-node", "2", "-m", "curvcal", *args, "--json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count('"schema"') == 1  # rank 1 printed nothing
    return json.loads(completed.stdout)  # type: ignore[no-any-return]
