"""Which engine computes a batch's Hessian-vector products, and the model's state while it does.

For a batch loss ℓ_B(θ) = Σ_{i∈B} ℓ(f_θ(x_i), y_i) and m vectors v_1..v_m, both engines
return H_B·v_j = ∇²_θ ℓ_B · v_j, each vector split into one piece per parameter (``tangents[i]`` has
shape ``(m, *params[i].shape)``):

* ``autograd``: :func:`double_backward_hvp` — the gradient g = ∇_θ ℓ_B is formed once with
  ``create_graph=True`` and each product is the vector-Jacobian product J_g(θ)ᵀ·v_j = H_B·v_j
  against that graph (one backward per vector, the forward and first backward shared). Works on
  TorchScript modules too, and (``create_graph=True``) keeps the products differentiable in θ,
  which the trace penalty of :mod:`curvcal.curvature.penalty` trains through.
* ``func``: :func:`func_hvp`, forward-over-reverse: ``torch.func.jvp`` of ``torch.func.grad``
  of a ``functional_call`` of the model, vectorised over the vectors with ``torch.func.vmap``.

:func:`engine_for` is the ``auto`` rule: ``autograd`` for a single vector (on the bundled CNN
110 ms against 146 ms for ``func``: forward-mode differentiation of a convolution's backward
costs about three convolution backwards where double backward needs two, and the ``torch.func``
transforms add a fixed cost per call), and on the CPU for blocks too: there a block of m
vectors by double backward shares the forward and the first backward among them as ``vmap``
does, and measured as fast (a block of 8: 0.167 s against 0.172 s on the bundled CNN, 16 ms
against 17 ms on a 64-32-10 MLP) while holding one graph instead of m and never paying
torch.func's first-call cost (0.3–2.4 s). On CUDA ``func`` runs blocks of several vectors,
unless torch.func cannot trace the model (TorchScript, custom autograd Functions without
``setup_context``, BatchNorm in train mode), when the operator falls back to ``autograd``.
Both kernels are here, one batch at a time; the operator sums them over the data.

:func:`prepared_model` puts a model in the requested mode for the products and restores its
modules' training flags, the global TF32 flags and, in train mode, its buffers afterwards; during products
``scaled_dot_product_attention`` is held to its composite "math" kernel, since the fused kernels
have neither a second derivative nor a forward-mode rule. :func:`measure_probe_batch` sizes a
block of vectors from the measured memory of one- and two-vector products.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from curvcal.errors import InputError
from curvcal.rows import Inputs

# probe_batch="auto": the share of free CUDA memory the probes of one pass may use, and the
# largest block chosen (beyond it a pass gains nothing measurable).
_AUTO_PROBE_FRACTION = 0.5
_MAX_AUTO_PROBE_BATCH = 64

BatchLoss = Callable[[Tensor, Tensor], Tensor]
"""Σ over a batch of the per-sample loss, from (logits, labels)."""
BatchProduct = Callable[[Inputs, Tensor, tuple[Tensor, ...]], tuple[Tensor, ...]]
"""(x, y, tangents) -> the batch's products, in the layout of the tangents."""


def is_torchscript(model: nn.Module) -> bool:
    """True for a TorchScript module, which torch.func cannot trace."""
    return isinstance(model, torch.jit.ScriptModule)


def stochastic_layers(model: nn.Module) -> list[str]:
    """Names of modules whose forward is random in training mode (dropout of any kind)."""
    found = []
    for name, module in model.named_modules():
        kind = getattr(module, "original_name", type(module).__name__)
        if isinstance(module, nn.modules.dropout._DropoutNd) or "Dropout" in str(kind):
            found.append(name or "<root>")
    return found


def engine_for(requested: str, func_usable: bool, width: int, device: torch.device) -> str:
    """The engine a product of ``width`` vectors on ``device`` runs on, for the ``requested``
    one: ``auto`` takes ``func`` only for blocks on CUDA (see the module docstring)."""
    if requested == "func":
        return "func"
    if requested == "auto" and func_usable and width > 1 and device.type == "cuda":
        return "func"
    return "autograd"


