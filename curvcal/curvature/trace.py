"""Stochastic trace estimates of a symmetric operator: Hutchinson (adaptive) and Hutch++.

* Hutchinson (1989): tr(A) ≈ (1/m) Σ_i v_iᵀ A v_i with E[v vᵀ] = I — Rademacher (±1, the
  default, the least variance) or standard Gaussian probes. Standard error s/√m, s the sample
  standard deviation of the m values v_iᵀAv_i; 95% interval estimate ± t(0.975, m−1)·s/√m.
  Adaptive mode (``rtol`` given) draws probes in blocks of ``probe_batch`` and stops once at
  least ``min_probes`` are drawn and the half-width ≤ rtol·|estimate|, or at ``max_probes``.
* Hutch++ (Meyer, Musco, Musco & Woodruff 2021): with m products, sketch S (P × m/3),
  Q = orth(A S), then tr(A) = tr(QᵀAQ) + tr((I−QQᵀ)A(I−QQᵀ)), the second term by Hutchinson
  with the remaining probes G. The first term is exact given Q; the standard error and interval
  are those of the Hutchinson part, so they are honest conditionally on the sketch.
* XTrace (Epperly, Tropp & Webber 2024): every probe serves in the sketch and in the correction;
  its interval is the jackknife over probes, from the leave-two-out values of the small sketch
  matrices (conservative: Efron–Stein). See :func:`xtrace`.

Probes come from a CPU ``torch.Generator`` seeded by ``seed``, one probe at a time, then move to
the operator's device: the same seed gives the same probes on any device and with any
``probe_batch``. At most ``probe_batch`` probes are held at once.

Memory of the sketching estimators: the sketch is streamed. Products of ``probe_batch`` columns
are orthonormalised as they arrive into one preallocated s × P matrix (block classical
Gram–Schmidt, twice, with rank detection: :class:`_StreamedBasis`), and tr(QᵀAQ) is summed over
blocks of Q as Σ_j q_jᵀ(A q_j). The extra memory is the sketch, s·P values in the operator's
dtype (:func:`sketch_bytes`), plus the blocks in flight. The sketch never has more than P
columns: once Q spans the whole space (rank P), tr(QᵀAQ) is tr(A) up to rounding, the remaining
products are not spent and the result says ``stopped_by="exhausted"``.

Sliced vectors: for an operator whose vectors are each rank's slice (a model sharded over ranks,
:mod:`curvcal.curvature.vectors`), probes are drawn a parameter at a time and each rank keeps its
rows (Rademacher probes are then the same values as a whole draw), the sketch holds s × P/W
values per rank, and every inner product — vᵀAv, QᵀB, the column norms — is the local one summed
over the ranks. The streamed QR below needs nothing else: with Q and B held in row slices,
QᵀB = Σ_r Q_rᵀB_r and ‖b‖² = Σ_r ‖b_r‖² (an all-reduce of a k × b matrix or of one number), and
every update B ← B − Q(QᵀB), b ← b/‖b‖ is local; so the basis, its R and the estimates are
those of the whole vectors up to the order of summation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from scipy.special import stdtrit
from torch import Tensor

from curvcal.curvature.operators import LinearOperator, as_operator
from curvcal.curvature.progress import OnStep
from curvcal.curvature.results import ConvergenceWarning, TraceResult
from curvcal.curvature.vectors import VectorSpace, space_of
from curvcal.errors import InputError
from curvcal.seeds import seeded_generator
from curvcal.settings.fields import former_keywords
from curvcal.settings.hessian import trace_method_now

DISTRIBUTIONS = ("rademacher", "gaussian")
METHODS = ("hutchinson", "hutchpp", "xtrace")
DEFAULT_METHOD = "hutchpp"
# How each estimator forms its 95% interval, as the results state it.
INTERVALS = {
    "hutchinson": "Student-t over the m probe values vᵀAv (independent probes)",
    "hutchpp": "Student-t over the probe values of the deflated remainder, given the sketch "
    "(the sketched part is exact)",
    "xtrace": "jackknife over probes: variance (n−1)/n Σ_j (T_(j) − T̄)², T_(j) the estimate "
    "without probe j, ± t(0.975, n−1)·√variance (conservative)",
    "exact": "none needed: exact up to rounding",
    "exhausted": "none needed: the sketch spans the whole space, so tr(QᵀAQ) is exact up to "
    "rounding",
}


def draw_probes(
    n_params: int,
    count: int,
    distribution: str,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """``count`` probe vectors as columns of a (P, count) CPU tensor of ``dtype``, drawn one by one.

    The values do not depend on ``dtype`` beyond rounding: ±1 (Rademacher), or float64 normal
    draws rounded to ``dtype``. Only one column's temporaries exist besides the result."""
    return VectorSpace(n_params).probes(count, distribution, generator, dtype)


