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

A Parameter may be used by several layers (weights tied in parallel or in series, a classifier
weight shared by two heads) and a layer may run several times in one forward. The gradient of s_n
is then the sum over every use u of G_{n,u} = Σ_t δ_{n,u,t} a_{n,u,t}ᵀ, so its squared norm is the
ghost norm over the positions of all the uses together (their δ and a concatenated along t), and a
bias's or BatchNorm's per-sample gradient is the sum of its uses' gradients before squaring.

:func:`layer_plan` finds every layer that holds a selected Parameter (by identity, wherever it is
registered) and says why the hooks cannot serve when one of them is of another kind (and why);
:class:`Taps` records every call of each planned layer: its input and output during one forward
(the model continues with a copy of each output, so in-place operations after a layer leave the
recorded one intact). A use the hooks cannot see — the Parameter passed to ``F.linear`` or held
by a module of another kind outside the plan — is caught by :func:`unseen_uses`, which compares the
batch's gradient summed from the hooks with autograd's for a random cotangent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.curvature.precision import rounding_share

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: elements of per-sample weight gradients, or of T × T Gram matrices, formed at once (the rest
#: in row chunks)
MATERIALISED_ELEMENTS = 2**24


@dataclass
class Layer:
    """A planned layer: the module, and which of its parameters are selected (their names in
    the operator's selection, by attribute). A Parameter held by several layers is in the
    ``names`` of each, under the one selected name."""

    module: nn.Module
    names: dict[str, str] = field(default_factory=dict)  # "weight"/"bias" -> selected name


def layer_plan(model: nn.Module, names: Sequence[str]) -> dict[str, Layer] | str:
    """Every layer holding one of the selected parameters ``names`` (matched by identity, so a
    tied Parameter is planned in each layer that holds it), by module name, or why the hooks
    cannot give their per-sample norms (a parameter of another kind of module, a grouped or
    non-zero-padded convolution, a BatchNorm without running statistics, a TorchScript model,
    which runs no Python hooks)."""
    if isinstance(model, torch.jit.ScriptModule):
        return "a TorchScript model runs no forward hooks"
    params = dict(model.named_parameters(remove_duplicate=False))
    selected = {id(params[name]): name for name in names}
    plan: dict[str, Layer] = {}
    seen: set[int] = set()
    for owner, module in model.named_modules(remove_duplicate=False):
        if id(module) in seen:  # one module registered under two names runs as one
            continue
        seen.add(id(module))
        for attribute, param in module.named_parameters(recurse=False, remove_duplicate=False):
            name = selected.get(id(param))
            if name is None:
                continue
            problem = _unsupported(module, attribute)
            if problem:
                where = name if owner == name.rpartition(".")[0] else f"{name} (used by {owner})"
                return f"{where}: {problem}"
            plan.setdefault(owner, Layer(module)).names[attribute] = name
    kinds: dict[str, set[bool]] = {}
    for layer in plan.values():
        for attribute, name in layer.names.items():
            kinds.setdefault(name, set()).add(_is_outer(layer.module, attribute))
    for name, kind in kinds.items():
        if len(kind) > 1:
            return f"{name}: used as a weight matrix by one layer and as a vector by another"
    return plan


def _is_outer(module: nn.Module, attribute: str) -> bool:
    """Whether the parameter's gradient is a sum of outer products δ aᵀ (a linear or convolution
    weight) rather than a per-sample vector (a bias, a BatchNorm parameter)."""
    return attribute == "weight" and isinstance(module, nn.Linear | nn.Conv2d)


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
    """Forward hooks on the planned layers that keep the input (detached) and output (in the
    graph) of each of their calls; :meth:`complete` says whether each ran."""

    def __init__(self, plan: dict[str, Layer]) -> None:
        self.plan = plan
        self.inputs: dict[str, list[Tensor]] = {name: [] for name in plan}
        self.outputs: dict[str, list[Tensor]] = {name: [] for name in plan}

    @property
    def calls(self) -> dict[str, int]:
        """How many times each planned layer ran."""
        return {name: len(outputs) for name, outputs in self.outputs.items()}

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
            self.inputs[name].append(args[0].detach())
            self.outputs[name].append(output)
            # the model goes on with a copy: an in-place operation after the layer (ResNet's
            # ReLU(inplace=True), `out += identity`) must not rewrite the output kept here
            return output.clone()

        return hook

    def complete(self) -> bool:
        """Whether every planned layer ran, each call on a tensor output in the graph. (An
        input changed in place after its layer cannot pass unseen: autograd saved it for the
        weight's gradient and refuses the backward.) Uses outside the planned layers are
        :func:`unseen_uses`' to find."""
        return all(self.outputs.values()) and all(
            output.requires_grad for outputs in self.outputs.values() for output in outputs
        )

    def flat_outputs(self) -> list[Tensor]:
        """Every recorded output, layer by layer, call by call (the order
        :func:`parameter_norms` and :func:`hooked_gradients` take their gradients in)."""
        return [output for outputs in self.outputs.values() for output in outputs]


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


def _pieces(module: nn.Module, attribute: str, activation: Tensor, delta: Tensor) -> Any:
    """One call's share of the per-sample gradient of ``module``'s ``attribute``: for a weight
    matrix the factors (δ (B, T, O), a (B, T, I)) with G_n = Σ_t δ_{n,t} a_{n,t}ᵀ, else the
    per-sample gradient itself (B, numel)."""
    rows = delta.shape[0]
    if isinstance(module, nn.Linear):
        delta3 = delta.reshape(rows, -1, delta.shape[-1])
        if attribute == "weight":
            return delta3, activation.reshape(rows, -1, activation.shape[-1])
        return delta3.sum(1)
    if isinstance(module, nn.Conv2d):
        if attribute == "weight":
            patches = nn.functional.unfold(
                activation,
                module.kernel_size,
                dilation=module.dilation,
                padding=module.padding,  # type: ignore[arg-type]
                stride=module.stride,
            )  # (B, Cin·kh·kw, T)
            return _positions_last(delta), patches.transpose(1, 2)
        return delta.flatten(2).sum(2)
    # eval-mode BatchNorm: y = γ·x̂ + β
    channels = delta.shape[1]
    if attribute == "bias":
        return delta.reshape(rows, channels, -1).sum(2)
    shape = (1, -1) + (1,) * (activation.dim() - 2)
    running_mean, running_var = module.running_mean, module.running_var
    assert isinstance(running_mean, Tensor) and isinstance(running_var, Tensor)
    mean = running_mean.reshape(shape)
    scale = torch.rsqrt(running_var.reshape(shape) + float(module.eps))  # type: ignore[arg-type]
    normalised = (activation - mean) * scale
    return (delta * normalised).reshape(rows, channels, -1).sum(2)


def _gathered(
    plan: dict[str, Layer], calls: Sequence[tuple[str, Tensor, Tensor]]
) -> dict[str, list[Any]]:
    """Every selected parameter's pieces (:func:`_pieces`) over the ``calls`` (layer name, its
    input, the gradient at its output), by selected name."""
    found: dict[str, list[Any]] = {}
    for owner, activation, delta in calls:
        layer = plan[owner]
        for attribute, name in layer.names.items():
            found.setdefault(name, []).append(_pieces(layer.module, attribute, activation, delta))
    return found


def _norms_of(pieces: list[Any]) -> Tensor:
    """‖Σ_u G_{n,u}‖² per sample n from the pieces of every use u: float64 (B,)."""
    if isinstance(pieces[0], tuple):
        return _outer_norms(
            torch.cat([delta for delta, _ in pieces], 1),
            torch.cat([activation for _, activation in pieces], 1),
        )
    total = pieces[0]
    for piece in pieces[1:]:
        total = total + piece
    return total.double().pow(2).sum(1)


def _sum_of(pieces: list[Any]) -> Tensor:
    """Σ_n Σ_u G_{n,u}, flattened: the batch's gradient from the pieces of every use u."""
    total: Tensor | None = None
    for piece in pieces:
        value = (
            torch.einsum("bto,bti->oi", piece[0], piece[1]).flatten()
            if isinstance(piece, tuple)
            else piece.sum(0)
        )
        total = value if total is None else total + value
    assert total is not None
    return total


def _calls(taps: Taps, deltas: Sequence[Tensor | None]) -> list[tuple[str, Tensor, Tensor]]:
    """(layer name, input, gradient at the output) for every recorded call, from the gradients
    ``deltas`` of :meth:`Taps.flat_outputs` (``None``: the output does not reach the logits)."""
    calls, position = [], 0
    for owner in taps.plan:
        for activation, output in zip(taps.inputs[owner], taps.outputs[owner], strict=True):
            delta = deltas[position]
            gradient = torch.zeros_like(output) if delta is None else delta.detach()
            calls.append((owner, activation, gradient))
            position += 1
    return calls


def parameter_norms(taps: Taps, deltas: Sequence[Tensor | None]) -> dict[str, Tensor]:
    """Each selected parameter's per-sample squared gradient norms (float64, (B,)), by selected
    name, summed over every recorded use before squaring; ``deltas``: the gradients at
    :meth:`Taps.flat_outputs`."""
    return {
        name: _norms_of(pieces)
        for name, pieces in _gathered(taps.plan, _calls(taps, deltas)).items()
    }


def hooked_gradients(taps: Taps, deltas: Sequence[Tensor | None]) -> dict[str, Tensor]:
    """Each selected parameter's gradient summed over the batch and over every recorded use
    (flattened), by selected name: what autograd gives when the hooks saw every use."""
    return {
        name: _sum_of(pieces) for name, pieces in _gathered(taps.plan, _calls(taps, deltas)).items()
    }


def layer_norms(layer: Layer, activation: Tensor, delta: Tensor) -> dict[str, Tensor]:
    """Each selected parameter's per-sample squared gradient norms (float64, (B,)), by selected
    name, from one call of one layer: its input ``activation`` and the gradient ``delta`` at its
    output."""
    return {
        name: _norms_of([_pieces(layer.module, attribute, activation, delta)])
        for attribute, name in layer.names.items()
    }


def proof_cotangent(shape: Sequence[int], device: torch.device | None = None) -> Tensor:
    """The random cotangent w of the every-use proof (:func:`differing_gradient`): float64
    Gaussian of ``shape`` from a fixed seed, so the same rows get the same check."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float64).to(device)


def differing_gradient(
    names: Sequence[str],
    params: Sequence[Tensor],
    found: Sequence[Tensor | None],
    truth: Sequence[Tensor | None],
    ulps: float,
) -> str:
    """The first selected parameter whose gradient ``found`` by a per-sample engine (summed over
    the rows, for the cotangent w of :func:`proof_cotangent`) differs from autograd's ``truth``
    for the same rows and w — which differentiates the Parameter itself, so every use of it — by
    more than ``ulps`` ε of the parameters' dtype (capped in half precision:
    :func:`~curvcal.curvature.precision.rounding_share`) relative to the two gradients' norms ('' when
    none does: the engine saw every use). ``None`` is a zero gradient. A use the engine missed
    changes autograd's gradient for almost every w: it is the one proof that the layer hooks
    (:func:`unseen_uses`) and ``torch.func`` share."""
    share = rounding_share(params[0].dtype, ulps)
    for name, param, got_, want_ in zip(names, params, found, truth, strict=True):
        zero = torch.zeros(param.numel(), dtype=torch.float64, device=param.device)
        want = zero if want_ is None else want_.detach().double().flatten()
        got = zero if got_ is None else got_.detach().double().flatten()
        allowed = share * (float(want.norm()) + float(got.norm()))
        if not float((got - want).norm()) <= allowed:
            return name
    return ""


def unseen_uses(
    taps: Taps, logits: Tensor, names: Sequence[str], params: Sequence[Tensor], ulps: float
) -> str:
    """The first selected parameter with a use the hooks did not see ('' when they saw every
    use of every one), from one backward of wᵀz (``logits`` z of the recorded forward, w of
    :func:`proof_cotangent`) to both the recorded outputs and the parameters: the batch's
    gradient summed from the hooks (:func:`hooked_gradients`) must equal autograd's
    (:func:`differing_gradient`). A missed use: the Parameter passed to ``F.linear``, or held by
    a module outside the plan."""
    outputs = taps.flat_outputs()
    grads = torch.autograd.grad(
        logits,
        [*outputs, *params],
        grad_outputs=proof_cotangent(logits.shape).to(logits),
        retain_graph=True,
        allow_unused=True,
    )
    hooked = hooked_gradients(taps, grads[: len(outputs)])
    found = [hooked.get(name) for name in names]
    return differing_gradient(names, params, found, grads[len(outputs) :], ulps)
