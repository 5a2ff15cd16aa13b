"""FLSD-53's curvature: the sizes of its two γ groups.

FLSD-53 (Mukhoti et al. 2020) is the focal loss −(1 − p_y)^γ_i log p_y with a per-sample
γ_i = 5 where p_y < 0.2 and 3 otherwise (p = softmax of the logits at the current θ). γ_i is
piecewise constant in θ, so away from the switching set {p_y = 0.2} (measure zero) its Hessian
is that of the focal loss with every γ_i held fixed — the Hessian of the loss object
:class:`curvcal.losses.FLSD53Loss`, whose γ_i come from the detached logits. It is an ordinary
:class:`~curvcal.curvature.operator.HessianOperator`; :func:`flsd53_group_sizes` says how many
samples fall in each γ group.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from curvcal import rows
from curvcal.curvature.batches import Batch, BatchSource
from curvcal.curvature.engines import prepared_model
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.losses import FLSD53_GAMMAS, FLSD53_THRESHOLD, flsd53_gammas
from curvcal.settings.hessian import MODES


def _group_counts(logits: Tensor, labels: Tensor) -> Tensor:
    """How many samples of the batch have each of :data:`FLSD53_GAMMAS`, p_y as the loss has it."""
    log_p_y = torch.log_softmax(logits, dim=1).gather(1, labels[:, None].to(torch.int64))[:, 0]
    gammas = flsd53_gammas(torch.exp(log_p_y))
    return torch.stack([(gammas == gamma).sum() for gamma in FLSD53_GAMMAS])


def flsd53_group_sizes(
    operator: HessianOperator,
) -> tuple[tuple[float, int], ...]:
    """``(γ, N_γ)`` for the non-empty FLSD-53 groups of ``operator``'s data (γ = 5 where
    p_y < 0.2, then γ = 3), p from the model in the operator's mode; one pass, no grad."""
    counts = operator.sum_outputs(_group_counts)
    return tuple(
        (gamma, round(float(n))) for gamma, n in zip(FLSD53_GAMMAS, counts, strict=True) if n > 0
    )


def flsd53_groups(
    model: nn.Module, batches: BatchSource, mode: str = "eval"
) -> tuple[list[Batch], list[Batch]]:
    """The samples with p_y < 0.2 (γ = 5) and the rest (γ = 3), as lists of (x, y) batches.

    ``model`` runs in ``mode`` (``eval`` or ``train``); its modes and buffers are restored.
    """
    if mode not in MODES:
        raise InputError("mode", f"unknown mode {mode!r}", "choose 'eval' or 'train'")
    source: Iterable[Batch] = batches() if callable(batches) else batches
    param = next(model.parameters())
    low: list[Batch] = []
    high: list[Batch] = []
    with prepared_model(model, mode, allow_tf32=False), torch.no_grad():
        for x, y in source:
            inputs = rows.to_device(x, param.device, param.dtype)
            log_p = torch.log_softmax(model(inputs), dim=1)
            p_y = log_p.gather(1, y.to(param.device, torch.int64)[:, None])[:, 0].exp()
            switched = (p_y < FLSD53_THRESHOLD).cpu()
            if bool(switched.any()):
                low.append((rows.take_rows(x, switched), y[switched]))
            if bool((~switched).any()):
                high.append((rows.take_rows(x, ~switched), y[~switched]))
    return low, high
