"""Applying a fitted calibration map: temperature scaling and focal temperature scaling.

For log-probabilities log p (from logits or probabilities) the calibrated log-probabilities are

    log softmax(s · log p)              temperature scaling, s = 1/T
    log φ_γ(softmax(s · log p))         focal temperature scaling (φ_γ: :mod:`.focal`)

(softmax(s · log p) = softmax(z/T) for logits z, since log p = z − logsumexp(z)). Evaluated in
float64, in row chunks that bound memory. The fitting lives in :mod:`.scaling`; this module is
what a stored :class:`~curvcal.calibration.results.Calibrator` needs to be applied again.
"""

from __future__ import annotations

from typing import Any

import torch

from curvcal.calibration.focal import focal_calibration_map
from curvcal.calibration.inputs import chunk_rows, log_probabilities


def calibrated(logp: torch.Tensor, s: float, gamma: float) -> torch.Tensor:
    """log softmax(s · ``logp``), then the focal map φ_γ when γ ≠ 0."""
    scaled = torch.log_softmax(s * logp, dim=1)
    return focal_calibration_map(scaled, gamma) if gamma else scaled


def calibrated_log_probabilities(
    scores: Any,
    kind: str,
    source: str,
    temperature: float,
    gamma: float,
    identity: bool = False,
    *,
    device: torch.device | None = None,
) -> torch.Tensor:
    """float64 log-probabilities of N×K ``scores`` (``kind`` ``logits`` or ``probs``, named
    ``source`` in errors) after temperature ``temperature`` and focal γ ``gamma``; unchanged
    when ``identity``. ``device``: where they are computed and returned (default: the CPU)."""
    logp = log_probabilities(scores, kind, source, device=device)
    if identity:
        return logp
    out = torch.empty_like(logp)
    step = chunk_rows(logp.shape[1], logp.device)
    for start in range(0, logp.shape[0], step):
        out[start : start + step] = calibrated(logp[start : start + step], 1.0 / temperature, gamma)
    return out
