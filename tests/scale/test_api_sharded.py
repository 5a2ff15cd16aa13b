"""The Python API on a model sharded with ``fully_shard`` (one gloo process, in a child so the
test process keeps no process group): ``curvcal.hessian_eigenvalues`` builds its operator where
the commands do (``build_operator``), so it multiplies by central differences and finds the
exact λmax of the same model unsharded; ``curvcal.curvature.build_operator`` (and its former name
``operator_for``, with a DeprecationWarning) gives the central-difference operator, where the
function of that name once built a ``HessianOperator``; a ``HessianOperator`` built directly refuses the
sharded model in one line (the API built one and failed inside torch: "Attempted to access the
data pointer on an invalid python storage")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys, warnings
import torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
import curvcal
from curvcal.curvature import build_operator, central_difference
from curvcal.curvature.operator import HessianOperator
from curvcal.distributed import leave
from curvcal.errors import InputError
from curvcal.losses import loss_from_name
from curvcal.sharding import shard_model

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
).double()
generator = torch.Generator().manual_seed(1)
x = torch.randn(20, 4, dtype=torch.float64, generator=generator)
y = torch.randint(0, 3, (20,), generator=generator)
params = [p.detach() for p in model.parameters()]
sizes = [p.numel() for p in params]
names = [n for n, _ in model.named_parameters()]

def loss(flat):
    pieces = [piece.reshape(p.shape) for piece, p in zip(flat.split(sizes), params)]
    logits = torch.func.functional_call(model, dict(zip(names, pieces)), (x,))
    return torch.nn.functional.cross_entropy(logits, y)

dense = torch.func.hessian(loss)(torch.cat([p.reshape(-1) for p in params]))
exact = float(torch.linalg.eigvalsh(dense)[-1])
shard_model(model, "modules", torch.device("cpu"))
spectrum = curvcal.hessian_eigenvalues(model, [(x, y)], k=1, tol=1e-10)
try:
    HessianOperator(model, [(x, y)], "ce")
    refusal = None
except InputError as error:
    refusal = error.message
built = type(build_operator(model, loss_from_name("ce", 0.0), [(x, y)])).__name__
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    former = type(central_difference.operator_for(model, loss_from_name("ce", 0.0), [(x, y)]))
warned = [str(w.message) for w in caught if w.category is DeprecationWarning]
leave()
print(json.dumps({"exact": exact, "got": spectrum.values[0].value,
                  "engine": spectrum.engine, "refusal": refusal, "built": built,
                  "former": former.__name__, "warned": warned}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # a child process importing torch and joining a gloo group: ~10 s
def test_the_api_takes_a_sharded_model_by_central_differences(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["engine"] == "central-difference"
    assert result["got"] == pytest.approx(result["exact"], rel=1e-8)
    assert result["refusal"] is not None
    assert "is sharded with fully_shard" in result["refusal"]
    assert "curvcal.curvature.build_operator" in result["refusal"]
    assert result["built"] == result["former"] == "CentralDifferenceOperator"
    assert len(result["warned"]) == 1 and "now called build_operator" in result["warned"][0]
