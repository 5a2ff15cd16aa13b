"""Binning of confidences: equal-width (with an explicit edge convention) and equal-mass.

Equal-width, M bins, ``edges="left"`` (curvcal's default): bins (k/M, (k+1)/M], index
``clip(ceil(fl(c·M)) - 1, 0, M - 1)``: an edge value goes to the LOWER bin, c = 0 to bin 0,
c = 1 to the last bin (no hidden extra bin). ``edges="right"``: bins [k/M, (k+1)/M), index
``clip(floor(fl(c·M)), 0, M - 1)``: torchmetrics' and netcal's edge side, but c = 1 stays in the
last bin, where torchmetrics gives it an extra (M+1)-th bin of its own (so its ECE, MCE and
RMS-CE differ once a confidence reaches 1: 0.4667 against curvcal's 0.200 for the
``references.md`` case P = [[.9,.1,0],[1,0,0],[0,.3,.7]], y = [0,1,2], M = 2).

Equal-mass (AdaECE): the confidences sorted ascending are cut at positions round(i·N/M),
i = 1..M-1 (round half up); each cut moves forward to the end of its tie group so equal
confidences never straddle two bins; empty bins are dropped. A tie group is a run of sorted
confidences equal up to float64 rounding (:mod:`curvcal.calibration.ties`: neighbours at most
16·2⁻⁵³ apart, relative), so confidences that are equal in exact arithmetic but differ in their
last bits are not split by rounding noise. With sample weights (a bootstrap
resample given as multiplicities) the positions are counted in the weighted, expanded order.
"""

from __future__ import annotations

import torch

from curvcal.calibration.ties import group_sizes


def equal_width_index(values: torch.Tensor, n_bins: int, edges: str = "left") -> torch.Tensor:
    """Bin index in [0, n_bins) of each value in [0, 1] (any shape), int64."""
    scaled = values.to(torch.float64) * n_bins
    index = torch.ceil(scaled) - 1 if edges == "left" else torch.floor(scaled)
    return index.clamp_(0, n_bins - 1).to(torch.int64)


def equal_width_edges(n_bins: int) -> torch.Tensor:
    """The M + 1 edges 0, 1/M, ..., 1 in float64."""
    return torch.arange(n_bins + 1, dtype=torch.float64) / n_bins


def bin_sums(
    index: torch.Tensor,
    confidence: torch.Tensor,
    correct: torch.Tensor,
    n_bins: int,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-bin (count, Σ confidence, Σ correct), float64, optionally weighted, by bincount."""
    w = torch.ones_like(confidence, dtype=torch.float64) if weights is None else weights
    count = torch.bincount(index, weights=w, minlength=n_bins)
    sum_conf = torch.bincount(index, weights=w * confidence, minlength=n_bins)
    sum_correct = torch.bincount(index, weights=w * correct, minlength=n_bins)
    return count, sum_conf, sum_correct


def equal_mass_index(
    values: torch.Tensor,
    n_bins: int,
    weights: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Equal-mass bin index of each value (1-D), int64; indices may skip dropped empty bins.

    ``order`` (an ascending ``argsort`` of ``values``) may be passed to avoid sorting again;
    the result depends only on the multiset of values, never on their order. Tie groups are
    those of :func:`curvcal.calibration.ties.group_starts` (equal up to float64 rounding).
    """
    n = values.shape[0]
    if order is None:
        order = torch.argsort(values, stable=True)
    ranked = values[order]
    group_size = group_sizes(ranked)
    # one past the last index of each sample's tie group
    group_end = torch.repeat_interleave(torch.cumsum(group_size, 0), group_size)
    w = torch.ones(n, dtype=torch.float64) if weights is None else weights.to(torch.float64)[order]
    cumulative = torch.cumsum(w, 0)
    total = float(cumulative[-1]) if n else 0.0
    targets = torch.floor(torch.arange(1, n_bins, dtype=torch.float64) * total / n_bins + 0.5)
    # The sample just before a cut at expanded position p is the first one whose cumulative
    # weight reaches p; the cut then moves to the end of that sample's tie group.
    last_before = torch.searchsorted(cumulative, targets, side="left").clamp(max=max(n - 1, 0))
    cuts = torch.where(targets > 0, group_end[last_before], torch.zeros_like(last_before))
    cuts = torch.cummax(cuts, 0).values if cuts.numel() else cuts
    ranked_bin = torch.searchsorted(cuts, torch.arange(n), side="right")
    index = torch.empty(n, dtype=torch.int64)
    index[order] = ranked_bin
    return index
