"""A per-class block preconditioner for the full maps' Newton–CG where the fit nearly interpolates.

In whitened coordinates (:class:`~curvcal.calibration.linear._FullProblem`: s = A Ṽᵀ, rows
a_n of A with AᵀA/N ≈ I) the Hessian of mean NLL + Σ c ⊙ V² (V = Ṽ P) has, for class i, the
diagonal block

    H_ii = (1/N) Σ_n w_ni a_n a_nᵀ + 2 P diag(c_i) P,        w_ni = q_ni (1 − q_ni),

where c_i is row i of the regulariser's weights (:func:`~curvcal.calibration.linear.penalty_weights`).
Where the fit nearly interpolates (many classes, few rows a class), w_ni is tiny except on the
few rows near class i's boundary, so H_ii is the regulariser plus a low-rank term, and it
differs from class to class; the Kronecker preconditioner, which spreads each class's curvature
evenly over every direction and gives every class the mean regulariser, then leaves conjugate
gradients a spectrum spread over many decades (ODIR leaves W's diagonal free, the direction
along which such a fit sharpens). This preconditioner is block Jacobi with blocks

    B_i = 2 P diag(c⁰) P + μ_i I + Σ_{n∈S_i} (w_ni/N) a_n a_nᵀ − Σ_j 2 (c⁰_j − c_ij) (P e_j)(P e_j)ᵀ

with c⁰ = max_i c_i (columnwise), S_i the :data:`BLOCK_ROWS` rows of largest w_ni, and
μ_i = Σ_{n∉S_i} w_ni |a_n|² / (N (K+1)) the rest of the block's trace spread evenly. The last
sum (one term a row for ODIR: W_ii is not penalised; none for L2) makes the regulariser
exactly row i's. Each B_i is inverted by the Woodbury identity in the eigenbasis
2 P diag(c⁰) P = E diag(D) Eᵀ: with β_i = D + μ_i and U_i the columns above (signs s = ±1),

    B_i⁻¹ = E [diag(β_i)⁻¹ − diag(β_i)⁻¹ U_i (diag(s) + U_iᵀ diag(β_i)⁻¹ U_i)⁻¹ U_iᵀ diag(β_i)⁻¹] Eᵀ,

one (|S_i| + 1)-sized factorisation a class. It needs c⁰ > 0 everywhere (every column of V
regularised in some row): an unregularised fit has no such base and keeps the Kronecker
preconditioner. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

#: Rows of largest curvature w_ni kept exactly in each class's block (the rest enter as an
#: isotropic μ_i I). Measured on 2,000 × 300 Dirichlet ODIR λ = 0.01, whole fit to its
#: gradient test, one run each: 32 rows 355 products (8.2 CPU s), 64 rows 313 (9.4 s),
#: 128 rows 321 (14.4 s); the Kronecker preconditioner alone 3,283 (35.9 s).
BLOCK_ROWS = 64
#: Classes whose Woodbury factors are built and applied together (bounds the temporaries to
#: about CLASS_CHUNK · (BLOCK_ROWS + 1) · (K + 1) float64 numbers).
CLASS_CHUNK = 32
#: μ_i is raised to at least this fraction of D's largest value, so that every B_i is
#: positive definite even where a class's rows and regulariser leave a direction flat.
MU_FLOOR = 1e-12


@dataclass(frozen=True)
class BlockBasis:
    """What the blocks share across a fit: E and D (2 P diag(c⁰) P = E diag(D) Eᵀ), P E, the
    rotated rows A E, |a_n|², and each class's regulariser correction (column index j and scale
    √(2 (c⁰_j − c_ij)), ``columns`` K×m and ``scales`` K×m, m the most corrections a row)."""

    rotation: torch.Tensor
    base: torch.Tensor
    rotated_whitening: torch.Tensor
    rotated_rows: torch.Tensor
    row_norms: torch.Tensor
    correction_rows: torch.Tensor
    correction_scales: torch.Tensor


def has_block_base(penalty: torch.Tensor) -> bool:
    """Whether regulariser weights ``penalty`` (K×(K+1)) give the blocks a positive definite
    base: every column regularised in some row (c⁰_j > 0 for every j)."""
    return bool((penalty.max(0).values > 0).all())


def block_basis(a: torch.Tensor, p: torch.Tensor, penalty: torch.Tensor) -> BlockBasis:
    """The shared part of the blocks for whitened rows ``a`` (N×(K+1)), whitening ``p`` and
    regulariser weights ``penalty`` (K×(K+1)), which must have a base (:func:`has_block_base`;
    else ``ValueError``)."""
    if not has_block_base(penalty):
        raise ValueError("some column is regularised in no row: the blocks have no base")
    top = penalty.max(0).values
    base, rotation = torch.linalg.eigh(2.0 * (p * top) @ p)
    base = base.clamp_min(0.0)
    deficit = top[None, :] - penalty  # ≥ 0; nonzero where row i is regularised less
    most = int((deficit > 0).sum(1).max())
    k = penalty.shape[0]
    columns = torch.zeros((k, most), dtype=torch.int64)
    scales = torch.zeros((k, most), dtype=torch.float64)
    if most:
        order = torch.argsort(deficit, dim=1, descending=True)[:, :most]
        columns = order
        scales = (2.0 * deficit.gather(1, order)).sqrt()
    rotated = a @ rotation
    # Rows of P E: row j is (Eᵀ P e_j)ᵀ, the direction of a regulariser correction.
    return BlockBasis(rotation, base, p @ rotation, rotated, (a * a).sum(1), columns, scales)


def class_block_preconditioner(
    basis: BlockBasis, q: torch.Tensor, rows: int | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """v ↦ (B_i⁻¹ v_i)_i for the blocks B_i of the module docstring at the softmax ``q``
    (N×K, float64), ``rows`` |S_i| (default :data:`BLOCK_ROWS`); v is K×(K+1) flattened, as the fit's parameters."""
    n, k = q.shape
    width = k + 1
    weights = q * (1.0 - q)
    rows = min(BLOCK_ROWS if rows is None else rows, n)
    chosen = torch.topk(weights, rows, dim=0).indices.T.contiguous()  # K × r
    chosen_weights = weights.T.gather(1, chosen)  # K × r
    total = weights.T @ basis.row_norms
    kept = (chosen_weights * basis.row_norms[chosen]).sum(1)
    mu = ((total - kept).clamp_min(0.0) / (n * width)).clamp_min(MU_FLOOR * float(basis.base.max()))
    beta = basis.base[None, :] + mu[:, None]  # K × (K+1)
    data_scale = (chosen_weights / n).sqrt()  # K × r
    m = basis.correction_rows.shape[1]
    signs = torch.cat([torch.ones(rows, dtype=torch.float64), -torch.ones(m, dtype=torch.float64)])

    def columns(start: int, stop: int) -> torch.Tensor:
        """U_i for the classes start..stop−1, as (classes, r + m, K+1) (rows are columns)."""
        data = basis.rotated_rows[chosen[start:stop]] * data_scale[start:stop, :, None]
        correction = (
            basis.rotated_whitening[basis.correction_rows[start:stop]]
            * basis.correction_scales[start:stop, :, None]
        )
        return torch.cat([data, correction], dim=1)

    factors = []
    for start in range(0, k, CLASS_CHUNK):
        stop = min(start + CLASS_CHUNK, k)
        u = columns(start, stop)
        core = (u / beta[start:stop, None, :]) @ u.transpose(1, 2) + torch.diag(signs)
        factors.append(torch.linalg.lu_factor(core))

    def precondition(vector: np.ndarray) -> np.ndarray:
        v = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float64)).view(k, width)
        y = (v @ basis.rotation) / beta
        for chunk, start in enumerate(range(0, k, CLASS_CHUNK)):
            stop = min(start + CLASS_CHUNK, k)
            u = columns(start, stop)
            t = u @ y[start:stop, :, None]
            lu, pivots = factors[chunk]
            solved = torch.linalg.lu_solve(lu, pivots, t)
            y[start:stop] -= (u.transpose(1, 2) @ solved)[..., 0] / beta[start:stop]
        return (y @ basis.rotation.T).reshape(-1).numpy()

    return precondition