def _interval(samples: list[float]) -> tuple[float, float, tuple[float, float]]:
    """Mean, standard error s/√m and the Student-t 95% interval of ``samples`` (m ≥ 2)."""
    values = torch.tensor(samples, dtype=torch.float64)
    count = len(samples)
    mean = float(values.mean())
    error = float(values.std(correction=1)) / math.sqrt(count)
    half = float(stdtrit(count - 1, 0.975)) * error
    return mean, error, (mean - half, mean + half)


def _positive_int(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(name, f"must be an integer ≥ {minimum}, got {value!r}")


def _check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise InputError(
            "probe_dist",
            f"unknown probe distribution {distribution!r}",
            "choose 'rademacher' or 'gaussian'",
        )


def _quadratic_forms(op: LinearOperator, probes: Tensor) -> list[float]:
    """v_iᵀ A v_i for each column v_i of ``probes`` (CPU), computed on the operator's device."""
    vectors = probes.to(device=op.device, dtype=op.dtype)
    images = op.matmat(vectors)
    forms = space_of(op).reduce((vectors * images).sum(dim=0))
    return [float(x) for x in forms.to(torch.float64).cpu()]


@former_keywords(n_probes="probes", rtol="trace_rtol", distribution="probe_dist")
def hutchinson_trace(
    operator: LinearOperator | Tensor,
    probes: int = 100,
    *,
    trace_rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    probe_dist: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    on_step: OnStep = None,
) -> TraceResult:
    """Hutchinson's estimate of tr(A) with a standard error and a 95% interval.

    Without ``trace_rtol``: exactly ``probes`` probes (≥ 2). With ``trace_rtol`` > 0: adaptive, between
    ``min_probes`` and ``max_probes`` probes (``probes`` is then ignored). ``on_step`` receives
    the number of probes used so far after each block.
    """
    op = as_operator(operator)
    _check_distribution(probe_dist)
    _positive_int("probe_batch", probe_batch)
    adaptive = trace_rtol is not None
    if adaptive:
        if not (
            isinstance(trace_rtol, int | float) and math.isfinite(trace_rtol) and trace_rtol > 0
        ):
            raise InputError(
                "trace_rtol",
                f"the relative tolerance must be a finite number > 0, got {trace_rtol!r}",
            )
        _positive_int("min_probes", min_probes, 2)
        _positive_int("max_probes", max_probes, min_probes)
        budget = max_probes
    else:
        _positive_int("probes", probes, 2)
        budget = probes
    generator = seeded_generator(seed)
    space = space_of(op)
    samples: list[float] = []
    stopped_by = "n_probes"
    while len(samples) < budget:
        block = min(probe_batch, budget - len(samples))
        # drawn in the operator's dtype: the same values, half the memory of float64 probes
        vectors = space.probes(block, probe_dist, generator, op.dtype)
        samples += _quadratic_forms(op, vectors)
        if on_step is not None:
            on_step(len(samples))
        if adaptive and len(samples) >= min_probes:
            estimate, _error, (low, high) = _interval(samples)
            # a half-width under the products' own relative accuracy is not asked for
            wanted = max(float(trace_rtol or 0.0), float(getattr(op, "precision_floor", 0.0)))
            if (high - low) / 2 <= wanted * abs(estimate):
                stopped_by = "rtol"
                break
    else:
        if adaptive:
            stopped_by = "max_probes"
    estimate, error, interval = _interval(samples)
    result = TraceResult(
        estimate=estimate,
        standard_error=error,
        ci95=interval,
        n_probes=len(samples),
        matvecs=len(samples),
        method="hutchinson",
        distribution=probe_dist,
        interval=INTERVALS["hutchinson"],
        seed=seed,
        rtol=float(trace_rtol) if trace_rtol is not None else None,
        stopped_by=stopped_by,
        converged=stopped_by != "max_probes",
    )
    if not result.converged:
        warnings.warn(
            ConvergenceWarning(
                f"hutchinson: the 95% half-width {result.half_width:.3g} is still above "
                f"trace_rtol·|estimate| after {len(samples)} probes; raise max_probes or trace_rtol"
            ),
            stacklevel=2,
        )
    return result


@former_keywords(matvecs="probes", distribution="probe_dist")
def hutchpp_trace(
    operator: LinearOperator | Tensor,
    probes: int = 99,
    *,
    probe_dist: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    max_sketch: int | None = None,
    on_step: OnStep = None,
) -> TraceResult:
    """Hutch++ estimate of tr(A) with at most ``probes`` operator products (≥ 4).

    A third (rounded down, at least 1, at most P and at most ``max_sketch``: a memory bound) of
    the products builds the sketch
    Q = orth(A S), one product per column of Q (its rank k ≤ s) computes tr(QᵀAQ), and the
    rest (≥ 2) are Hutchinson probes of the deflated operator (I − QQᵀ)A(I − QQᵀ). ``n_probes``
    in the result counts those remaining probes. When Q spans the whole space (k = P), the
    trace is tr(QᵀAQ), exact up to rounding: no further product is spent, ``matvecs`` is 2P,
    ``stopped_by`` is ``"exhausted"`` and the interval has width zero. Peak extra memory: the
    s × P sketch in the operator's dtype and ``probe_batch`` columns in flight.
    """
    op, basis, spent, sketch_size = _sketch(
        "hutchpp", operator, probes, probe_dist, probe_batch, on_step, max_sketch
    )
    space, n_params = basis.space, op.shape[0]
    generator = seeded_generator(seed)
    for block in _probe_blocks(sketch_size, probe_batch, probe_dist, generator, op):
        basis.extend(op.matmat(block))
        spent(block.shape[1])
    exact_part = _projected_trace(op, basis.columns, probe_batch, spent)
    if basis.rank == n_params:
        return _exhausted("hutchpp", exact_part, spent.total, 0, probe_dist, seed, basis.nbytes)
    n_residual = probes - spent.total
    q = basis.columns
    samples: list[float] = []
    for block in _probe_blocks(n_residual, probe_batch, probe_dist, generator, op):
        deflated = block - q @ space.project(q.t(), block)
        images = op.matmat(deflated)
        images = images - q @ space.project(q.t(), images)
        forms = space.reduce((deflated * images).sum(dim=0))
        samples += [float(x) for x in forms.to(torch.float64).cpu()]
        spent(block.shape[1])
    remainder, error, (low, high) = _interval(samples)
    return _sketched(
        "hutchpp",
        (exact_part + remainder, error, (exact_part + low, exact_part + high)),
        n_residual,
        spent.total,
        probe_dist,
        seed,
        basis.nbytes,
    )


@former_keywords(matvecs="probes", distribution="probe_dist")
def xtrace(
    operator: LinearOperator | Tensor,
    probes: int = 100,
    *,
    probe_dist: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    on_step: OnStep = None,
) -> TraceResult:
    """XTrace estimate of tr(A) with at most ``probes`` operator products (≥ 4; an odd one is
    not used).

    Epperly, Tropp & Webber (SIAM J. Matrix Anal. Appl. 2024). With s = min(⌊probes/2⌋, max(P, 2))
    probes Ω = [ω_1 … ω_s]: Y = AΩ = QR, Z = AQ, H = sym(QᵀZ). For each i, Q_(i) spans the
    sketch of the other s − 1 probes — Q_(i)Q_(i)ᵀ = Q(I − s_i s_iᵀ)Qᵀ with s_i the i-th column
    of R⁻ᵀ, normalised — and

        t_i = tr(Q_(i)ᵀ A Q_(i)) + ω_iᵀ (I − Q_(i)Q_(i)ᵀ) A (I − Q_(i)Q_(i)ᵀ) ω_i,

    an unbiased Hutch++ estimate whose one Hutchinson probe is independent of its sketch. The
    estimate is the mean of the t_i: every probe serves both in the low-rank part and in the
    correction (exchangeability).

    The t_i share all but one probe, so their spread understates the error. The interval is the
    jackknife over probes instead: with T_(j) the XTrace estimate of the s − 1 probes without
    ω_j (the mean of the leave-two-out values, :func:`_jackknife_variance`),

        variance = (s − 1)/s · Σ_j (T_(j) − T̄)²,   T̄ = mean_j T_(j),

    ``standard_error`` = √variance and the 95% interval estimate ± t(0.975, s−1)·√variance. The
    estimate is a symmetric function of independent probes, so by the Efron–Stein inequality
    this variance is conservative in expectation. It costs no product and no P-long vector:
    O(s³) work on the s × s matrices R, QᵀAQ, QᵀΩ and the ω_iᵀAω_i. When Y is numerically
    rank-deficient (A of rank < s), the sketch holds the whole range of A: the estimate is
    tr(QᵀAQ) over that range plus the mean Hutchinson correction of the full sketch's
    complement (zero up to rounding); that range is exact and held fixed, so the jackknife is
    the sample variance of those values over s, zero up to rounding. Z then costs one product
    per column of the basis (its rank), not s. When Q spans the whole
    space (rank P) the estimate is tr(QᵀAQ), exact up to rounding, with ``stopped_by``
    ``"exhausted"``. ``n_probes`` counts the s probes.

    Memory: Y is orthonormalised in place as its blocks arrive (:class:`_StreamedBasis`, one
    s × P matrix in the operator's dtype); Ω is drawn again from the seed for QᵀΩ instead of
    being held, and Z is reduced to QᵀZ block by block. Everything else is s × s.
    """
    op, basis, spent, count = _sketch("xtrace", operator, probes, probe_dist, probe_batch, on_step)
    space, n_params = basis.space, op.shape[0]
    diagonal = []
    blocks = _probe_blocks(count, probe_batch, probe_dist, seeded_generator(seed), op)
    for block in blocks:
        images = op.matmat(block)
        diagonal.append(space.reduce((block * images).sum(dim=0)).to(torch.float64).cpu())
        basis.extend(images)
        spent(block.shape[1])
    q = basis.columns
    if basis.rank == n_params:
        exact_part = _projected_trace(op, q, probe_batch, spent)
        return _exhausted("xtrace", exact_part, spent.total, count, probe_dist, seed, basis.nbytes)
    projected = _projected_matrix(op, q, probe_batch, spent)
    again = _probe_blocks(count, probe_batch, probe_dist, seeded_generator(seed), op)
    coordinates = torch.cat(
        [space.project(q.t(), block).to(torch.float64).cpu() for block in again], dim=1
    )
    sketch = _Sketch(
        triangle=basis.triangle.to(torch.float64).cpu(),
        projected=projected,
        coordinates=coordinates,
        diagonal=torch.cat(diagonal),
        eps=torch.finfo(op.dtype).eps,
    )
    samples = _leave_one_out(sketch)
    estimate = _interval(samples)[0]
    error = math.sqrt(_jackknife_variance(sketch, samples))
    half = float(stdtrit(count - 1, 0.975)) * error
    interval = (estimate - half, estimate + half)
    return _sketched(
        "xtrace",
        (estimate, error, interval),
        count,
        spent.total,
        probe_dist,
        seed,
        basis.nbytes,
    )


@dataclass(frozen=True)
class _Sketch:
    """The small matrices of an XTrace sketch (float64, CPU): R (k × s) of Y = AΩ = QR, H = QᵀAQ
    (k × k), C = QᵀΩ (k × s), the diagonal ω_iᵀAω_i (s) and the products' ε."""

    triangle: Tensor
    projected: Tensor
    coordinates: Tensor
    diagonal: Tensor
    eps: float

    @cached_property
    def rank_floor(self) -> float | None:
        """None when R is of full rank s; otherwise the singular-value floor below which R's
        directions are rounding (10·s·ε·σ_1, ε of the products): Y is rank-deficient up to the
        products' rounding (or the basis dropped a column), so there is no R⁻ᵀ. Computed once."""
        triangle = self.triangle
        count = triangle.shape[1]
        singular = torch.linalg.svdvals(triangle) if triangle.numel() else torch.zeros(1)
        floor = 10 * count * self.eps * float(singular[0])
        if triangle.shape[0] < count or float(singular[0]) == 0.0 or float(singular[-1]) <= floor:
            return floor
        return None


def _directions(triangle: Tensor) -> Tensor:
    """The columns of R⁻ᵀ, each normalised: column i spans the part of the sketch that only
    probe i contributes (orthogonal to R e_k for every k ≠ i)."""
    identity = torch.eye(triangle.shape[1], dtype=torch.float64)
    directions = torch.linalg.solve_triangular(triangle.t(), identity, upper=False)  # R⁻ᵀ
    return directions / directions.norm(dim=0, keepdim=True)


def _leave_one_out(sketch: _Sketch) -> list[float]:
    """The XTrace values t_i (float64) from the small matrices of the sketch.

    With w_i = Qᵀω_i, d_i = w_i − s_i(s_iᵀw_i), u_i = (I − Q_(i)Q_(i)ᵀ)ω_i = ω_i − Q d_i and, A
    symmetric, Qᵀ(Aω_i) = QᵀY e_i = R e_i = r_i: u_iᵀAu_i = ω_iᵀAω_i − 2 r_iᵀd_i + d_iᵀ H d_i, and
    tr(Q_(i)ᵀAQ_(i)) = tr(H) − s_iᵀ H s_i. O(s²) work per probe once H, R and W are known.
    """
    triangle = sketch.triangle
    count = triangle.shape[1]
    floor = sketch.rank_floor
    if floor is not None:
        return _range_captured(sketch, floor)
    projected = (sketch.projected + sketch.projected.t()) / 2
    coordinates = sketch.coordinates
    directions = _directions(triangle)
    full = float(torch.trace(projected))
    samples = []
    for i in range(count):
        direction = directions[:, i]
        d = coordinates[:, i] - direction * torch.dot(direction, coordinates[:, i])
        low_rank = full - float(direction @ projected @ direction)
        correction = float(
            sketch.diagonal[i] - 2 * torch.dot(triangle[:, i], d) + d @ projected @ d
        )
        samples.append(low_rank + correction)
    return samples


def _jackknife_variance(sketch: _Sketch, samples: list[float]) -> float:
    """The jackknife variance over probes of the XTrace estimate T̄ = mean t_i (float64):

        var = (s − 1)/s · Σ_j (T_(j) − mean_j T_(j))²,

    T_(j) the XTrace estimate of the s − 1 probes without ω_j: the mean over i ≠ j of the
    leave-two-out values t_(i,j) (Hutch++ with test probe ω_i and the sketch of Ω without ω_i
    and ω_j), from the small matrices only (:func:`_leave_two_out`). When the sketch holds the
    range of A (rank-deficient Y) the basis of that range is exact and held fixed: each value
    t_i then depends on its own probe only and the jackknife of their mean is the sample
    variance of the t_i over s."""
    if sketch.rank_floor is not None:
        values = torch.tensor(samples, dtype=torch.float64)
        return float(values.var(correction=1)) / len(samples)
    table = _leave_two_out(sketch)  # [i, j]: t_(i,j); the diagonal is not a value (NaN)
    count = table.shape[0]
    table = table.masked_fill(torch.eye(count, dtype=torch.bool), 0.0)
    without = table.sum(dim=0) / (count - 1)  # T_(j)
    return (count - 1) / count * float(((without - without.mean()) ** 2).sum())


def _leave_two_out(sketch: _Sketch) -> Tensor:
    """t_(i,j) for every pair i ≠ j, for a full-rank R (s × s): an s × s table, float64, whose
    diagonal i = j is not a value (it may be NaN).

    The sketch of Ω without ω_i and ω_j, A(Ω without them) = Q·(R without columns i, j), is
    spanned by Q times the complement of span(g_i, g_j), g_k the normalised k-th column of R⁻ᵀ
    (R e_l ⊥ g_k for l ≠ k): its projector is Q(I − GΓ⁻¹Gᵀ)Qᵀ with G = [g_i g_j] and
    Γ = GᵀG (2 × 2). With w_i = Qᵀω_i, a = Γ⁻¹Gᵀw_i, d = w_i − Ga, r_i = R e_i and
    H = sym(QᵀAQ):

        t_(i,j) = tr(H) − tr(Γ⁻¹GᵀHG) + ω_iᵀAω_i − 2 r_iᵀd + dᵀHd,

    with r_iᵀd = r_iᵀw_i − r_iᵀGa and dᵀHd = w_iᵀHw_i − 2 w_iᵀHGa + aᵀGᵀHGa. Every term is an
    entry of one of the s × s products below: O(s³) work in all, O(s²) memory."""
    projected = (sketch.projected + sketch.projected.t()) / 2
    triangle, coordinates = sketch.triangle, sketch.coordinates
    directions = _directions(triangle)
    gram = directions.t() @ directions  # g_kᵀg_l
    curved = directions.t() @ projected @ directions  # g_kᵀHg_l
    along = directions.t() @ coordinates  # [k, i]: g_kᵀw_i
    curved_along = directions.t() @ projected @ coordinates  # [k, i]: g_kᵀHw_i
    images = triangle.t() @ directions  # [i, k]: r_iᵀg_k
    own = _diagonal_column
    gram_ii, gram_jj = own(gram), own(gram).t()
    determinant = gram_ii * gram_jj - gram**2
    # a = Γ⁻¹ [g_iᵀw_i, g_jᵀw_i] for each (i, j)
    along_i, along_j = own(along), along.t()
    a_i = (gram_jj * along_i - gram * along_j) / determinant
    a_j = (gram_ii * along_j - gram * along_i) / determinant
    curved_ii, curved_jj = own(curved), own(curved).t()
    low_rank = (
        float(torch.trace(projected))
        - (gram_jj * curved_ii - 2 * gram * curved + gram_ii * curved_jj) / determinant
    )
    image_along = (triangle * coordinates).sum(dim=0).unsqueeze(1)  # r_iᵀw_i
    image_d = image_along - own(images) * a_i - images * a_j
    quadratic = (coordinates * (projected @ coordinates)).sum(dim=0).unsqueeze(1)  # w_iᵀHw_i
    curved_d = (
        quadratic
        - 2 * (own(curved_along) * a_i + curved_along.t() * a_j)
        + a_i**2 * curved_ii
        + 2 * a_i * a_j * curved
        + a_j**2 * curved_jj
    )
    return low_rank + sketch.diagonal.unsqueeze(1) - 2 * image_d + curved_d


def _diagonal_column(matrix: Tensor) -> Tensor:
    """M's diagonal as a column (s × 1): broadcast over j, entry [i, j] is M[i, i]."""
    return torch.diagonal(matrix).unsqueeze(1)


def _range_captured(sketch: _Sketch, floor: float) -> list[float]:
    """Values of a rank-deficient sketch: with P = QW an orthonormal basis of the numerical
    range of Y (W: R's left singular vectors above ``floor``; Y then holds the range of A),
    tr(PᵀAP) plus each probe's Hutchinson term u_iᵀAu_i, u_i = (I − PPᵀ)ω_i (zero up to
    rounding when P holds the range of A). With a_i = Pᵀω_i = WᵀC e_i and Pᵀ(Aω_i) = WᵀR e_i,
    u_iᵀAu_i = ω_iᵀAω_i − 2 a_iᵀWᵀR e_i + a_iᵀ(WᵀHW)a_i: small matrices only."""
    if sketch.triangle.numel() == 0:  # A Ω = 0: nothing in the range
        return [float(t) for t in sketch.diagonal]
    left, singular, _ = torch.linalg.svd(sketch.triangle)
    within = left[:, : int((singular > floor).sum())]
    range_matrix = within.t() @ sketch.projected @ within  # PᵀAP
    exact_part = float(torch.trace(range_matrix))
    along = within.t() @ sketch.coordinates  # a_i
    images_along = within.t() @ sketch.triangle  # Pᵀ A ω_i
    terms = (
        sketch.diagonal
        - 2 * (along * images_along).sum(dim=0)
        + (along * (range_matrix @ along)).sum(dim=0)
    )
    return [exact_part + float(t) for t in terms]


def exact_trace(operator: LinearOperator | Tensor, *, probe_batch: int = 8) -> TraceResult:
    """tr(A) = Σ_i e_iᵀ A e_i with the P unit vectors (P products): exact up to rounding."""
    op = as_operator(operator)
    _positive_int("probe_batch", probe_batch)
    n_params = op.shape[0]
    total = 0.0
    for start in range(0, n_params, probe_batch):
        stop = min(start + probe_batch, n_params)
        units = torch.zeros((n_params, stop - start), dtype=op.dtype, device=op.device)
        units[torch.arange(start, stop), torch.arange(stop - start)] = 1.0
        total += float(torch.diagonal(op.matmat(units)[start:stop]).sum())
    return _known(
        total,
        n_probes=n_params,
        matvecs=n_params,
        method="exact",
        distribution="unit",
        interval=INTERVALS["exact"],
        seed=0,
        stopped_by="n_probes",
    )


@former_keywords(
    n_probes="probes", method="trace_method", rtol="trace_rtol", distribution="probe_dist"
)
def trace_estimate(
    operator: LinearOperator | Tensor,
    probes: int = 100,
    *,
    trace_method: str = DEFAULT_METHOD,
    trace_rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    probe_dist: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    max_sketch: int | None = None,
    on_step: OnStep = None,
) -> TraceResult:
    """tr(A) by ``trace_method``: ``"hutchpp"`` (the default; ``probes`` operator products in all,
    its sketch at most ``max_sketch`` columns), ``"xtrace"`` (``probes`` products, an odd one
    unused) or ``"hutchinson"`` (``probes`` probes, or adaptive with ``trace_rtol``; ``trace_rtol`` only
    with Hutchinson). ``max_sketch`` only with Hutch++: every XTrace product is in its sketch.

    Hutch++ is the default because its interval is valid given the sketch (coverage measured
    at 93–97% on decaying, flat and indefinite spectra and on small models' Hessians). XTrace is
    usually more accurate at equal products; its jackknife interval is conservative (coverage
    98.5–100% in the same study) and often wider than Hutch++'s. The former spelling
    ``"hutch++"`` is read as ``"hutchpp"`` with a :class:`~curvcal.errors.FormerSpellingWarning`."""
    trace_method = trace_method_now(trace_method, "trace_method")
    if max_sketch is not None and trace_method != "hutchpp":
        raise InputError(
            "max_sketch",
            f"only Hutch++ can bound its sketch, not {trace_method!r}",
            "pass max_sketch=None",
        )
    if trace_method == "hutchinson":
        return hutchinson_trace(
            operator,
            probes,
            trace_rtol=trace_rtol,
            max_probes=max_probes,
            min_probes=min_probes,
            probe_dist=probe_dist,
            seed=seed,
            probe_batch=probe_batch,
            on_step=on_step,
        )
    if trace_method in ("hutchpp", "xtrace"):
        _positive_int("probes", probes, 4)
        if trace_rtol is not None:
            raise InputError(
                "trace_rtol",
                "the adaptive stop is only available with trace_method 'hutchinson'",
                "pass trace_method='hutchinson' with trace_rtol",
            )
        if trace_method == "hutchpp":
            return hutchpp_trace(
                operator,
                probes,
                probe_dist=probe_dist,
                seed=seed,
                probe_batch=probe_batch,
                max_sketch=max_sketch,
                on_step=on_step,
            )
        return xtrace(
            operator,
            probes,
            probe_dist=probe_dist,
            seed=seed,
            probe_batch=probe_batch,
            on_step=on_step,
        )
    raise InputError(
        "trace_method",
        f"unknown trace method {trace_method!r}",
        "choose 'hutchpp', 'xtrace' or 'hutchinson'",
    )


class _Spent:
    """Products spent so far by a sketching estimator, reported to ``on_step`` as they are."""

    def __init__(self, on_step: OnStep) -> None:
        self.total = 0
        self._on_step = on_step

    def __call__(self, products: int) -> None:
        self.total += products
        if self._on_step is not None:
            self._on_step(self.total)


def _sketch(
    method: str,
    operator: LinearOperator | Tensor,
    probes: int,
    distribution: str,
    probe_batch: int,
    on_step: OnStep,
    max_sketch: int | None = None,
) -> tuple[LinearOperator, _StreamedBasis, _Spent, int]:
    """What a sketching estimator ``method`` (Hutch++, XTrace) starts from, its arguments
    checked: the operator, the empty basis of its sketch (:func:`sketch_columns` columns, at
    most ``max_sketch``), the count of products spent, and the sketch's column count s."""
    op = as_operator(operator)
    _check_distribution(distribution)
    _positive_int("probes", probes, 4)
    _positive_int("probe_batch", probe_batch)
    size = sketch_columns(method, probes, op.shape[0])
    if max_sketch is not None:
        _positive_int("max_sketch", max_sketch)
        size = min(size, max_sketch)
    basis = _StreamedBasis(space_of(op), size, op.dtype, op.device)
    return op, basis, _Spent(on_step), size


def sketch_columns(method: str, matvecs: int, n_params: int) -> int:
    """Columns s of the sketch ``method`` holds with ``matvecs`` products on a P × P operator:
    min(max(1, ⌊matvecs/3⌋), P) for Hutch++, min(⌊matvecs/2⌋, max(P, 2)) for XTrace (two
    leave-one-out values at least), 0 for Hutchinson."""
    if method == "hutchpp":
        return min(max(1, matvecs // 3), n_params)
    if method == "xtrace":
        return min(matvecs // 2, max(n_params, 2))
    return 0


def sketch_bytes(method: str, matvecs: int, n_params: int, dtype: torch.dtype) -> int:
    """Bytes of the sketch ``method`` holds besides the products in flight: s × P values of
    ``dtype`` (:func:`sketch_columns`); 0 for Hutchinson."""
    element = torch.empty((), dtype=dtype).element_size()
    return sketch_columns(method, matvecs, n_params) * n_params * element


def _probe_blocks(
    count: int,
    probe_batch: int,
    distribution: str,
    generator: torch.Generator,
    op: LinearOperator,
) -> Iterator[Tensor]:
    """``count`` probes from ``generator``, ``probe_batch`` columns at a time, in the operator's
    dtype on its device (the same probes, in the same order, as one call of :func:`draw_probes`;
    this rank's slices of them when the operator's vectors are sliced)."""
    space = space_of(op)
    for start in range(0, count, probe_batch):
        block = space.probes(min(probe_batch, count - start), distribution, generator, op.dtype)
        yield block.to(device=op.device)


def _projected_trace(
    op: LinearOperator, basis: Tensor, probe_batch: int, counted: Callable[[int], None]
) -> float:
    """tr(QᵀAQ) = Σ_j q_jᵀ(A q_j) over blocks of ``probe_batch`` columns of Q (A·Q is never held
    whole), summed in float64."""
    total = 0.0
    for start in range(0, basis.shape[1], probe_batch):
        block = basis[:, start : start + probe_batch]
        forms = space_of(op).reduce((block * op.matmat(block)).sum(dim=0))
        total += float(forms.to(torch.float64).sum())
        counted(block.shape[1])
    return total


def _projected_matrix(
    op: LinearOperator, basis: Tensor, probe_batch: int, counted: Callable[[int], None]
) -> Tensor:
    """H = QᵀAQ (k × k, float64 on the CPU), one block of ``probe_batch`` columns of A·Q at a
    time."""
    columns = []
    for start in range(0, basis.shape[1], probe_batch):
        block = basis[:, start : start + probe_batch]
        columns.append(space_of(op).project(basis.t(), op.matmat(block)).to(torch.float64).cpu())
        counted(block.shape[1])
    if not columns:
        return torch.zeros((0, 0), dtype=torch.float64)
    return torch.cat(columns, dim=1)


def _sketched(
    method: str,
    estimate: tuple[float, float, tuple[float, float]],
    n_probes: int,
    matvecs: int,
    distribution: str,
    seed: int,
    sketch_bytes: int,
) -> TraceResult:
    """The result of a sketching estimator (Hutch++, XTrace) that spent its fixed budget:
    ``estimate`` is (value, standard error, 95% interval), formed as :data:`INTERVALS` says."""
    value, error, interval = estimate
    return TraceResult(
        estimate=value,
        standard_error=error,
        ci95=interval,
        n_probes=n_probes,
        matvecs=matvecs,
        method=method,
        distribution=distribution,
        interval=INTERVALS[method],
        seed=seed,
        rtol=None,
        stopped_by="n_probes",
        converged=True,
        sketch_bytes=sketch_bytes,
    )


def _exhausted(
    method: str,
    exact_part: float,
    matvecs: int,
    n_probes: int,
    distribution: str,
    seed: int,
    sketch_bytes: int,
) -> TraceResult:
    """The result of a sketch whose basis spans the whole space: tr(QᵀAQ) = tr(A)."""
    return _known(
        exact_part,
        n_probes=n_probes,
        matvecs=matvecs,
        method=method,
        distribution=distribution,
        interval=INTERVALS["exhausted"],
        seed=seed,
        stopped_by="exhausted",
        sketch_bytes=sketch_bytes,
    )


def _known(estimate: float, **fields: Any) -> TraceResult:
    """A trace known up to rounding: no standard error, an interval of width zero."""
    return TraceResult(
        estimate=estimate,
        standard_error=0.0,
        ci95=(estimate, estimate),
        rtol=None,
        converged=True,
        **fields,
    )


class _StreamedBasis:
    """An orthonormal basis Q of the span of columns added block by block, held in place.

    The basis lives in the rows of one preallocated (s, P) matrix (so each q_j is contiguous).
    A block B of new columns is projected out of the basis so far twice — B ← B − Q(QᵀB), block
    classical Gram–Schmidt with reorthogonalisation, which leaves B orthogonal to Q to rounding
    — then each column, in order, out of the columns the same block already added (twice), once
    more out of the whole basis if that removed more than half of it, and is normalised. A
    column whose norm falls to ``10·s·ε`` of its norm on arrival lies in the span already (up to
    the products' rounding) and is dropped: the rank k may end below s, and Q still spans the
    added columns. The coefficients make R (k × columns added, in echelon form) with
    Y = QR up to rounding: R is upper triangular when no column was dropped (positive diagonal).
    """

    def __init__(
        self, space: VectorSpace, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.space = space  # how inner products are summed (module docstring: sliced vectors)
        self._rows = torch.empty((capacity, space.size), dtype=dtype, device=device)
        self._coefficients = torch.zeros((capacity, capacity), dtype=dtype, device=device)
        self._floor = 10 * capacity * torch.finfo(dtype).eps
        self.rank = 0
        self.added = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the basis' storage (s × P values)."""
        return self._rows.numel() * self._rows.element_size()

    @property
    def columns(self) -> Tensor:
        """Q, a (P, k) view of the basis."""
        return self._rows[: self.rank].t()

    @property
    def triangle(self) -> Tensor:
        """R (k × columns added) with Y = QR."""
        return self._coefficients[: self.rank, : self.added]

    def extend(self, block: Tensor) -> None:
        """Add the columns of ``block`` (P × b; overwritten: it serves as working memory)."""
        width = block.shape[1]
        if self.added + width > self._rows.shape[0]:
            raise ValueError("more columns than the basis was sized for")
        arrived = self.space.column_norms(block)
        coefficients = self._coefficients[:, self.added : self.added + width]
        q = self.columns
        if self.rank:
            for _ in range(2):
                along = self.space.project(q.t(), block)
                block.sub_(q @ along)
                coefficients[: self.rank] += along
        first = self.rank
        for i in range(width):
            self._add_column(block[:, i], float(arrived[i]), coefficients[:, i], first)
        self.added += width

    def _add_column(self, column: Tensor, arrived: float, coefficients: Tensor, first: int) -> None:
        projected = float(self.space.norm(column))
        if self.rank > first:
            block_rows = self._rows[first : self.rank]
            for _ in range(2):
                along = self.space.project(block_rows, column)
                column.sub_(block_rows.t() @ along)
                coefficients[first : self.rank] += along
            norm = float(self.space.norm(column))
            if norm < 0.5 * projected and self.rank:
                rows = self._rows[: self.rank]
                along = self.space.project(rows, column)
                column.sub_(rows.t() @ along)
                coefficients[: self.rank] += along
                norm = float(self.space.norm(column))
        else:
            norm = projected
        if not (norm > self._floor * arrived) or not math.isfinite(norm):
            return
        self._rows[self.rank] = column / norm
        coefficients[self.rank] = norm
        self.rank += 1
