"""When a Lanczos basis must be reorthogonalised: Simon's ω recurrence (partial reorthogonalisation).

In exact arithmetic the three-term recurrence A q_j = β_j q_{j−1} + α_j q_j + β_{j+1} q_{j+1}
keeps the Lanczos vectors orthonormal; in floating point they lose orthogonality as Ritz values
converge (Paige 1971). Reorthogonalising every new vector against the whole basis (full
reorthogonalisation) reads all m vectors twice per step, which at P = 10⁷ parameters costs a
fair share of a Hessian product. Simon (1984, "The Lanczos algorithm with partial
reorthogonalization", Math. Comp. 42) showed that semi-orthogonality, |q_iᵀq_k| ≤ √ε for
i ≠ k, is enough: the tridiagonal T_m is then, to working precision, the projection of A on an
orthonormal basis of span(q_1 … q_m), so its eigenvalues (the Ritz values) are as accurate as
with full reorthogonalisation. The level of orthogonality ω_{ik} ≈ q_iᵀq_k is estimated without
touching the vectors, from the recurrence's own coefficients (Simon 1984, eq. 3.3; Larsen 1998,
PROPACK)::

    β_{j+1} ω_{j+1,k} = β_{k+1} ω_{j,k+1} + (α_k − α_j) ω_{j,k} + β_k ω_{j,k−1} − β_j ω_{j−1,k} ± ϑ

with ω_{k,k} = 1, ω_{k,0} = 0 and the local rounding ϑ = 2ε‖A‖ added with the sign of the sum (so
the estimate is the larger of the two), and ω_{j+1,j} = ψ = ε‖A‖/β_{j+1} (the rounding of the
latest step's own two-term clearing). When max_k |ω_{j+1,k}| exceeds √ε, the new vector is
reorthogonalised against the whole basis, and so is the next one (the previous vector still
carries the loss into it: Simon 1984 §4, PROPACK's forced second pass); after each, its ω row is
reset to ψ. ‖A‖ is estimated by max_j (|α_j| + β_j + β_{j+1}), a Gershgorin bound of T_m, which
is at least ‖T_m‖ and so errs on the side of reorthogonalising.

ε is the relative error of a product, not of the basis arithmetic (which is float64): the
machine epsilon of the operator's dtype, or a larger stated product error (a precision floor, a
central-difference bound), since the error of each product is what seeds the loss of
orthogonality. The threshold stays √ε of the operator's dtype (and no more than the tolerance
asked for, since the residual a converged Ritz vector keeps from the lost orthogonality is about
ω·‖A‖), so a noisy operator reorthogonalises more often, up to every step (full
reorthogonalisation).
"""

from __future__ import annotations

import math

import torch


class OrthogonalityEstimate:
    """Simon's estimate of a Lanczos basis' loss of orthogonality, one row of ω per step.

    ``epsilon``: the relative error of a product (ε above); ``threshold``: the level of |ω| that
    asks for a reorthogonalisation (Lanczos: min(√ε of the operator's dtype, tol)). Call :meth:`step` after each
    Lanczos step's two-term clearing with that step's α_j and β_{j+1}; it says whether the new
    vector must be cleared against the whole basis; call :meth:`reorthogonalised` when it was
    (with the new β_{j+1}), and :meth:`restart` when the basis stops being a Lanczos basis of
    one start vector (a fresh vector after an invariant subspace)."""

    def __init__(self, epsilon: float, threshold: float) -> None:
        self.epsilon = epsilon
        self.threshold = threshold
        self.alphas: list[float] = []
        self.betas: list[float] = [0.0]  # β_1 = 0: q_1 has no predecessor
        self.norm = 0.0  # the Gershgorin bound of T_m, ≥ ‖T_m‖
        self._previous = torch.zeros(0, dtype=torch.float64)  # ω_{j−1, ·}
        self._current = torch.ones(1, dtype=torch.float64)  # ω_{j, ·}: ω_{1,1} = 1
        self._forced = False  # the next image is cleared against the whole basis whatever ω says
        self._forcing = False  # the latest image was, for that reason
        #: the largest |ω| estimated before any reorthogonalisation of the latest step
        self.latest = 0.0
        #: steps whose vector was cleared against the whole basis
        self.reorthogonalisations = 0

    def _psi(self, beta: float) -> float:
        """ω_{j+1,j}: the rounding of one step's clearing against its two latest vectors."""
        if beta <= 0.0:
            return 1.0
        return self.epsilon * max(self.norm, beta) / beta

    def step(self, alpha: float, beta: float) -> bool:
        """Record step j's α_j and β_{j+1} (the norm of its image after the two-term clearing);
        True when that image must be cleared against the whole basis before it is kept."""
        j = len(self.alphas)  # 0-based: the rows of ω so far are those of q_0 … q_j
        self.alphas.append(alpha)
        self.norm = max(self.norm, abs(alpha) + self.betas[j] + beta)
        following = torch.zeros(j + 2, dtype=torch.float64)  # ω_{j+1, 0 … j+1}
        following[j + 1] = 1.0
        if j >= 1:
            alphas = torch.tensor(self.alphas[:j], dtype=torch.float64)
            betas = torch.tensor(self.betas, dtype=torch.float64)  # betas[i] couples q_i, q_{i−1}
            current, previous = self._current, self._previous  # ω_{j, 0…j}, ω_{j−1, 0…j−1}
            # k = 0 … j − 1: β_{k+1} ω_{j,k+1} + (α_k − α_j) ω_{j,k} + β_k ω_{j,k−1} − β_j ω_{j−1,k}
            total = betas[1 : j + 1] * current[1 : j + 1] + (alphas - alpha) * current[:j]
            total[1:] += betas[1:j] * current[: j - 1]
            total -= betas[j] * previous
            rounding = 2.0 * self.epsilon * self.norm
            total += torch.where(total >= 0, rounding, -rounding)
            following[:j] = total / beta if beta > 0.0 else math.inf
        following[j] = self._psi(beta)
        self.latest = float(following[: j + 1].abs().max())
        self._previous, self._current = self._current, following
        self.betas.append(beta)
        self._forcing = self._forced
        self._forced = False
        return self._forcing or self.latest > self.threshold

    def reorthogonalised(self, beta: float) -> None:
        """The latest image was cleared against the whole basis and has norm ``beta`` now: its
        ω row falls to the rounding level, and, unless this clearing was itself the forced
        second one, the next image is cleared against the whole basis too."""
        self.betas[-1] = beta
        self._current[:-1] = self._psi(beta)
        self._forced = not self._forcing
        self.reorthogonalisations += 1

    def restart(self) -> None:
        """The latest vector is a fresh one, cleared against the whole basis (not the image of
        the one before): it is orthogonal to the rounding level and β_{j+1} = 0."""
        self.betas[-1] = 0.0
        self._current[:-1] = self.epsilon
