"""`curvcal hessian --curvature ggn|fisher|empirical-fisher` end to end, against dense float64
matrices built here from full Jacobians and per-sample gradients; and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from curvcal.models import DigitsCNN

N_SAMPLES = 30
ARCH = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Tensor, Tensor, Path, Path]:
    root = tmp_path_factory.mktemp("kinds")
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=3, width=1).double().eval()  # 1,185 parameters
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 1, 8, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (N_SAMPLES,), generator=generator)
    torch.save({"x": x, "y": y}, root / "data.pt")
    checkpoint = root / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint), ARCH)
    return model, x, y, checkpoint, root / "data.pt"


def _flat(model: nn.Module, x: Tensor) -> tuple[object, Tensor]:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]

    def logits(theta: Tensor) -> Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: piece.reshape(s) for n, piece, s in zip(names, pieces, shapes, strict=True)}
        return torch.func.functional_call(model, values, (x,))

    return logits, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def dense_ggn_ce(model: nn.Module, x: Tensor) -> Tensor:
    """(1/N) Σ_n J_nᵀ (diag p_n − p_n p_nᵀ) J_n from the full Jacobian of the logits."""
    logits, flat = _flat(model, x)
    jacobian = torch.autograd.functional.jacobian(logits, flat)  # type: ignore[arg-type]
    p = torch.softmax(logits(flat).detach(), dim=1)  # type: ignore[operator]
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("nkp,nkl,nlq->pq", jacobian, lam, jacobian) / x.shape[0]


def dense_empirical_fisher_ce(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    rows = []
    for n in range(x.shape[0]):
        value = nn.functional.cross_entropy(model(x[n : n + 1]), y[n : n + 1])
        grads = torch.autograd.grad(value, list(model.parameters()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    stacked = torch.stack(rows)
    return stacked.T @ stacked / x.shape[0]


def _args(checkpoint: Path, data: Path, *extra: str) -> list[str]:
    return ["hessian", str(checkpoint), "--data", str(data), "--dtype", "float64",
            "--device", "cpu", "--batch-size", "7", *extra]  # fmt: skip


@pytest.mark.parametrize("kind", ["ggn", "fisher"])
def test_ggn_and_fisher_of_ce_match_the_dense_matrix(run_cli, case, kind: str) -> None:
    model, x, _y, checkpoint, data = case
    dense = dense_ggn_ce(model, x)  # for cross-entropy the Fisher is the GGN
    exact = torch.linalg.eigvalsh(dense)
    result = run_cli(
        *_args(checkpoint, data, "--curvature", kind, "--top-k", "2", "--tol", "1e-8", "--json")
    )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    results = document["results"]
    assert document["settings"]["hessian"]["curvature"] == kind
    assert results["operator"]["curvature"] == kind
    assert results["eigenvalues"] == pytest.approx(exact[-2:].flip(0).tolist(), rel=1e-6)
    trace = results["trace"]  # auto: the exact Gauss–Newton trace, no product
    assert trace["method"] == "gauss-newton" and trace["matvecs"] == 0
    assert trace["estimate"] == pytest.approx(float(dense.trace()), rel=1e-10)


def test_empirical_fisher_density_layers_and_tables(run_cli, case) -> None:
    model, x, y, checkpoint, data = case
    dense = dense_empirical_fisher_ce(model, x, y)
    extra = ("--curvature", "empirical-fisher", "--density", "--density-runs", "2",
             "--per-layer", "--probes", "30", "--format", "markdown")  # fmt: skip
    result = run_cli(*_args(checkpoint, data, *extra))
    assert result.code == 0, result.stderr
    for title in ("empirical Fisher eigenvalues", "empirical Fisher trace",
                  "per-module empirical Fisher blocks", "empirical Fisher eigenvalue density"):  # fmt: skip
        assert title in result.stdout
    assert "each block is the empirical Fisher with respect to" in result.stdout
    json_run = run_cli(*_args(checkpoint, data, *extra[:-2], "--tol", "1e-8", "--json"))
    assert json_run.code == 0, json_run.stderr
    results = json.loads(json_run.stdout)["results"]
    assert results["lambda_max"] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-6)
    assert results["trace"]["method"] == "hutchpp"
    low, high = results["trace"]["ci95"]
    assert low <= float(dense.trace()) <= high


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--curvature", "gauss"), "--curvature"),
        (("--curvature", "ggn", "--trace-method", "gauss-newton+hutchpp"), "--trace-method"),
        (("--curvature", "empirical-fisher", "--trace-method", "gauss-newton"), "--trace-method"),
        (("--curvature", "ggn", "--mode", "train"), "--curvature"),
        (("--curvature", "fisher", "--hvp", "func"), "--hvp"),
    ],
)
def test_refusals_are_one_line(run_cli, case, extra: tuple[str, ...], message: str) -> None:
    _model, _x, _y, checkpoint, data = case
    result = run_cli(*_args(checkpoint, data, *extra))
    assert result.code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
