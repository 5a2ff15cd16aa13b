"""Per-sample squared gradient norms of linear, convolution and BatchNorm parameters, from hooks.

For a layer y = W·a (+ b) applied at positions t (one position for a plain linear layer, the
output pixels for a convolution, with a_t the unfolded input patch), the gradient of a
per-sample scalar s_n with respect to W is G_n = Σ_t δ_{n,t} a_{n,t}ᵀ with δ = ∂s/∂y, so

    ‖G_n‖² = Σ_{t,t'} (δ_{n,t}·δ_{n,t'}) (a_{n,t}·a_{n,t'})        (the "ghost norm"),

computed either way round: from the two T × T Gram matrices when T² is smaller than the weight,
else by forming G_n. The bias gradient is Σ_t δ_{n,t}. An eval-mode BatchNorm layer
y = γ·x̂ + β (x̂ normalised by the running statistics) has ∂s/∂γ_c = Σ_p δ_{n,c,p} x̂_{n,c,p} and
∂s/∂β_c = Σ_p δ_{n,c,p}. One backward of Σ_n s_n with respect to the layers' outputs — no weight
gradient is formed — gives every sample's norms at once, where per-sample backward passes would
need one pass per sample.

:func:`layer_plan` says whether every selected parameter belongs to such a layer (and why not);
:class:`Taps` records each planned layer's input and output during one forward (the model
continues with a copy of each output, so in-place operations after a layer leave the recorded
one intact).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: elements of per-sample weight gradients, or of T × T Gram matrices, formed at once (the rest
#: in row chunks)
MATERIALISED_ELEMENTS = 2**24


@dataclass
class Layer:
    """A planned layer: the module, and which of its parameters are selected (their names in
    the operator's selection, by attribute)."""

    module: nn.Module
    names: dict[str, str] = field(default_factory=dict)  # "weight"/"bias" -> selected name


def layer_plan(model: nn.Module, names: Sequence[str]) -> dict[str, Layer] | str:
    """The layers owning the selected parameters ``names``, by module name, or why the hooks
    cannot give their per-sample norms (a parameter of another kind of module, a grouped or
    non-zero-padded convolution, a BatchNorm without running statistics)."""
    plan: dict[str, Layer] = {}
    for name in names:
        owner, _, attribute = name.rpartition(".")
        module = model.get_submodule(owner)
        problem = _unsupported(module, attribute)
        if problem:
            return f"{name}: {problem}"
        plan.setdefault(owner, Layer(module)).names[attribute] = name
    return plan


def _unsupported(module: nn.Module, attribute: str) -> str:
    if attribute not in ("weight", "bias"):
        return f"a parameter {attribute!r} of {type(module).__name__}"
    if isinstance(module, nn.Linear):
        return ""
    if isinstance(module, nn.Conv2d):
        if module.groups != 1 or module.padding_mode != "zeros" or isinstance(module.padding, str):
            return "a grouped, string-padded or not zero-padded convolution"
        return ""
    if isinstance(module, _BATCH_NORMS):
        if module.running_mean is None or module.running_var is None:
            return "BatchNorm without running statistics"
        return ""
    return f"a parameter of {type(module).__name__}"


class Taps:
    """Forward hooks on the planned layers that keep each one's input (detached) and output (in
    the graph) and count the calls; :meth:`complete` says whether each ran exactly once."""

    def __init__(self, plan: dict[str, Layer]) -> None:
        self.plan = plan
        self.inputs: dict[str, Tensor] = {}
        self.outputs: dict[str, Tensor] = {}
        self.calls: dict[str, int] = dict.fromkeys(plan, 0)

    @contextmanager
    def recording(self) -> Iterator[Taps]:
        handles = [
            layer.module.register_forward_hook(self._hook(name))
            for name, layer in self.plan.items()
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
            self.calls[name] += 1
            self.inputs[name] = args[0].detach()
            self.outputs[name] = output
            # the model goes on with a copy: an in-place operation after the layer (ResNet's
            # ReLU(inplace=True), `out += identity`) must not rewrite the output kept here
            return output.clone()

        return hook

    def complete(self) -> bool:
        """Whether every planned layer ran exactly once, on a tensor output in the graph. (An
        input changed in place after its layer cannot pass unseen: autograd saved it for the
        weight's gradient and refuses the backward.)"""
        return all(count == 1 for count in self.calls.values()) and all(
            output.requires_grad for output in self.outputs.values()
        )


def _outer_norms(delta: Tensor, activation: Tensor) -> Tensor:
    """‖Σ_t δ_{n,t} a_{n,t}ᵀ‖² for each n, δ (B, T, O) and a (B, T, I): float64 (B,)."""
    rows, positions, outputs = delta.shape
    inputs = activation.shape[2]
    if positions * positions <= outputs * inputs:
        chunk = max(1, MATERIALISED_ELEMENTS // (positions * positions))
        return torch.cat(
            [
                _ghost(delta[start : start + chunk], activation[start : start + chunk])
                for start in range(0, rows, chunk)
            ]
        )
    chunk = max(1, MATERIALISED_ELEMENTS // (outputs * inputs))
    pieces = [
        torch.einsum(
            "bto,bti->boi", delta[start : start + chunk], activation[start : start + chunk]
        )
        .double()
        .pow(2)
        .sum((1, 2))
        for start in range(0, rows, chunk)
    ]
    return torch.cat(pieces)


def _ghost(delta: Tensor, activation: Tensor) -> Tensor:
    """Σ_{t,t'} (δ_t·δ_t')(a_t·a_t') per row, from the two T × T Gram matrices, in float64."""
    delta64, activation64 = delta.double(), activation.double()
    gram_delta = delta64 @ delta64.transpose(1, 2)
    gram_activation = activation64 @ activation64.transpose(1, 2)
    return (gram_delta * gram_activation).sum((1, 2))


def _positions_last(tensor: Tensor) -> Tensor:
    """(B, channels, *spatial) → (B, T, channels)."""
    return tensor.flatten(2).transpose(1, 2)


def layer_norms(layer: Layer, activation: Tensor, delta: Tensor) -> dict[str, Tensor]:
    """Each selected parameter's per-sample squared gradient norms (float64, (B,)), by selected
    name, from the layer's input ``activation`` and the gradient ``delta`` at its output."""
    module, found = layer.module, {}
    if isinstance(module, nn.Linear):
        rows = delta.shape[0]
        delta3 = delta.reshape(rows, -1, delta.shape[-1])
        if "weight" in layer.names:
            found["weight"] = _outer_norms(
                delta3, activation.reshape(rows, -1, activation.shape[-1])
            )
        if "bias" in layer.names:
            found["bias"] = delta3.sum(1).double().pow(2).sum(1)
    elif isinstance(module, nn.Conv2d):
        if "weight" in layer.names:
            patches = nn.functional.unfold(
                activation,
                module.kernel_size,
                dilation=module.dilation,
                padding=module.padding,  # type: ignore[arg-type]
                stride=module.stride,
            )  # (B, Cin·kh·kw, T)
            found["weight"] = _outer_norms(_positions_last(delta), patches.transpose(1, 2))
        if "bias" in layer.names:
            found["bias"] = delta.flatten(2).sum(2).double().pow(2).sum(1)
    else:  # eval-mode BatchNorm: y = γ·x̂ + β
        shape = (1, -1) + (1,) * (activation.dim() - 2)
        running_mean, running_var = module.running_mean, module.running_var
        assert isinstance(running_mean, Tensor) and isinstance(running_var, Tensor)
        mean = running_mean.reshape(shape)
        scale = torch.rsqrt(running_var.reshape(shape) + float(module.eps))  # type: ignore[arg-type]
        rows, channels = delta.shape[:2]
        if "weight" in layer.names:
            normalised = (activation - mean) * scale
            per_channel = (delta * normalised).reshape(rows, channels, -1).sum(2)
            found["weight"] = per_channel.double().pow(2).sum(1)
        if "bias" in layer.names:
            found["bias"] = delta.reshape(rows, channels, -1).sum(2).double().pow(2).sum(1)
    return {layer.names[attribute]: value for attribute, value in found.items()}
