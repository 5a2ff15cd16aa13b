"""Test cases: small models, uneven batches and their dense float64 Hessians (torch.func.hessian)."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.gauss_newton import loss_hessians
from curvcal.losses import Loss

N_SAMPLES = 50
BATCH = 7  # 50 = 7·7 + 1: the last batch holds one sample


def make_mlp() -> nn.Module:
    """5 → 8 → 3 MLP (75 parameters), float64, tanh so the Hessian is indefinite."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


class TinyCNN(nn.Module):
    """Conv(1→3, 3×3) + BatchNorm + ReLU + Linear(3·4·4 → 3): a few hundred parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, kernel_size=3, padding=1)
        self.norm = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 4 * 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


def make_cnn() -> nn.Module:
    torch.manual_seed(1)
    model = TinyCNN().double()
    with torch.no_grad():  # non-trivial running statistics, so eval mode matters
        model.norm.running_mean.uniform_(-0.5, 0.5)
        model.norm.running_var.uniform_(0.5, 2.0)
    model.train()  # the caller's mode; the operator must evaluate in eval mode and restore this
    return model


def make_data(kind: str, n: int = N_SAMPLES) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(2)
    shape = (n, 5) if kind == "mlp" else (n, 1, 4, 4)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=generator)
    return x, y


def split(x: Tensor, y: Tensor, size: int) -> list[tuple[Tensor, Tensor]]:
    return [(x[i : i + size], y[i : i + size]) for i in range(0, x.shape[0], size)]


def dense_hessian(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
    names: list[str] | None = None,
) -> Tensor:
    """∇² of the mean loss over (x, y) w.r.t. the named parameters, by torch.func.hessian, in eval mode."""
    params = dict(model.named_parameters())
    names = names or list(params)
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    frozen = {n: p.detach() for n, p in params.items()}
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])
    mean_loss = loss or (lambda z, t: nn.functional.cross_entropy(z, t))
    was_training = model.training
    model.eval()

    def function(theta: Tensor) -> Tensor:
        pieces = [p.reshape(s) for p, s in zip(theta.split(sizes), shapes, strict=True)]
        values = {**frozen, **dict(zip(names, pieces, strict=True))}
        return mean_loss(torch.func.functional_call(model, values, (x,)), y)

    try:
        return torch.func.hessian(function)(flat)
    finally:
        model.train(was_training)


def spectrum_matrix(eigenvalues: Tensor, seed: int = 0) -> Tensor:
    """Q diag(eigenvalues) Qᵀ with a random orthogonal Q, float64."""
    generator = torch.Generator().manual_seed(seed)
    n = eigenvalues.numel()
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q @ torch.diag(eigenvalues.to(torch.float64)) @ q.t()


def _logits_of(model: nn.Module, x: Tensor):  # type: ignore[no-untyped-def]
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]

    def logits(theta: Tensor) -> Tensor:
        pieces = theta.split([math.prod(s) for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        return torch.func.functional_call(model, values, (x,))

    return logits


def dense_gauss_newton(model: nn.Module, x: Tensor, y: Tensor, loss: Loss) -> Tensor:
    """G = (1/N) Σ_n J_nᵀ Λ_n J_n: J from torch.func.jacrev of the logits, Λ the loss's Hessian
    in the logits (autograd row by row, checked in test_gauss_newton)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    model.eval()
    jacobian = torch.func.jacrev(_logits_of(model, x))(flat)  # (N, C, P)
    with torch.no_grad():
        lam = loss_hessians(loss, model(x), y)  # (N, C, C)
    return torch.einsum("ncp,ncd,ndq->pq", jacobian, lam, jacobian) / x.shape[0]


def record_max_basis(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[int | None]:
    """Wrap ``module.eigenvalues`` so that each call's ``max_basis`` is recorded (in the list
    returned) before it runs as it would."""
    seen: list[int | None] = []
    real = module.eigenvalues

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["max_basis"])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "eigenvalues", recorded)
    return seen


class TiedParallel(nn.Module):
    """Two linear layers sharing one weight, side by side (on x and on x reversed): linear in it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, 6), nn.Linear(5, 6), nn.Linear(6, 3)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.a(x)) + torch.relu(self.b(x.flip(1))))
