"""Activation checkpointing during products (``checkpoint_activations``): the products are those
of a dense float64 Hessian built independently, the caller's model is left as it was, and the
option is refused where it cannot run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from curvcal.curvature.api import hessian_operator
from curvcal.curvature.recompute import checkpoint_targets, recomputed_activations
from curvcal.errors import InputError
from curvcal.settings.hessian import HessianSettings
from tests.curvature.test_half_precision import TinyTransformer, _case, dense_hessian


class Stages(nn.Module):
    """Two stages of a CNN and a head: top-level blocks, no container of layers."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Tanh())
        self.stage = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3), nn.Softplus())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(27, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage(self.stem(x)))


def test_targets_are_the_layer_stack_or_the_top_level_blocks() -> None:
    transformer = TinyTransformer()
    assert checkpoint_targets(transformer) == list(transformer.encoder.layers)
    stages = Stages()  # no stack of layers: the top-level stages
    assert checkpoint_targets(stages) == [stages.stem, stages.stage, stages.head]
    flat = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert checkpoint_targets(flat) == [flat[0], flat[2]]
    blocks = nn.Sequential(nn.Linear(3, 4), nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)]))
    assert checkpoint_targets(blocks) == list(blocks[1])


@pytest.mark.parametrize("name", ["transformer", "stages"])
def test_products_equal_the_dense_hessian(name: str) -> None:
    if name == "transformer":
        model, batches = _case("transformer")
    else:
        torch.manual_seed(1)
        model = Stages().double().eval()
        x = torch.randn(23, 2, 7, 7, dtype=torch.float64)
        y = torch.randint(0, 3, (23,))
        batches = [(x[:9], y[:9]), (x[9:], y[9:])]
    dense = dense_hessian(model, batches)
    n_params = dense.shape[0]
    vectors = torch.randn(
        n_params, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    plain = hessian_operator(model, batches, engine="autograd", keep_graphs="never")
    recomputed = hessian_operator(model, batches, checkpoint_activations=True)
    assert recomputed.checkpoint_activations and not recomputed.graphs_kept
    # modules inside the blocks are called again when the backward recomputes a block
    inner = [m for block in checkpoint_targets(model) for m in list(block.modules())[1:]]
    calls: list[str] = []

    def counted(operator: object) -> torch.Tensor:
        hooks = [m.register_forward_hook(lambda *_: calls.append("")) for m in inner]
        try:
            return operator.matmat(vectors)  # type: ignore[attr-defined]
        finally:
            for hook in hooks:
                hook.remove()

    expected = counted(plain)
    plain_calls = len(calls)
    calls.clear()
    got = counted(recomputed)
    assert len(calls) > plain_calls
    assert recomputed.engine == "autograd"
    torch.testing.assert_close(got, dense @ vectors, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_the_model_is_left_as_it_was() -> None:
    model, batches = _case("transformer")
    before = {id(m): m.__dict__.get("forward") for m in model.modules()}
    with recomputed_activations(model):
        assert all("forward" in layer.__dict__ for layer in model.encoder.layers)
    assert {id(m): m.__dict__.get("forward") for m in model.modules()} == before
    hessian_operator(model, batches, checkpoint_activations=True).matvec(
        torch.ones(sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    )
    assert {id(m): m.__dict__.get("forward") for m in model.modules()} == before


def test_refused_with_torch_func() -> None:
    model, batches = _case("cnn")
    with pytest.raises(InputError) as caught:
        hessian_operator(model, batches, engine="func", checkpoint_activations=True)
    assert caught.value.what == "checkpoint_activations"
    with pytest.raises(InputError) as caught:
        HessianSettings(hvp="func", checkpoint_activations=True)
    assert caught.value.what == "--checkpoint-activations"
