"""`curvcal hessian` on a TorchScript checkpoint with the default settings: the per-sample
trace route needs hooks, which a scripted model does not run, so the trace comes from another
route and must equal the dense Hessian's (it was an internal error before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.Tanh(), nn.Linear(5, 3)).double()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_default_hessian_run_on_a_scripted_checkpoint(tmp_path: Path, run_cli) -> None:
    model = _model()
    torch.jit.script(model).save(str(tmp_path / "m.pt"))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(24, 1, 3, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=generator)
    torch.save({"x": x, "y": y}, tmp_path / "d.pt")
    result = run_cli(
        "--json",
        "hessian",
        tmp_path / "m.pt",
        "--data",
        tmp_path / "d.pt",
        "--trust-checkpoint",
        "--dtype",
        "float64",
    )
    assert result.code == 0, result.output
    report = json.loads(result.stdout)

    params = dict(model.named_parameters())
    names, shapes = list(params), [p.shape for p in params.values()]
    flat = torch.cat([p.detach().reshape(-1) for p in params.values()])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        tensors, start = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            tensors[name] = theta[start : start + shape.numel()].reshape(shape)
            start += shape.numel()
        logits = torch.func.functional_call(model, tensors, (x,))
        return nn.functional.cross_entropy(logits, y)

    dense = torch.autograd.functional.hessian(loss, flat)
    eigenvalues = torch.linalg.eigvalsh(dense)
    results = report["results"]
    assert results["lambda_max"] == pytest.approx(eigenvalues[-1].item(), rel=1e-8)
    low, high = results["trace"]["ci95"]
    assert low <= dense.trace().item() <= high
