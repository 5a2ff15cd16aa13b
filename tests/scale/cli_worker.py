"""One rank of several ``curvcal`` command lines run in one torchrun launch (by
tests/scale/test_torchrun_text.py): the launch and the imports are paid once, not per command.

Under ``python -m torch.distributed.run --nproc-per-node W cli_worker.py OUT RUNS``, where
``RUNS`` is a JSON file mapping a name to a command line: run each command line in turn through
``curvcal.cli.main`` (each joins the process group and leaves it at its end, as a separate
``torchrun -m curvcal`` run does) and write ``{name: {"code", "stdout", "stderr"}}`` to
``OUT/rank{r}.pt``.

Each command's process group finds its ranks under keys of its own in torchrun's store: a second
group joined under the keys of the first would read the first one's closed addresses and hang.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from curvcal.cli import main

_join = dist.init_process_group
_joined = 0


def _join_under_fresh_keys(*args: object, **kwargs: object) -> None:
    """``init_process_group`` as curvcal calls it, on this launch's store under a new prefix."""
    global _joined
    _joined += 1
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    kwargs.update(
        store=dist.PrefixStore(f"command{_joined}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    _join(*args, **kwargs)  # type: ignore[arg-type]


def run(args: list[str]) -> dict[str, object]:
    """The exit code and what ``curvcal ARGS`` wrote to stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(args)
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


if __name__ == "__main__":
    dist.init_process_group = _join_under_fresh_keys  # type: ignore[assignment]
    out, runs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    results = {name: run(args) for name, args in runs.items()}
    torch.save(results, out / f"rank{os.environ['RANK']}.pt")
