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


def _power_in_place(base: torch.Tensor, exponent: float) -> torch.Tensor:
    """base**exponent for base = 1 - q in [1/2, 1], overwriting ``base``.

    Quarter-integer exponents up to 8 in magnitude (those of the default γ grid) go through
    sqrt and products, several times faster than ``pow`` (an exp and a log per element),
    which serves every other exponent.
    """
    quarters = 4 * exponent
    if quarters != int(quarters) or abs(exponent) > 8:
        return base.log_().mul_(exponent).exp_()
    whole, part = divmod(abs(int(quarters)), 4)
    result = None
    if whole:
        result = base.clone()
        for _ in range(whole - 1):
            result.mul_(base)
    if part:
        root = base.sqrt_()  # x^(1/2)
        if part != 2:
            root.sqrt_()  # x^(1/4)
            if part == 3:
                root.mul_(root.square())  # x^(3/4)
        result = root if result is None else result.mul_(root)
    if result is None:
        result = base.fill_(1.0)
    return result.reciprocal_() if exponent < 0 else result


def focal_top_confidence(
    masked: torch.Tensor,
    s: float,
    gamma: float,
    work: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """max_k φ_γ(softmax(s·z))_k for rows of masked, row-shifted log-probabilities.

    ``masked`` holds z - max_k z (any real dtype) with the top entry of every row replaced by
    a large negative floor, so w_j = exp(s·z_j) is 0 there and the rest r = Σ_{j≠top} w_j
    is summed without cancellation. With S = 1 + r, q_top = 1/S, q_j = w_j/S and
    1/g_γ(q) = q (1-q)^(1-γ) / ((1-q) + γ q (-log q)) (see the module docstring),

        φ_top = 1 / (1 + R),   R = A · (r + γ·log S) · (S / r)^(1-γ),   A = Σ_{j≠top} 1/g_γ(q_j),

    where (r/S)^(1-γ)/(r + γ log S) is 1/g_γ(q_top) written with 1 - q_top = r/S and
    -log q_top = log S = log1p(r), exact for confident rows. Rows with r = 0 (one-hot) are
    fixed points: confidence 1. Only the K-wide work is per element (one exp, a few products,
    one division); nothing N×K is kept. ``work`` are three scratch tensors of at least the
    shape of ``masked`` (reused across calls to avoid allocations). Returns the confidences
    in the dtype of ``masked``.
    """
    if work is None:
        work = (torch.empty_like(masked), torch.empty_like(masked), torch.empty_like(masked))
    first, second, third = (buffer[: masked.shape[0]] for buffer in work)
    scaled = torch.mul(masked, s, out=first)
    weight = torch.exp(scaled, out=second)
    rest = weight.sum(dim=1)
    if gamma == 0:
        return torch.reciprocal(rest + 1)
    log_total = torch.log1p(rest)
    q = weight.mul_(torch.reciprocal(rest + 1)[:, None])
    neg_log_q = torch.sub(log_total[:, None], scaled, out=first)  # -log q_j = log S - s·z_j
    complement = torch.mul(q, -1.0, out=third).add_(1.0)  # 1 - q
    ratio = neg_log_q.mul_(q).mul_(gamma).add_(complement)  # (1-q) + γ q (-log q)
    if gamma != 1:
        ratio.mul_(_power_in_place(complement, gamma - 1))
    inverse_g = q.div_(ratio)  # 1/g_γ(q_j); 0 at the masked top entry
    total = inverse_g.sum(dim=1)
    log_ratio = (
        torch.log(total)
        + torch.log(rest + gamma * log_total)
        + (1 - gamma) * (log_total - torch.log(rest))
    )
    confidence = torch.reciprocal(torch.exp(log_ratio).add_(1))
    return torch.where(rest > 0, confidence, torch.ones_like(confidence))
