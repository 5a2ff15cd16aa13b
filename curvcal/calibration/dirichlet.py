"""Dirichlet calibration (Kull et al. 2019): matrix scaling of the log-probabilities.

    q = softmax(W log p + b),   W ∈ R^{K×K}, b ∈ R^K,

with log p = log_softmax z for logits (probabilities: their log, floored at
:data:`~curvcal.calibration.linear.LOG_FLOOR`). The fit minimises the mean NLL on the fit split
plus one of the paper's two regularisers (:func:`~curvcal.calibration.linear.penalty_weights`):

- ``odir`` (Dir-ODIR, the paper's choice for neural networks): λ · Σ_{i≠j} W_ij² / (K(K−1))
  + λ · Σ_j b_j² / K, the off-diagonal entries and the intercept only;
- ``l2`` (Dir-L2): λ · (Σ_ij W_ij² + Σ_j b_j²) / (K(K+1)), every parameter, towards 0;

λ chosen by stratified 5-fold cross-validation on the fit split over
:data:`~curvcal.calibration.linear.ODIR_GRID` (the paper tunes the two ODIR strengths λ and μ
apart; curvcal ties them, λ = μ, as matrix scaling does). The map, the optimiser and the
cross-validation are those of :mod:`.linear`; this module only names the choices.
"""

from __future__ import annotations

from typing import Any

from curvcal.calibration.linear import LinearFit, fit_matrix_odir


def fit_dirichlet(scores: Any, labels: Any, kind: str = "logits", **options: Any) -> LinearFit:
    """Dirichlet calibration: :func:`~curvcal.calibration.linear.fit_matrix_odir` with
    ``method="dirichlet"`` and its keyword ``options`` (``names``, ``seed``, ``regulariser``
    ``odir`` or ``l2``, ``grid``, ``folds``, ``patience``; the same defaults), the strength
    chosen by ``folds``-fold cross-validation seeded by ``seed`` (module docstring)."""
    return fit_matrix_odir(scores, labels, kind, method="dirichlet", **options)
