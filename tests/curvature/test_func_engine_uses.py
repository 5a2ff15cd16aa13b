"""The ``torch.func`` engine of the Gauss–Newton trace against uses of a Parameter it cannot see.

``functional_call`` swaps the tensors registered on the module; a use of the same Parameter that
does not go through the module's attribute (a closure holding it, a plain list or dict) keeps the
original tensor, which ``torch.func`` treats as a constant, so that use's share of every sample's
gradient was dropped: tr(G) came out 20–60% low with an interval of rounding width. The truth
here is a dense float64 G = (1/N) Σ_n J_nᵀ Λ_n J_n whose Jacobians come from autograd with the
model called as it is (no ``functional_call``), so every use counts.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional

from curvcal.curvature.gauss_newton import (
    EngineChoice,
    gauss_newton_sums,
    gauss_newton_trace,
    loss_hessians,
    tensor_traces,
)
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.per_sample import layer_plan
from curvcal.losses import CrossEntropy, Focal, Loss


class ClosureReuse(nn.Module):
    """A layer's weight also used by a closure stored as a plain attribute, and a free scale
    (no layer hooks cover it): linear in each tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 6), nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        shared = self.a.weight
        self.again = lambda x: functional.linear(x, shared)

    def forward(self, x: Tensor) -> Tensor:
        first = torch.relu(self.a(x)) * self.scale
        return self.head(first + torch.relu(self.again(x.flip(1))))


