"""Per-sample squared gradient norms from layer hooks, against one backward per sample."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature import per_sample
from curvcal.curvature.gauss_newton import EngineChoice, gauss_newton_sums, tensor_traces
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.per_sample import Taps, layer_norms, layer_plan
from curvcal.losses import CrossEntropy

from .cases import dense_hessian


def _brute_force(module: nn.Module, x: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """‖∂(w_n·y_n)/∂θ‖² for each sample n by its own backward, for each parameter of ``module``."""
    found: dict[str, list[Tensor]] = {name: [] for name, _ in module.named_parameters()}
    for row in range(x.shape[0]):
        output = module(x[row : row + 1])
        names, params = zip(*module.named_parameters(), strict=True)
        grads = torch.autograd.grad((output * weights[row : row + 1]).sum(), params)
        for name, grad in zip(names, grads, strict=True):
            found[name].append(grad.double().pow(2).sum())
    return {name: torch.stack(values) for name, values in found.items()}


def _hooked(module: nn.Module, x: Tensor, weights: Tensor) -> dict[str, Tensor]:
    names = [name for name, _ in module.named_parameters()]
    wrapper = nn.Sequential(module)  # so that the layer has a module name
    plan = layer_plan(wrapper, [f"0.{name}" for name in names])
    assert isinstance(plan, dict)
    taps = Taps(plan)
    with taps.recording():
        output = wrapper(x)
    assert taps.complete()
    (delta,) = torch.autograd.grad((output * weights).sum(), taps.outputs["0"])
    norms = layer_norms(plan["0"], taps.inputs["0"][0], delta)
    return {name.removeprefix("0."): value for name, value in norms.items()}


def _layer_cases() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    batch_norm = nn.BatchNorm2d(3)
    batch_norm_1d = nn.BatchNorm1d(4)
    with torch.no_grad():
        for norm in (batch_norm, batch_norm_1d):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
            norm.weight.uniform_(0.5, 1.5)
    return [
        ("linear", nn.Linear(5, 4), (6, 5)),
        ("linear over a sequence", nn.Linear(5, 4), (6, 7, 5)),
        ("conv, ghost norm", nn.Conv2d(3, 8, 3, padding=1), (5, 3, 4, 4)),
        ("conv, formed gradients", nn.Conv2d(2, 3, 2, stride=2, dilation=1), (5, 2, 12, 12)),
        (
            "conv, strided and dilated",
            nn.Conv2d(2, 4, 3, stride=2, padding=2, dilation=2),
            (3, 2, 9, 7),
        ),
        ("conv without bias", nn.Conv2d(2, 4, 1, bias=False), (3, 2, 5, 5)),
        ("batch norm 2d", batch_norm.eval(), (4, 3, 5, 5)),
        ("batch norm 1d", batch_norm_1d.eval(), (4, 4)),
    ]


@pytest.mark.parametrize(("label", "module", "shape"), _layer_cases(), ids=lambda v: str(v))
def test_layer_norms_equal_one_backward_per_sample(
    label: str, module: nn.Module, shape: tuple[int, ...]
) -> None:
    module = module.double()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    weights = torch.randn(module(x).shape, generator=generator, dtype=torch.float64)
    expected = _brute_force(module, x, weights)
    found = _hooked(module, x, weights)
    assert set(found) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(found[name], value, rtol=1e-12, atol=1e-14)


def test_both_ways_of_the_outer_norm_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(2)
    delta = torch.randn(4, 9, 3, generator=generator, dtype=torch.float64)
    activation = torch.randn(4, 9, 2, generator=generator, dtype=torch.float64)  # T² > O·I
    formed = per_sample._outer_norms(delta, activation)
    expected = torch.einsum("bto,bti->boi", delta, activation).pow(2).sum((1, 2))
    torch.testing.assert_close(formed, expected)
    monkeypatch.setattr(per_sample, "MATERIALISED_ELEMENTS", 1)  # one row at a time
    torch.testing.assert_close(per_sample._outer_norms(delta, activation), expected)
    ghost = per_sample._outer_norms(delta[:, :2], activation[:, :2])  # T² ≤ O·I, row by row
    expected = torch.einsum("bto,bti->boi", delta[:, :2], activation[:, :2]).pow(2).sum((1, 2))
    torch.testing.assert_close(ghost, expected)


def test_unsupported_layers_are_named() -> None:
    model = nn.ModuleDict(
        {
            "embed": nn.Embedding(5, 3),
            "grouped": nn.Conv2d(4, 4, 3, groups=2),
            "same": nn.Conv2d(2, 2, 3, padding="same"),
            "norm": nn.LayerNorm(3),
            "stats": nn.BatchNorm2d(2, track_running_stats=False),
        }
    )
    for name, why in (
        ("embed.weight", "a parameter of Embedding"),
        ("grouped.weight", "grouped"),
        ("same.weight", "string-padded"),
        ("norm.weight", "a parameter of LayerNorm"),
        ("stats.weight", "without running statistics"),
    ):
        problem = layer_plan(model, [name])
        assert isinstance(problem, str) and problem.startswith(name) and why in problem


class SharedBranches(nn.Module):
    """One convolution applied to two halves of the input, summed: linear in its weight; the
    layer runs twice per forward and the hooks sum both calls' shares before squaring."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        left, right = x[:, :1], x[:, 1:]
        return self.head((torch.relu(self.conv(left)) + torch.relu(self.conv(right))).flatten(1))


def test_a_layer_run_twice_stays_on_the_hooks_and_exact() -> None:
    torch.manual_seed(3)
    model = SharedBranches().double()
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(12, 2, 4, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (12,), generator=generator)
    exact = float(dense_hessian(model, x, y).trace())
    found = tensor_traces(HessianOperator(model, [(x[:5], y[:5]), (x[5:], y[5:])]))
    assert found.total == pytest.approx(exact, rel=1e-10)
    names = tuple(n for n, _ in model.named_parameters())
    plan = layer_plan(model, names)
    assert isinstance(plan, dict)
    choice = EngineChoice(func_usable=False, hooks=plan)
    sums = gauss_newton_sums(model, CrossEntropy(), names, tuple(model.parameters()), x, y, choice)
    assert choice.engine == "hooks" and not choice.fallback
    loop = gauss_newton_sums(
        model, CrossEntropy(), names, tuple(model.parameters()), x, y, EngineChoice(False)
    )
    torch.testing.assert_close(sums[0], loop[0], rtol=1e-10, atol=1e-12)


def test_hooks_give_the_loops_sums_on_torchvision_resnet18() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(5)
    model = torchvision.models.resnet18(num_classes=4).eval()
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(3, 3, 32, 32, generator=generator)
    y = torch.randint(0, 4, (3,), generator=generator)
    names = tuple(n for n, _ in model.named_parameters())
    params = tuple(model.parameters())
    plan = layer_plan(model, names)
    assert isinstance(plan, dict) and len(plan) == 41  # 20 convolutions, 20 BatchNorms, fc
    hooked = EngineChoice(func_usable=False, hooks=plan)
    sums, magnitude, passes = gauss_newton_sums(model, CrossEntropy(), names, params, x, y, hooked)
    assert hooked.engine == "hooks"
    loop = gauss_newton_sums(model, CrossEntropy(), names, params, x, y, EngineChoice(False))
    torch.testing.assert_close(sums, loop[0], rtol=2e-4, atol=1e-6)
    assert magnitude == pytest.approx(loop[1], rel=2e-4) and passes == loop[2]
