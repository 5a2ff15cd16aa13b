"""`curvcal hessian --loss own` on a checkpoint trained with FLSD-53, against the dense float64
Hessian of the FLSD-53 loss with each sample's γ held at its value at θ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from curvcal.models import DigitsCNN

N_SAMPLES = 30
METADATA = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
    "curvcal.loss": "flsd53",
}


def _model() -> nn.Module:
    torch.manual_seed(4)
    model = DigitsCNN(num_classes=3, width=1).double().eval()
    with torch.no_grad():  # sharper outputs: samples on both sides of p_y = 0.2
        model.classifier[3].weight.mul_(8.0)
    return model


def _dense_flsd53(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, float, Tensor]:
    """The Hessian of (1/N) Σ_i −(1 − p_y,i)^γ_i log p_y,i with γ_i fixed at θ, the loss, and γ."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with torch.no_grad():
        p_y = torch.softmax(model(x), 1)[torch.arange(len(y)), y]
    gammas = torch.where(p_y < 0.2, 5.0, 3.0).to(torch.float64)

    def loss(theta: Tensor) -> Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: t.reshape(s) for n, t, s in zip(names, pieces, shapes, strict=True)}
        p = torch.softmax(torch.func.functional_call(model, values, (x,)), 1)
        p = p[torch.arange(len(y)), y]
        return (-((1 - p) ** gammas) * torch.log(p)).mean()

    return torch.func.hessian(loss)(flat), float(loss(flat)), gammas


def test_own_loss_of_an_flsd53_checkpoint_matches_the_dense_hessian(
    run_cli, tmp_path: Path
) -> None:
    model = _model()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(N_SAMPLES, 1, 8, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (N_SAMPLES,), generator=generator)
    torch.save({"x": x, "y": y}, tmp_path / "data.pt")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp_path / "flsd53.safetensors"), METADATA)
    dense, mean_loss, gammas = _dense_flsd53(model, x, y)
    assert {float(g) for g in gammas} == {5.0, 3.0}  # both groups are exercised

    args = ["hessian", str(tmp_path / "flsd53.safetensors"), "--data", str(tmp_path / "data.pt")]
    result = run_cli(
        *args,
        *("--loss", "own", "--dtype", "float64", "--device", "cpu", "--batch-size", "11"),
        *("--top-k", "2", "--tol", "1e-10", "--no-trace", "--json"),
    )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    operator = document["results"]["operator"]
    assert operator["loss"] == "flsd53" and operator["gamma"] is None
    assert operator["mean_loss"] == pytest.approx(mean_loss, rel=1e-12)
    expected = torch.linalg.eigvalsh(dense).flip(0)[:2].tolist()
    found = [v["value"] for v in document["results"]["spectrum"]["values"]]
    assert found == pytest.approx(expected, rel=1e-8)
    assert document["results"]["lambda_max"] == pytest.approx(expected[0], rel=1e-8)
    assert document["settings"]["hessian"]["loss"] == "own"
    assert document["results"]["operator"]["loss"] == "flsd53"


def test_flsd53_with_a_focal_gamma_in_its_metadata_is_refused(run_cli, tmp_path: Path) -> None:
    model = _model()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / "odd.safetensors"
    save_file(state, str(path), {**METADATA, "curvcal.gamma": "2"})
    torch.save({"x": torch.randn(4, 1, 8, 8), "y": torch.tensor([0, 1, 2, 0])}, tmp_path / "d.pt")
    result = run_cli("hessian", str(path), "--data", str(tmp_path / "d.pt"), "--loss", "own")
    assert result.code == 2
    assert "metadata says loss flsd53 with curvcal.gamma '2'" in result.stderr
