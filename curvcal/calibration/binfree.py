"""Binning-free calibration errors of top-label confidences: KS, Kuiper and MMCE.

Every function takes the confidences c_i = max_k p_k and the correctness y_i = 1[prediction =
label] as tensors of length N (N ≥ 1; computed in float64), and returns a float in [0, 1].

- KS calibration error (Gupta et al. 2021, "Calibration of neural networks using splines",
  ICLR): sort the samples by confidence, ascending; S_j = (1/N) Σ_{i ≤ j} (c_i - y_i) is the
  gap between the cumulative confidence and the cumulative accuracy; KS = max_j |S_j|.
- Kuiper statistic (same paper): max(0, max_j S_j) - min(0, min_j S_j) (S_0 = 0 included).
- Ties: S is evaluated only after a whole group of equal confidences (the cumulative sums of
  the empirical distribution at each distinct confidence), so neither value depends on the
  order of the samples. Equal means equal up to float64 rounding (the tie groups of
  :mod:`curvcal.calibration.ties`: sorted neighbours at most 16·2⁻⁵³ apart, relative), so
  confidences equal in exact arithmetic are not split by their last bits. The paper's code takes every position of an argsort, whose values
  inside a tie group depend on that order; without ties the two agree.
- MMCE (Kumar, Sarawagi & Jain 2018, "Trainable calibration measures for neural networks from
  kernel mean embeddings", ICML): with the Laplacian kernel k(r, r') = exp(-|r - r'|/0.4) on
  confidences, MMCE² = (1/N²) Σ_i Σ_j (y_i - c_i)(y_j - c_j) k(c_i, c_j), unweighted (the
  paper's metric, not its weighted training loss). The root form MMCE = sqrt(max(0, MMCE²))
  is reported (the kernel is positive definite; the clip only removes rounding).

The MMCE double sum is exact in O(N log N) time and O(N) memory, not O(N²): after sorting,
exp(-|c_i - c_j|/w) = exp(-c_i/w)·exp(c_j/w) for c_j ≤ c_i, so the sum over j splits into a
prefix sum of a_j exp(c_j/w) and a suffix sum of a_j exp(-c_j/w) (a_j = y_j - c_j). As c lies in
[0, 1], every factor lies in [exp(-2.5), exp(2.5)]: nothing overflows. Memory: seven float64
vectors of length N (11 MiB at N = 200 000).
"""

from __future__ import annotations

import math

import torch

from curvcal.calibration.ties import group_starts

#: Width w of MMCE's Laplacian kernel exp(-|r - r'|/w) (Kumar et al. 2018).
MMCE_WIDTH = 0.4


def _ascending(confidence: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return torch.argsort(confidence, stable=True) if order is None else order


def cumulative_gaps(
    confidence: torch.Tensor, correct: torch.Tensor, order: torch.Tensor | None = None
) -> torch.Tensor:
    """S at the end of every tie group of confidences (equal up to float64 rounding,
    :mod:`curvcal.calibration.ties`), ascending, with S_0 = 0 first.

    ``order`` is an ascending argsort of ``confidence`` when the caller has one.
    """
    confidence, correct = confidence.to(torch.float64), correct.to(torch.float64)
    order = _ascending(confidence, order)
    sorted_confidence = confidence[order]
    n = confidence.shape[0]
    partial = torch.cumsum(sorted_confidence - correct[order], dim=0) / n
    last = torch.ones(n, dtype=torch.bool)
    last[:-1] = group_starts(sorted_confidence)[1:]
    return torch.cat((partial.new_zeros(1), partial[last]))


def ks_calibration_error(
    confidence: torch.Tensor, correct: torch.Tensor, order: torch.Tensor | None = None
) -> float:
    """KS calibration error max_j |S_j| (see the module docstring for S and ties)."""
    return float(cumulative_gaps(confidence, correct, order).abs().max())


def kuiper_statistic(
    confidence: torch.Tensor, correct: torch.Tensor, order: torch.Tensor | None = None
) -> float:
    """Kuiper statistic max_j S_j - min_j S_j over j = 0..N (S_0 = 0)."""
    gaps = cumulative_gaps(confidence, correct, order)
    return float(gaps.max() - gaps.min())


def mmce(
    confidence: torch.Tensor,
    correct: torch.Tensor,
    order: torch.Tensor | None = None,
    width: float = MMCE_WIDTH,
) -> float:
    """MMCE (root form) with the Laplacian kernel of ``width``, exactly, in O(N) memory."""
    confidence, correct = confidence.to(torch.float64), correct.to(torch.float64)
    order = _ascending(confidence, order)
    c = confidence[order]
    a = correct[order] - c
    up, down = torch.exp(c / width), torch.exp(-c / width)
    below = torch.cumsum(a * up, dim=0)  # Σ_{j ≤ i} a_j exp(c_j/w)
    weighted_down = a * down
    above = weighted_down.sum() - torch.cumsum(weighted_down, dim=0)  # Σ_{j > i}
    total = float((a * (down * below + up * above)).sum())
    n = confidence.shape[0]
    return math.sqrt(max(0.0, total) / (n * n))