@contextmanager
def prepared_model(model: nn.Module, mode: str, allow_tf32: bool) -> Iterator[None]:
    """``model`` in ``mode`` (``eval``/``train``) with TF32 as allowed and attention through the
    differentiable-twice math kernel; its modes, the flags and (in train mode, where a forward
    updates them) its buffers are restored afterwards."""
    flags = [(module, module.training) for module in model.modules()]
    # Buffers change only in train mode (BatchNorm's running statistics and batch count); an
    # eval-mode forward reads them, so cloning them there would copy every buffer per pass for
    # nothing.
    saved = (
        [(buffer, buffer.detach().clone()) for buffer in model.buffers()] if mode == "train" else []
    )
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        model.train(mode == "train")
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
        # fused attention kernels have no second derivative: use the composite one
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        for module, flag in flags:
            module.training = flag
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def measure_probe_batch(
    product: BatchProduct,
    batch: tuple[Inputs, Tensor],
    params: Sequence[Tensor],
    device: torch.device,
    is_out_of_memory: Callable[[BaseException], bool],
) -> int:
    """Vectors per pass that fit in half the free CUDA memory: from the peak memory of a one- and
    a two-vector ``product`` on ``batch`` (run inside the caller's :func:`prepared_model`),
    at most 64; 1 when even those run out of memory."""
    x, y = batch
    peaks = []
    try:
        for m in (1, 2):
            tangents = tuple(
                torch.zeros((m, *p.shape), dtype=p.dtype, device=p.device) for p in params
            )
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            product(x, y, tangents)
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) - before)
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        torch.cuda.empty_cache()
        return 1
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    per_probe = max(peaks[1] - peaks[0], 1)
    budget = free * _AUTO_PROBE_FRACTION - peaks[0]
    return int(min(_MAX_AUTO_PROBE_BATCH, max(1, budget // per_probe + 1)))


def double_backward_hvp(
    loss: Tensor,
    params: Sequence[Tensor],
    tangents: Sequence[Tensor],
    *,
    create_graph: bool = False,
) -> tuple[Tensor, ...]:
    """H·v_j for m vectors at once, by double backward, H = ∇²_θ ``loss``.

    ``tangents[i]`` has shape ``(m, *params[i].shape)``: the i-th parameter's piece of every
    vector. Returns the same layout. The gradient ∇_θ loss is formed once with
    ``create_graph=True`` and each product is the vector-Jacobian product J_g(θ)ᵀ v_j (= H·v_j,
    H being symmetric) against that graph; with
    ``create_graph=True`` the products stay differentiable in θ. Parameters the gradient does not
    depend on get zero products.
    """
    if loss.ndim != 0:
        raise InputError("loss", f"must be a scalar tensor, got shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        raise InputError("loss", "does not depend on the parameters (no autograd graph)")
    if len(tangents) != len(params):
        raise InputError("tangents", f"{len(tangents)} pieces for {len(params)} parameters")
    m = int(tangents[0].shape[0]) if tangents else 0
    for tangent, p in zip(tangents, params, strict=True):
        if tuple(tangent.shape) != (m, *p.shape):
            raise InputError(
                "tangents", f"expected shape {(m, *p.shape)}, got {tuple(tangent.shape)}"
            )
    with torch.enable_grad():
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        # H·v_j = J_g(θ)ᵀ v_j (H is symmetric): the vector-Jacobian product of the gradient with
        # v_j as its grad_outputs, which spares building and differentiating the dot g·v_j
        live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        live_grads = [grads[i] for i in live]
        outputs: list[list[Tensor]] = []
        for j in range(m):
            if not live:  # the gradient does not depend on these parameters
                outputs.append([torch.zeros_like(p) for p in params])
                continue
            second = torch.autograd.grad(
                live_grads,
                params,
                grad_outputs=[tangents[i][j] for i in live],
                retain_graph=create_graph or j < m - 1,
                create_graph=create_graph,
                allow_unused=True,
            )
            outputs.append(
                [
                    torch.zeros_like(p) if h is None else h
                    for h, p in zip(second, params, strict=True)
                ]
            )
    if m == 1:  # a view, not a copy (stacking copies the whole product)
        return tuple(h.unsqueeze(0) for h in outputs[0])
    return tuple(torch.stack([row[i] for row in outputs]) for i in range(len(params)))


def autograd_hvp(
    model: nn.Module,
    loss: BatchLoss,
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
    tangents: tuple[Tensor, ...],
) -> tuple[Tensor, ...]:
    """The ``autograd`` engine: H_B·v_j of the batch loss ``loss(model(x), y)`` by
    :func:`double_backward_hvp`."""
    with torch.enable_grad():
        return double_backward_hvp(loss(model(x), y), params, tangents)


def func_hvp(
    model: nn.Module,
    loss: BatchLoss,
    names: Sequence[str],
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
    tangents: tuple[Tensor, ...],
) -> tuple[Tensor, ...]:
    """The ``func`` engine: H_B·v_j of ``loss(model(x), y)`` with respect to the parameters
    ``names`` (``params`` their tensors; the others fixed), by jvp of grad, vmapped over j."""
    frozen = {name: p.detach() for name, p in model.named_parameters()}
    primals = tuple(p.detach() for p in params)
    selected_names = tuple(names)

    def batch_loss(selected: tuple[Tensor, ...]) -> Tensor:
        values = {**frozen, **dict(zip(selected_names, selected, strict=True))}
        return loss(torch.func.functional_call(model, values, (x,)), y)

    gradient = torch.func.grad(batch_loss)

    def hvp(tangent: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return torch.func.jvp(gradient, (primals,), (tangent,))[1]

    if tangents[0].shape[0] == 1:  # one vector: skip vmap's overhead
        return tuple(h.unsqueeze(0) for h in hvp(tuple(t[0] for t in tangents)))
    return torch.func.vmap(hvp)(tangents)


def engines_between(products: Mapping[str, int], before: Mapping[str, int]) -> str:
    """The engines that multiplied vectors since ``before`` (a copy of an operator's
    ``engine_products``, the vectors per engine), joined by ``+`` in name order; empty when none
    did."""
    return "+".join(sorted(e for e, n in products.items() if n > before.get(e, 0)))


LogitProduct = Callable[[Tensor, Tensor, Tensor], Tensor]
"""(logits (B, K), labels (B,), w (B, K)) -> M_n w_n for every row n: a curvature's matrix in
the logits applied to one tangent of the logits per row."""


def gauss_newton_product(
    model: nn.Module,
    logit_product: LogitProduct,
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
    tangents: tuple[Tensor, ...],
) -> tuple[Tensor, ...]:
    """Σ_{n∈B} J_nᵀ M_n J_n v_j for m vectors, J_n = ∂z_n/∂θ the Jacobian of the logits z_n of
    row n and M_n the (K × K) matrix ``logit_product`` applies (the loss Hessian in the logits
    for the GGN, the Fisher of the predictive distribution, ∇ℓ_n∇ℓ_nᵀ for the empirical Fisher).

    J v_j by the double-vjp trick: with a dummy cotangent u, the vjp g(u) = Jᵀu is linear in u,
    so differentiating ⟨g(u), v_j⟩ in u gives J v_j (no forward-mode rule needed, TorchScript
    runs too); then M_n (J v_j)_n in closed form, O(B·K) — no (B, K, K) tensor is formed —, then
    one vjp Jᵀ(·). The forward and the first vjp are shared by the m vectors. Parameters the
    logits do not depend on get zero products. Same layout as :func:`double_backward_hvp`.
    """
    m = int(tangents[0].shape[0])
    with torch.enable_grad():
        logits = model(x)
        dummy = torch.zeros_like(logits, requires_grad=True)
        grads = torch.autograd.grad(
            logits, params, grad_outputs=dummy, create_graph=True, allow_unused=True
        )
        live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        detached = logits.detach()
        outputs: list[tuple[Tensor, ...]] = []
        for j in range(m):
            if not live:
                outputs.append(tuple(torch.zeros_like(p) for p in params))
                continue
            (jv,) = torch.autograd.grad(
                [grads[i] for i in live],
                dummy,
                grad_outputs=[tangents[i][j] for i in live],
                retain_graph=True,
            )
            cotangent = logit_product(detached, y, jv)
            back = torch.autograd.grad(
                logits, params, grad_outputs=cotangent, retain_graph=j < m - 1, allow_unused=True
            )
            outputs.append(
                tuple(
                    torch.zeros_like(p) if h is None else h
                    for h, p in zip(back, params, strict=True)
                )
            )
    if m == 1:
        return tuple(h.unsqueeze(0) for h in outputs[0])
    return tuple(torch.stack([row[i] for row in outputs]) for i in range(len(params)))
