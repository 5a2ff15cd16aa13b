"""The focal calibration map (Komisarenko & Kull 2024; Charoenphakdee et al. 2021).

Per-class focal loss -(1 - q)^γ log q has negated derivative

    g_γ(q) = (1 - q)^γ / q - γ (1 - q)^(γ-1) log q   (> 0 on (0, 1)),

and the focal calibration map is φ_γ(q)_k = [1/g_γ(q_k)] / Σ_j [1/g_γ(q_j)]: it turns the
minimiser p* of the expected focal loss Σ_k q_k·(-(1 - p_k)^γ log p_k) back into q. γ = 0 is
the identity. It is computed in log space, which never produces NaN on saturated rows:

    log(1/g_γ(q)) = log q - (γ - 1)·log(1 - q) - log((1 - q) + γ·q·(-log q)),

with log q from log_softmax, log(1 - q) and -log q of the top class from its log-odds ℓ
(log(1 - q) = -softplus(ℓ), -log q = softplus(-ℓ)), log1p(-q) for the other classes (q <= 1/2),
the denominator by logaddexp, and a final log-softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The loss itself lives with the other losses; re-exported here, where it was first public.
from curvcal.losses import FLSD53, check_gamma, focal_loss

__all__ = ["FLSD53", "check_gamma", "focal_calibration_map", "focal_loss", "inverse_g_log"]


def inverse_g_log(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """log(1/g_γ(q)) elementwise for rows of log-probabilities ``logp`` (N×K, float64)."""
    top, top_index = logp.max(dim=1, keepdim=True)
    others = logp.scatter(1, top_index, float("-inf"))
    log_rest = torch.logsumexp(others, dim=1, keepdim=True)  # log Σ_{j≠top} q_j
    log_odds = top - log_rest
    # Only a top class with q > 1/2 needs the log-odds route; below that log1p(-q) is accurate,
    # and using one formula for every class keeps tied classes exactly tied.
    dominant = log_odds > 0
    log_q = logp.clone()
    log_q.scatter_(1, top_index, torch.where(dominant, -F.softplus(-log_odds), top))
    log_1mq = torch.log1p(-torch.exp(logp))
    top_1mq = log_1mq.gather(1, top_index)
    log_1mq.scatter_(1, top_index, torch.where(dominant, -F.softplus(log_odds), top_1mq))
    neg_log_q = -log_q
    if gamma == 0:
        return log_q
    # γ·q·(-log q) in log space; it is 0 when q = 0 or q = 1.
    vanishing = (log_q == float("-inf")) | (neg_log_q == 0)
    safe_neg = torch.where(vanishing, torch.ones_like(neg_log_q), neg_log_q)
    safe_log_q = torch.where(vanishing, torch.zeros_like(log_q), log_q)
    log_term = torch.where(
        vanishing,
        torch.full_like(log_q, float("-inf")),
        torch.log(torch.tensor(gamma, dtype=logp.dtype)) + safe_log_q + torch.log(safe_neg),
    )
    log_denominator = torch.logaddexp(log_1mq, log_term)
    return log_q - (gamma - 1) * log_1mq - log_denominator


def focal_calibration_map(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """log φ_γ(q) for rows of log-probabilities (N×K); returns float64 log-probabilities.

    Rows that are exactly one-hot (q_top = 1) are fixed points and returned unchanged.
    """
    gamma = check_gamma(gamma)
    logp = logp.to(torch.float64)
    if gamma == 0 or logp.shape[1] == 1:
        return logp.clone()
    raw = inverse_g_log(logp, gamma)
    one_hot_row = (logp.max(dim=1).values == 0) & (
        torch.logsumexp(logp.scatter(1, logp.argmax(dim=1, keepdim=True), float("-inf")), dim=1)
        == float("-inf")
    )
    mapped = torch.log_softmax(torch.where(one_hot_row[:, None], logp, raw), dim=1)
    return torch.where(one_hot_row[:, None], logp, mapped)