class ListHeld(nn.Module):
    """A registered weight that the forward reads only through a Python list, and a bias through
    a dict: every use of both is outside the module's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 5) / 3)
        self.bias = nn.Parameter(torch.randn(6) / 3)
        self.head = nn.Linear(6, 3)
        self.held = [self.weight]
        self.by_key = {"bias": self.bias}

    def forward(self, x: Tensor) -> Tensor:
        hidden = functional.linear(x, self.held[0], self.by_key["bias"])
        return self.head(torch.relu(hidden))


class Mlp(nn.Module):
    """An ordinary MLP with a free scale (so the hooks cannot serve and ``torch.func`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.b(torch.relu(self.a(x)) * self.scale)))


class SmallCnn(nn.Module):
    """A small CNN with a free per-channel scale."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3).reshape(3, 1, 1))
        self.head = nn.Linear(3 * 4 * 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = functional.max_pool2d(torch.relu(self.conv(x)) * self.scale, 2)
        return self.head(hidden.flatten(1))


class CachedAtInit(nn.Module):
    """A tensor computed from a layer's weight once, at construction, and used by every forward:
    detached, it is a constant (no use of the weight at call time); kept as a view with its
    graph, autograd differentiates through it to the weight, so it is a use."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        kind = torch.float64  # built in float64: .double() would leave a cached view behind
        self.a, self.head = nn.Linear(5, 6, dtype=kind), nn.Linear(6, 3, dtype=kind)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6, dtype=kind))
        cached = self.a.weight.t()
        self.cached = cached.detach().clone() if detach else cached

    def forward(self, x: Tensor) -> Tensor:
        first = torch.relu(self.a(x)) * self.scale
        return self.head(first + torch.relu(x.flip(1) @ self.cached))


BROKEN = [ClosureReuse, ListHeld]
ORDINARY = [Mlp, SmallCnn]


def _case(kind: type[nn.Module]) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(7)
    model = kind().double().eval()  # .double() keeps each Parameter object, so closures follow
    generator = torch.Generator().manual_seed(8)
    shape = (23, 1, 8, 8) if kind is SmallCnn else (23, 5)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (23,), generator=generator)
    return model, x, y


def _dense_gauss_newton(model: nn.Module, x: Tensor, y: Tensor, loss: Loss) -> Tensor:
    """G = (1/N) Σ_n J_nᵀ Λ_n J_n, J_n row by row: the gradient of each logit of sample n with
    respect to the Parameters themselves, the model called as it is (every use counts)."""
    params = list(model.parameters())
    rows = []
    for n in range(x.shape[0]):
        z = model(x[n : n + 1])[0]
        rows.append(
            torch.stack(
                [
                    torch.cat(
                        [
                            g.reshape(-1)
                            for g in torch.autograd.grad(z[c], params, retain_graph=True)
                        ]
                    )
                    for c in range(z.shape[0])
                ]
            )
        )
    jacobian = torch.stack(rows)  # (N, C, P)
    with torch.no_grad():
        lam = loss_hessians(loss, model(x), y)
    return torch.einsum("ncp,ncd,ndq->pq", jacobian, lam, jacobian) / x.shape[0]


def _blocks(matrix: Tensor, model: nn.Module) -> dict[str, float]:
    named = list(model.named_parameters())
    diagonal = matrix.diagonal().split([p.numel() for _, p in named])
    return {name: float(d.sum()) for (name, _), d in zip(named, diagonal, strict=True)}


def _forced_func(
    model: nn.Module, x: Tensor, y: Tensor, loss: Loss
) -> tuple[dict[str, float], EngineChoice]:
    names = tuple(name for name, _ in model.named_parameters())
    choice = EngineChoice(func_usable=True)
    choice.engine = "func"
    sums, _, _ = gauss_newton_sums(model, loss, names, tuple(model.parameters()), x, y, choice)
    return dict(zip(names, (sums / x.shape[0]).tolist(), strict=True)), choice


@pytest.mark.parametrize("loss", [CrossEntropy(), Focal(2.0)], ids=str)
@pytest.mark.parametrize("kind", BROKEN, ids=lambda k: k.__name__)
def test_the_forced_func_engine_counts_every_use_by_falling_back(
    kind: type[nn.Module], loss: Loss
) -> None:
    model, x, y = _case(kind)
    truth = _blocks(_dense_gauss_newton(model, x, y, loss), model)
    found, choice = _forced_func(model, x, y, loss)
    for name, value in truth.items():
        assert found[name] == pytest.approx(value, rel=1e-10, abs=1e-13), name
    assert choice.engine == "loop" and not choice.func_usable
    assert "torch.func did not see every use of" in choice.fallback
    assert "one backward per sample" in choice.fallback


@pytest.mark.parametrize("kind", BROKEN, ids=lambda k: k.__name__)
def test_the_trace_with_the_engine_chosen_by_timing_is_the_dense_truth_and_says_so(
    kind: type[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    import curvcal.curvature.gauss_newton as gauss_newton

    monkeypatch.setattr(gauss_newton, "VMAP_TRY_SECONDS", 1e9)  # always try torch.func
    model, x, y = _case(kind)
    assert isinstance(layer_plan(model, [n for n, _ in model.named_parameters()]), str)
    truth = float(_dense_gauss_newton(model, x, y, CrossEntropy()).trace())
    batches = [(x[:9], y[:9]), (x[9:], y[9:])]
    result = gauss_newton_trace(HessianOperator(model, batches))
    low, high = result.ci95
    assert result.estimate == pytest.approx(truth, rel=1e-10)
    assert low <= truth <= high
    assert "torch.func did not see every use of" in result.interval


@pytest.mark.parametrize("kind", ORDINARY, ids=lambda k: k.__name__)
def test_the_proof_does_not_fire_on_ordinary_models(kind: type[nn.Module]) -> None:
    model, x, y = _case(kind)
    truth = _blocks(_dense_gauss_newton(model, x, y, CrossEntropy()), model)
    found, choice = _forced_func(model, x, y, CrossEntropy())
    for name, value in truth.items():
        assert found[name] == pytest.approx(value, rel=1e-10, abs=1e-13), name
    assert choice.engine == "func" and choice.fallback == ""
    assert "func" in choice.ran


@pytest.mark.parametrize("kind", ORDINARY, ids=lambda k: k.__name__)
def test_the_proof_does_not_fire_in_float32(kind: type[nn.Module]) -> None:
    model, x, y = _case(kind)
    model.float()
    found, choice = _forced_func(model, x.float(), y, CrossEntropy())
    assert choice.engine == "func" and choice.fallback == ""
    traces = tensor_traces(HessianOperator(model.double(), [(x, y)]))
    assert sum(found.values()) == pytest.approx(traces.total, rel=1e-4)


@pytest.mark.parametrize("detach", [True, False], ids=["detached", "view"])
def test_a_tensor_cached_at_construction_is_a_use_exactly_when_autograd_says_so(
    detach: bool,
) -> None:
    torch.manual_seed(7)
    model = CachedAtInit(detach).eval()
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(23, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (23,), generator=generator)
    truth = _blocks(_dense_gauss_newton(model, x, y, CrossEntropy()), model)
    found, choice = _forced_func(model, x, y, CrossEntropy())
    for name, value in truth.items():
        assert found[name] == pytest.approx(value, rel=1e-10, abs=1e-13), name
    assert (choice.engine, choice.fallback == "") == (("func", True) if detach else ("loop", False))
