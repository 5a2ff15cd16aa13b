"""A differentiable Hutchinson estimate of tr(H), for training with a curvature penalty.

Kimura & Naganuma (2024) train with CE + λ·tr(H), where H = ∇²_θ L(θ) is the Hessian of the
training loss of the current batch. Hutchinson's estimator (Hutchinson 1989) with Rademacher
probes v_j ∈ {−1, +1}^P is unbiased,

    tr(H) ≈ (1/m) Σ_{j=1..m} v_jᵀ H v_j,     E[v vᵀ] = I,

and every term is differentiable in θ when H·v is formed by double backward with
``create_graph=True``: g = ∇_θ L (kept in the graph), H·v = ∇_θ (g·v) (kept in the graph too),
so ∇_θ (vᵀHv) = ∇_θ Σ_i v_i (Hv)_i involves third derivatives that autograd takes care of.

:func:`~curvcal.curvature.engines.double_backward_hvp` is the product itself (several vectors
against one kept graph, the same kernel the Hessian operator's ``autograd`` engine runs);
:func:`hutchinson_trace_penalty` draws the probes and averages the quadratic forms. Pure: no
global RNG (probes come from the caller's ``torch.Generator``), nothing written to ``.grad``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from curvcal.curvature.engines import double_backward_hvp
from curvcal.curvature.trace import draw_probes
from curvcal.errors import InputError


def hutchinson_trace_penalty(
    model: nn.Module,
    loss: Tensor,
    probes: int | Tensor,
    *,
    generator: torch.Generator | None = None,
    params: Sequence[Tensor] | None = None,
) -> Tensor:
    """(1/m) Σ_j v_jᵀ H v_j, a differentiable Hutchinson estimate of tr(∇²_θ ``loss``).

    ``loss`` is a scalar computed from ``model`` with autograd on (e.g. the batch's mean
    cross-entropy). ``probes`` is the number m ≥ 1 of Rademacher probes, drawn from
    ``generator`` (required then: curvcal never uses the global RNG), or the probe vectors
    themselves as a (P, m) tensor. θ is ``params`` or every parameter of ``model`` with
    ``requires_grad`` (P elements, in ``named_parameters()`` order). Returns a 0-dim tensor in
    the loss's dtype whose graph reaches θ, so ``(loss + lam * penalty).backward()`` trains on
    the penalty. Neither the model's mode nor any ``.grad`` is touched.
    """
    from curvcal.curvature.options import check_model

    check_model(model)
    chosen = (
        tuple(params)
        if params is not None
        else tuple(p for p in model.parameters() if p.requires_grad)
    )
    if not chosen:
        raise InputError("params", "no parameter requires a gradient")
    n_params = sum(p.numel() for p in chosen)
    if isinstance(probes, Tensor):
        if probes.ndim != 2 or probes.shape[0] != n_params or probes.shape[1] < 1:
            raise InputError(
                "probes", f"expected a ({n_params}, m) tensor with m ≥ 1, got {tuple(probes.shape)}"
            )
        vectors = probes
    else:
        if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
            raise InputError("probes", f"must be a whole number ≥ 1, got {probes!r}")
        if generator is None:
            raise InputError(
                "generator", "drawing probes needs a torch.Generator", "pass generator=..."
            )
        vectors = draw_probes(n_params, probes, "rademacher", generator)
    vectors = vectors.to(device=chosen[0].device, dtype=chosen[0].dtype)
    m = int(vectors.shape[1])
    tangents = tuple(
        piece.reshape(m, *p.shape)
        for piece, p in zip(
            vectors.t().split([p.numel() for p in chosen], dim=1), chosen, strict=True
        )
    )
    products = double_backward_hvp(loss, chosen, tangents, create_graph=True)
    quadratic = sum(
        ((t * h).reshape(m, -1).sum(dim=1) for t, h in zip(tangents, products, strict=True)),
        start=loss.new_zeros((m,)),
    )
    return quadratic.mean()
