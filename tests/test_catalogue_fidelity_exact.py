"""Catalogue: no silent wrong number from the Gauss–Newton trace, through the CLI (exit code and
message). Each case failed before the fix: a tied weight's trace 20–35% low and called exact, a
gate off in the first rows taken as linear, a saturated model's trace negative and "exact".
Truth: dense float64 Hessians by torch.func.hessian."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from tests.curvature.cases import TiedParallel  # the --arch py: path below names it here


class LateGate(nn.Module):
    """A tanh only on the rows whose first feature is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc(x)
        return self.head(torch.where(x[:, :1] > 0, torch.tanh(hidden), torch.relu(hidden)))


def _files(root: Path, model: nn.Module, x: Tensor, y: Tensor) -> tuple[Path, Path]:
    checkpoint, data = root / "model.safetensors", root / "data.pt"
    save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    torch.save({"x": x, "y": y}, data)
    return checkpoint, data


def _run(run_cli, checkpoint: Path, data: Path, arch: str, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli(
        "hessian", checkpoint, "--data", data, "--arch", f"py:{__name__}:{arch}",
        "--trust-checkpoint", "--dtype", "float64", "--device", "cpu", "--batch-size", "6",
        "--json", *extra,
    )  # fmt: skip


def _truth(model: nn.Module, x: Tensor, y: Tensor) -> float:
    params = dict(model.named_parameters())
    names = list(params)
    sizes = [params[n].numel() for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss(theta: Tensor) -> Tensor:
        values = {
            n: p.reshape(params[n].shape) for n, p in zip(names, theta.split(sizes), strict=True)
        }
        return nn.functional.cross_entropy(torch.func.functional_call(model, values, (x,)), y)

    return float(torch.func.hessian(loss)(flat).trace())


def _data(seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(20, 5, generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 3, (20,), generator=generator)


def test_a_tied_weights_exact_trace_is_the_dense_hessians(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = TiedParallel().double().eval()
    x, y = _data(2)
    checkpoint, data = _files(tmp_path, model, x, y)
    result = _run(run_cli, checkpoint, data, "TiedParallel", "--trace-method", "gauss-newton")
    assert result.code == 0, result.stderr
    trace = json.loads(result.stdout)["results"]["trace"]
    truth = _truth(model, x, y)
    assert trace["method"] == "gauss-newton"
    assert trace["estimate"] == pytest.approx(truth, rel=1e-10)
    assert trace["ci95"][0] <= truth <= trace["ci95"][1]


def test_a_gate_off_in_the_first_rows_is_not_called_exact(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = LateGate().double().eval()
    x, y = _data(4)
    x[:, 0] = x[:, 0].abs() + 0.1
    x[:12, 0] *= -1  # the gate is off in the first two batches
    checkpoint, data = _files(tmp_path, model, x, y)
    result = _run(run_cli, checkpoint, data, "LateGate", "--trace-method", "gauss-newton")
    assert result.code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--trace-method" in lines[0]
    assert "not linear in fc.weight" in lines[0] and "Traceback" not in result.stderr
    result = _run(run_cli, checkpoint, data, "LateGate", "--probes", "300")
    assert result.code == 0, result.stderr
    trace = json.loads(result.stdout)["results"]["trace"]
    truth = _truth(model, x, y)
    assert trace["method"] == "gauss-newton+hutchpp"
    assert trace["ci95"][0] <= truth <= trace["ci95"][1]


def test_a_saturated_models_exact_trace_is_not_negative(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(6)
    model = TiedParallel().double().eval()
    with torch.no_grad():
        model.head.bias[0] += 150.0
        model.head.weight[0] *= 30.0
    x, y = _data(6)
    checkpoint, data = _files(tmp_path, model, x, y)
    result = _run(run_cli, checkpoint, data, "TiedParallel", "--trace-method", "gauss-newton")
    assert result.code == 0, result.stderr
    trace = json.loads(result.stdout)["results"]["trace"]
    assert trace["estimate"] >= 0 and trace["ci95"][0] >= 0
    assert "positive semi-definite" in trace["interval"]
