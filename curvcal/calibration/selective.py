"""Selective prediction: the risk–coverage curve and its area (AURC, E-AURC).

Geifman, Uziel & El-Yaniv 2019, "Bias-reduced uncertainty estimation for deep neural
classifiers" (ICLR). Keep the k most confident of N predictions (coverage k/N) and measure the
selective risk, the error rate among them:

    risk_k = (1/k) Σ_{i ≤ k} e_(i),   e = 1 - correct, samples sorted by confidence, descending;
    AURC = (1/N) Σ_{k=1}^{N} risk_k   (the mean over the N coverages k/N);
    E-AURC = AURC - AURC*,  AURC* = (1/N) Σ_k max(0, k - (N - E))/k,

where E is the number of errors and AURC* the area of an oracle that ranks every correct
prediction first. Ties: within a group of equal confidences (equal up to float64 rounding: the
tie groups of :mod:`curvcal.calibration.ties`, sorted neighbours at most 16·2⁻⁵³ apart,
relative) the errors are spread evenly
(the expectation over every order of the group), so risk_k and the areas never depend on the
order of the samples: risk_k = (E_< + (k - n_<)·e_g/n_g)/k for k inside a group of n_g samples
holding e_g errors, with n_< samples and E_< errors more confident than the group. Without ties
this is the plain formula. All in float64, O(N) memory after one sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from curvcal.calibration.ties import group_sizes

#: A calibration result records the selective risk at coverages j/SUMMARY_STEPS, j = 1..
SUMMARY_STEPS = 10


@dataclass(frozen=True)
class RiskCoverage:
    """The risk–coverage curve: ``coverage[k-1] = k/N`` and ``risk[k-1] = risk_k`` (float64)."""

    coverage: torch.Tensor
    risk: torch.Tensor

    @property
    def aurc(self) -> float:
        """Area under the curve: the mean of risk_k over k = 1..N."""
        return float(self.risk.mean())

    def summary(self, steps: int = SUMMARY_STEPS) -> tuple[tuple[float, float], ...]:
        """(j/steps, risk_k) for j = 1..steps at k = max(1, ceil(j·N/steps)): the risk when at
        least a fraction j/steps of the samples is kept (k in integer arithmetic)."""
        n = self.risk.shape[0]
        return tuple(
            (j / steps, float(self.risk[max(1, -(-j * n // steps)) - 1]))
            for j in range(1, steps + 1)
        )


def risk_coverage_curve(
    confidence: torch.Tensor, correct: torch.Tensor, order: torch.Tensor | None = None
) -> RiskCoverage:
    """risk_k for k = 1..N with ties spread evenly (module docstring); ``order`` is an
    ascending argsort of ``confidence`` when the caller has one."""
    confidence, correct = confidence.to(torch.float64), correct.to(torch.float64)
    n = confidence.shape[0]
    ascending = torch.argsort(confidence, stable=True) if order is None else order
    descending = ascending.flip(0)
    errors = 1.0 - correct[descending]
    sizes = group_sizes(confidence[ascending]).flip(0)  # the tie groups, most confident first
    ends = torch.cumsum(sizes, dim=0)  # samples up to the end of each group
    error_ends = torch.cumsum(errors, dim=0)[ends - 1]
    starts = ends - sizes
    error_starts = torch.cat((error_ends.new_zeros(1), error_ends[:-1]))
    group_rate = (error_ends - error_starts) / sizes
    group = torch.repeat_interleave(torch.arange(sizes.shape[0]), sizes)
    k = torch.arange(1, n + 1, dtype=torch.float64)
    kept_errors = error_starts[group] + (k - starts[group]) * group_rate[group]
    return RiskCoverage(coverage=k / n, risk=kept_errors / k)


def optimal_aurc(correct: torch.Tensor) -> float:
    """AURC* of an oracle ranking: (1/N) Σ_k max(0, k - (N - E))/k, E the number of errors."""
    n = correct.shape[0]
    n_correct = float(correct.to(torch.float64).sum())
    k = torch.arange(1, n + 1, dtype=torch.float64)
    return float(((k - n_correct).clamp_(min=0.0) / k).mean())


def excess_aurc(
    confidence: torch.Tensor, correct: torch.Tensor, order: torch.Tensor | None = None
) -> float:
    """E-AURC = AURC - AURC* (≥ 0 up to rounding)."""
    return risk_coverage_curve(confidence, correct, order).aurc - optimal_aurc(correct)
