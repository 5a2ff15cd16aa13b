"""Per-sample classification losses whose Hessian curvcal measures.

Both return the *sum* over the batch; :class:`~curvcal.curvature.hvp.HessianOperator` divides by
the dataset size N, so the operator is the Hessian of the mean over the whole dataset. The focal
loss is the public one of :mod:`curvcal.calibration.focal` (one formula in one place).
"""

from __future__ import annotations

import torch
from torch import Tensor

from curvcal.calibration.focal import focal_loss


def cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """Σ_i −log softmax(z_i)[y_i]  (natural log, summed over the batch)."""
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def focal_loss_sum(logits: Tensor, labels: Tensor, gamma: float) -> Tensor:
    """Σ_i −(1 − p_{i,y_i})^γ · log p_{i,y_i}, with p = softmax(z)  (Lin et al. 2017); γ = 0 is
    cross-entropy."""
    if gamma == 0.0:
        return cross_entropy_sum(logits, labels)
    return focal_loss(logits, labels, gamma, reduction="sum")
