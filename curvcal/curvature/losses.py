"""Per-sample classification losses whose Hessian curvcal measures.

Both return the *sum* over the batch; :class:`~curvcal.curvature.hvp.HessianOperator` divides by
the dataset size N, so the operator is the Hessian of the mean over the whole dataset.

This module is private to the curvature engine; the public focal loss of the calibration
package computes the same quantity.
"""

from __future__ import annotations

import torch
from torch import Tensor


def cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """Σ_i −log softmax(z_i)[y_i]  (natural log, summed over the batch)."""
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def focal_loss_sum(logits: Tensor, labels: Tensor, gamma: float) -> Tensor:
    """Σ_i −(1 − p_{i,y_i})^γ · log p_{i,y_i}, with p = softmax(z)  (Lin et al. 2017).

    γ = 0 is cross-entropy. 1 − p is computed as −expm1(log p) so that it stays accurate when
    p is close to 1.
    """
    log_p = torch.log_softmax(logits, dim=-1).gather(-1, labels.reshape(-1, 1)).reshape(-1)
    if gamma == 0.0:
        return -log_p.sum()
    one_minus_p = -torch.expm1(log_p)
    return -(one_minus_p.clamp_min(0.0).pow(gamma) * log_p).sum()
