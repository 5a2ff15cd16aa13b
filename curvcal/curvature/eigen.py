"""Extreme eigenvalues of a symmetric operator: power iteration with deflation, and Lanczos.

Both accept any :class:`~curvcal.curvature.operators.LinearOperator` or a dense symmetric tensor.

Stopping rule (both methods): a value λ with unit vector v has converged when the relative
residual ‖Av − λv‖ / d ≤ tol **and** the relative change |λ_t − λ_{t−1}| / d ≤ tol, with
d = max(|λ|, √ε·‖A‖) — ε the machine epsilon of the operator's dtype and ‖A‖ estimated by the
largest |eigenvalue| seen — so that an exactly zero eigenvalue can converge. The residual judged
is the one reported, measured with a product. A value that does not converge is returned with
``converged=False`` and a :class:`~curvcal.curvature.results.ConvergenceWarning` naming the limit
that stopped the run (``EigenSpectrum.stopped_by``: ``max_iter``, ``max_matvecs``, the
operator's precision floor, or Lanczos' basis spanning the whole space).

Precision floor. An operator whose products are rounded more coarsely than its vectors (a model
in bfloat16 or float16: :mod:`curvcal.curvature.precision`) states the relative accuracy of a
product as ``precision_floor``; no residual can fall below it, so the rule is judged against
max(tol, floor) instead of tol, and the spectrum records the floor (``precision_floor``).

Product error. An operator whose products are not linear in v but are good to a stated bound,
‖computed A·v − A·v‖ ≤ b·‖A‖·‖v‖ (``product_error`` = b; central differences of gradients on a
sharded model), leaves noise in a measured residual that no iteration removes: for a Ritz
vector y = Σ_j s_j q_j (‖s‖ = 1) of m products the noise is at most Σ|s_j|·b‖A‖ + b‖A‖ ≤
(√m + 1)·b‖A‖ (the basis' products and the check's own), and for one power step 2·b‖A‖. Each
value's residual is judged against max(tol, that noise / d); its change still against tol.

Orders: ``which="largest"`` returns λ1 ≥ λ2 ≥ … ≥ λk, the largest *algebraic* eigenvalues;
``which="smallest"`` returns the k smallest, smallest first.

* Power iteration (Golub & Van Loan §8.2.1) finds the eigenvalue largest in magnitude, at the rate
  |λ2/λ1|; further values come by deflation: iterating with (I − UUᵀ)A(I − UUᵀ), U the vectors
  already found, whose residual is the one reported for those values.
  When the dominant remaining value has the wrong sign for the end asked for (a negative one for
  ``largest``), it is the far end of the spectrum (λmin), σ; the search goes on with A − σI, whose
  dominant eigenvalues are the wanted end shifted by −σ, still orthogonally to the values already
  found. The spectrum reports σ and the unshifted values (``dominant``).
* Lanczos with partial reorthogonalisation (Golub & Van Loan §10.1; Simon 1984; Ghorbani et al.
  2019) builds a Krylov basis one product per step, orthogonalised in float64 (stored in float32
  when the products are float32) against the two latest vectors, and against the whole basis
  when Simon's estimate of the lost orthogonality asks for it
  (:mod:`curvcal.curvature.orthogonality`), with a float64 Rayleigh–Ritz step whatever the
  operator's dtype; once the k wanted Ritz pairs meet the rule by their estimated residual,
  one block product measures the true residuals, and iteration goes on if those fail (see
  :func:`lanczos`). Both ends of the spectrum come directly, without a shift.

Vectors: whole (P values) or, for an operator that states a sliced
:class:`~curvcal.curvature.vectors.VectorSpace` (a model sharded over ranks), each rank's slice;
every inner product and norm is then summed over the ranks, and the eigenvectors handed to
``on_vectors`` are the rank's slices (:meth:`~curvcal.curvature.vectors.VectorSpace.whole`
gathers them; :meth:`~curvcal.curvature.vectors.VectorSpace.parameter_rows` collects them a
parameter at a time).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from curvcal.curvature.krylov import RESTART_COLUMNS, KrylovBasis, operator_basis
from curvcal.curvature.operators import LinearOperator, as_operator, product_into
from curvcal.curvature.orthogonality import OrthogonalityEstimate
from curvcal.curvature.precision import effective_tol, float64_advice
from curvcal.curvature.progress import OnStep, Stopped
from curvcal.curvature.results import (
    ConvergenceWarning,
    EigenResult,
    EigenSpectrum,
    eigen_status,
)
from curvcal.curvature.vectors import VectorSpace, space_of
from curvcal.errors import InputError
from curvcal.seeds import seeded_generator

#: Receives the P×k unit eigenvectors found, columns in the order of the values (this rank's
#: slices of them for a sliced vector space).
OnVectors = Callable[[Tensor], None] | None

METHODS = ("power", "lanczos")
WHICH = ("largest", "smallest")
#: ``partial``: Simon's ω estimate decides when a vector is cleared of the whole basis;
#: ``full``: every vector is (the reference, and what a thick restart goes on with)
REORTHOGONALISATIONS = ("partial", "full")
DEFAULT_TOL = 1e-4
DEFAULT_POWER_ITER = 1000
DEFAULT_LANCZOS_STEPS = 300


def _floor(op: LinearOperator) -> float:
    """The relative accuracy of ``op``'s products (0 for an operator that states none)."""
    return float(getattr(op, "precision_floor", 0.0))


def _product_error(op: LinearOperator) -> float:
    """b, the bound ‖computed A·v − A·v‖ ≤ b·‖A‖·‖v‖ ``op`` states (0 for none)."""
    return float(getattr(op, "product_error", 0.0))


def _allowed(
    tol: float, noise: float, values: list[float], scale: float, dtype: torch.dtype
) -> list[float]:
    """The residual each value is judged against: max(tol, ``noise``·‖A‖ / d) (module docstring)."""
    return [max(tol, _relative(noise * scale, value, scale, dtype)) for value in values]


def check_k(k: object, n_params: int) -> None:
    """Refuse ``k`` unless it is an integer in [1, ``n_params``], naming ``k``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError("k", f"the number of eigenvalues must be a positive integer, got {k!r}")
    if k > n_params:
        raise InputError(
            "k",
            f"asked for {k} eigenvalues of a {n_params}×{n_params} operator",
            f"use k ≤ {n_params}",
        )


def _check_common(op: LinearOperator, k: int, tol: float, max_iter: int | None, which: str) -> None:
    check_k(k, op.shape[0])
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol > 0):
        raise InputError("tol", f"the tolerance must be a finite number > 0, got {tol!r}")
    if max_iter is not None and (
        isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1
    ):
        raise InputError("max_iter", f"must be a positive integer, got {max_iter!r}")
    if which not in WHICH:
        raise InputError(
            "which", f"unknown end of the spectrum {which!r}", "choose 'largest' or 'smallest'"
        )


def _random_unit(op: LinearOperator, generator: torch.Generator) -> Tensor:
    """A Gaussian start vector drawn on the CPU (same vector on every device), normalised."""
    space = space_of(op)
    vector = space.normal(generator, op.dtype).to(device=op.device)
    return vector / space.norm(vector)


def _start_vector(op: LinearOperator, start: Tensor) -> Tensor:
    """``start`` as Lanczos' first vector q_1 (before it is made unit): a float64 copy on the
    operator's device, after checking that it is a vector of the operator's space (this rank's
    slice for a sliced space), finite and nonzero; :class:`~curvcal.errors.InputError` naming
    ``start`` otherwise."""
    space = space_of(op)
    if not isinstance(start, Tensor) or start.dim() != 1 or start.shape[0] != space.size:
        shape = tuple(start.shape) if isinstance(start, Tensor) else type(start).__name__
        raise InputError(
            "start",
            f"the start vector must be a 1-D tensor of the operator's {space.size} values, "
            f"got {shape}",
        )
    if start.is_complex() or start.dtype == torch.bool:
        raise InputError("start", f"the start vector must hold real numbers, got {start.dtype}")
    wide = start.detach().to(device=op.device, dtype=torch.float64)
    # summed over the ranks, so that every rank refuses a start some rank's slice spoils
    if float(space.reduce((~torch.isfinite(wide)).sum().to(torch.float64))) > 0:
        raise InputError("start", "the start vector holds NaN or Inf values")
    if float(space.norm(wide)) == 0.0:
        raise InputError("start", "the start vector is zero", "give a nonzero vector")
    return wide


def _relative(amount: float, value: float, scale: float, dtype: torch.dtype) -> float:
    """amount / max(|value|, √ε·scale); 0 for 0/0 and inf for x/0."""
    denominator = max(abs(value), math.sqrt(torch.finfo(dtype).eps) * scale)
    if denominator == 0.0:
        return 0.0 if amount == 0.0 else math.inf
    return amount / denominator


def _orthogonalise(vector: Tensor, basis: list[Tensor], space: VectorSpace) -> Tensor:
    """Remove the components along orthonormal ``basis`` (twice: classical Gram-Schmidt is unstable once)."""
    for _ in range(2):
        for b in basis:
            vector = vector - space.dot(b, vector) * b
    return vector


def _power_one(
    op: LinearOperator,
    shift: float,
    found: list[Tensor],
    tol: float,
    max_iter: int,
    scale: float,
    generator: torch.Generator,
    on_step: OnStep,
) -> tuple[EigenResult, Tensor]:
    """Dominant eigenvalue of (I − UUᵀ)(A − σI)(I − UUᵀ), U the ``found`` vectors; returns λ + σ."""
    space = space_of(op)
    vector = _orthogonalise(_random_unit(op, generator), found, space)
    vector = vector / space.norm(vector)
    previous: float | None = None
    value, residual, change = 0.0, math.inf, math.inf
    iterations = 0
    noise = 2 * _product_error(op)  # the product's error and the measured vector's
    allowed = tol
    for iterations in range(1, max_iter + 1):
        # the deflated operator's image: its residual is not floored by the found vectors' error
        image = _orthogonalise(op.matvec(vector) - shift * vector, found, space)
        rayleigh = float(space.dot(vector, image))
        value = rayleigh + shift
        scale = max(scale, abs(value), abs(rayleigh))
        residual = _relative(float(space.norm(image - rayleigh * vector)), value, scale, op.dtype)
        change = (
            math.inf
            if previous is None
            else _relative(abs(value - previous), value, scale, op.dtype)
        )
        previous = value
        if on_step is not None:
            on_step(iterations)
        allowed = _allowed(tol, noise, [value], scale, op.dtype)[0]
        if residual <= allowed and change <= tol:
            break
        norm = space.norm(image)
        if float(norm) > 0.0:
            vector = image / norm
    converged = residual <= allowed and change <= tol
    return EigenResult(value, iterations, iterations, residual, change, converged), vector


def power_iteration(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
    on_vectors: OnVectors = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues by power iteration with deflation.

    ``max_iter`` (default 1000) bounds the iterations spent on each value and on each pass.
    ``on_vectors`` receives the P×k unit eigenvectors, columns in the order of the values (each
    rank's slices of them for a sliced vector space).

    When ``on_step`` raises :class:`~curvcal.curvature.progress.Stopped`, it is raised again
    carrying the values that converged before it, deflated ones included (the leading ones in
    the order found, each met the rule; ``None`` when none did), as a spectrum with
    ``stopped_by="interrupted"`` (:func:`interrupted_spectrum`).
    """
    op = as_operator(operator)
    _check_common(op, k, tol, max_iter, which)
    floor = _floor(op)
    asked, tol = tol, effective_tol(tol, floor)
    iterations = DEFAULT_POWER_ITER if max_iter is None else max_iter
    generator = seeded_generator(seed)
    found: list[Tensor] = []
    results: list[EigenResult] = []
    passes: list[EigenResult] = []  # every unshifted result, for the record
    scale = 0.0
    used = 0
    shift: float | None = None
    while len(results) < k:
        try:
            result, vector = _power_one(
                op,
                0.0 if shift is None else shift,
                found,
                tol,
                iterations,
                scale,
                generator,
                on_step,
            )
        except Stopped as stop:
            leading = []
            for done in results:  # a deflated value is only as good as the ones before it
                if not done.converged:
                    break
                leading.append(_with_status(done, asked, floor, "interrupted"))
            leading.sort(key=lambda r: r.value, reverse=which == "largest")
            kept = interrupted_spectrum(leading, "power", which, asked, used, floor, k, shift)
            raise Stopped(kept, stop.stage) from None
        scale = max(scale, abs(result.value))
        used += result.matvecs
        wrong_sign = result.value < 0 if which == "largest" else result.value > 0
        if shift is None:
            passes.append(result)
            if wrong_sign:
                # The dominant remaining value is the far end (λmin for "largest"): A − σI has the
                # wanted end as its dominant eigenvalue; the values found so far stay valid.
                shift = result.value
                continue
        found.append(vector)
        results.append(result)
    order = sorted(range(k), key=lambda i: results[i].value, reverse=which == "largest")
    final = [_with_status(results[i], asked, floor, "max_iter") for i in order]
    if on_vectors is not None:
        on_vectors(torch.stack([found[i] for i in order], dim=1))
    spectrum = EigenSpectrum(
        values=tuple(final),
        method="power",
        which=which,
        tol=float(asked),
        matvecs=used,
        converged=all(r.converged for r in final),
        shift=shift,
        dominant=tuple(passes) if shift is not None else None,
        stopped_by="tol" if all(r.converged for r in final) else "max_iter",
        precision_floor=floor,
        limit=(
            "tol"
            if all(r.converged for r in final)
            else f"max_iter: all {iterations} iterations allowed per value were spent (raise max_iter)"
        ),
    )
    _warn_unconverged(spectrum)
    return spectrum


def lanczos(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    max_matvecs: int | None = None,
    max_basis: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
    on_vectors: OnVectors = None,
    reorthogonalisation: str = "partial",
    start: Tensor | None = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues by Lanczos with partial reorthogonalisation.

    The Krylov basis q_1, q_2, … is orthogonalised in float64 whatever the operator's dtype;
    only the products run in the operator's dtype. Each image A q_m is cleared of q_m and
    q_{m−1} (the three-term recurrence), and of the whole basis (block Gram–Schmidt with a DGKS
    second pass, :class:`~curvcal.curvature.krylov.KrylovBasis`) only when Simon's ω estimate
    of the lost orthogonality exceeds min(√ε, tol), ε the products' relative error, and on the
    step after (``reorthogonalisation="partial"``,
    :class:`~curvcal.curvature.orthogonality.OrthogonalityEstimate`): the basis stays
    semi-orthogonal, which keeps the Ritz values as accurate as full reorthogonalisation
    (Simon 1984), and a step reads 4 rows of P values instead of 2m + 4.
    ``reorthogonalisation="full"`` clears every image of the whole basis (the reference). With float32 products the vectors are
    stored in float32, each rounded once after it is orthonormalised in float64 (every dot
    summed in float64): half the memory, and a representation error (6e-8 relative) below the
    float32 products' own. The
    coefficients h_ij = q_iᵀ(A q_j) of the orthogonalisation (the amounts removed, 0 for the
    older vectors on a step that is not reorthogonalised) form the projected matrix H_m, with
    A Q_m = Q_m H_m + h_{m+1,m} q_{m+1} e_mᵀ to rounding whatever the orthogonality
    (tridiagonal in exact arithmetic), and the Ritz
    pairs (θ, s) are those of its symmetric part: a float64 Rayleigh–Ritz on the Krylov basis,
    so float32 products give Ritz values free of float32 rounding in the recurrence. For
    y = Q_m s the products as computed satisfy A y − θ y = Q_m K s + h_{m+1,m} s_m q_{m+1}, K the
    skew part of H_m, so the estimated residual ‖K s‖ ⊕ |h_{m+1,m} s_m| includes the asymmetry
    that rounding leaves in the products and the amounts a reorthogonalisation removed.

    Stopping: once the k wanted pairs meet the rule (estimated residual and change ≤ tol), their
    true residuals ‖A y − θ y‖ are measured with one block product of k vectors, and the run stops
    only if those meet the rule too. Otherwise the gap between the true and the estimated
    residual (true² ≈ estimate² + noise²) is the products' rounding noise: iteration goes on
    until the estimate leaves room for it, or stops with ``stopped_by="precision"`` when the noise
    alone reaches tol (the operator's precision floor). Other stops: ``"max_iter"`` (steps,
    default min(P, max(300, 2k))), ``"max_matvecs"`` (products, the k verification products included)
    and ``"exhausted"`` (the basis spans the whole space; ``relative_change`` is then 0). An
    invariant subspace found early restarts the basis with a fresh random vector orthogonal to
    it, so repeated eigenvalues are found with their multiplicity. Every value reports the run's
    steps and products; the residual reported is always the measured (true) one.

    When ``on_step`` raises :class:`~curvcal.curvature.progress.Stopped`, it is raised again
    carrying the leading wanted values that had converged (:func:`_converged_at_stop`: their
    estimates met the rule and one block product of that many vectors verified their true
    residuals), or ``None`` when none had.

    ``start``: the first vector q_1 instead of a Gaussian draw from ``seed`` (a warm start:
    :mod:`curvcal.curvature.warm_start`), this rank's slice of it for a sliced vector space;
    a 1-D real tensor of the space's size, finite and nonzero, else
    :class:`~curvcal.errors.InputError` naming ``start``. It is copied, never modified. A
    Krylov method sees only the space a start spans: one that is exactly an eigenvector (or
    lies in an invariant subspace) of other values than the wanted ones converges to those
    (with a true residual of 0, nothing to tell them apart); a random start does so with
    probability 0, a start from the Hessian over a sample of the data only by accident.

    Memory: the basis holds one vector of P values per step (float32 for float32 products, plus
    three float64 vectors: the work vector and the two latest rows widened, which a step clears
    against; float64 otherwise). ``max_basis`` (at least
    k + 2, or P) bounds it: when the basis reaches that many vectors, it restarts thickly
    (Wu & Simon 2000; Stathopoulos, Saad & Wu 1998) — its l best Ritz vectors y_i = Q_m s_i at
    the wanted end (l = max(k + 1, ⌊max_basis/2⌋), at most max_basis − 2) and the latest
    Lanczos vector q_{m+1} become the new basis, in place
    (:meth:`~curvcal.curvature.krylov.KrylovBasis.restart`), and the projected matrix becomes
    the arrowhead [[diag θ, b], [bᵀ, ·]] with b_i = h_{m+1,m} s_{m,i}, the coupling of each
    kept pair to q_{m+1}, so that A y_i = θ_i y_i + b_i q_{m+1}. Iteration goes on from
    q_{m+1}; by interlacing, a wanted Ritz value never moves away from the end it approaches,
    and the rule and residuals are those above. After a thick restart every image is cleared of
    the whole basis (the arrowhead couples it to every kept vector, and the ω recurrence holds
    for a tridiagonal matrix only): at most 2·max_basis rows a step.
    A restarted run spends more products than an unbounded one (the discarded directions are
    rebuilt only in part); None (the default), or a bound of at least P, never restarts.
    """
    op = as_operator(operator)
    _check_common(op, k, tol, max_iter, which)
    if reorthogonalisation not in REORTHOGONALISATIONS:
        raise InputError(
            "reorthogonalisation",
            f"unknown kind {reorthogonalisation!r}",
            f"choose one of {', '.join(REORTHOGONALISATIONS)}",
        )
    if max_matvecs is not None and (
        isinstance(max_matvecs, bool) or not isinstance(max_matvecs, int) or max_matvecs < 2 * k
    ):
        raise InputError(
            "max_matvecs",
            f"must be an integer ≥ 2·k = {2 * k} (k steps and k verification products), "
            f"got {max_matvecs!r}",
        )
    floor = _floor(op)
    asked, tol = tol, effective_tol(tol, floor)
    n_params = op.shape[0]
    if max_basis is not None and (
        isinstance(max_basis, bool)
        or not isinstance(max_basis, int)
        or max_basis < min(k + 2, n_params)
    ):
        raise InputError(
            "max_basis",
            f"must be an integer ≥ k + 2 = {k + 2} (k kept Ritz vectors, the latest Lanczos "
            f"vector and one more) or ≥ P = {n_params}, got {max_basis!r}",
        )
    rows = None if max_basis is None or max_basis >= n_params else max_basis
    given = None if start is None else _start_vector(op, start)
    steps = max(DEFAULT_LANCZOS_STEPS, 2 * k) if max_iter is None else max(max_iter, k)
    # an unbounded basis spans the whole space after P steps; a restarted one never does
    steps_allowed = min(n_params, steps) if rows is None else steps
    generator = seeded_generator(seed)
    bound = _product_error(op)

    def noisy(size: int) -> float:
        """(√m + 1)·b: the products' noise in a measured residual, in units of ‖A‖."""
        return (math.sqrt(size) + 1) * bound

    wide = torch.float64
    basis, buffer = operator_basis(op, max_rows=rows)
    product = product_into(op)
    # the float64 draw _random_unit rounds to the operator's dtype, made unit in float64: a
    # float32 norm over 10⁵ entries is off by ~1e-5, which the two-term clearing of the next
    # vector would leave in it (a whole-basis pass removed it again)
    first = basis.draft()
    if given is None:
        basis.space.normal_into(first, generator)
    else:
        first.copy_(given)
    basis.commit(float(basis.space.norm(first)))
    orthogonality = (
        OrthogonalityEstimate(
            max(torch.finfo(op.dtype).eps, floor, bound),
            # semi-orthogonality (√ε), and no more than tol: the residual a Ritz vector keeps
            # from the lost orthogonality is about ω·‖A‖
            min(math.sqrt(torch.finfo(op.dtype).eps), tol),
        )
        if reorthogonalisation == "partial"
        else None
    )
    columns = steps_allowed if rows is None else rows - 1
    projected = torch.zeros(columns + 1, columns, dtype=wide)
    size = 0  # vectors of the basis the projected matrix covers (all but the latest)
    scale = 0.0
    previous: list[float] | None = None
    changes: list[float] = [math.inf] * k
    room = 1.0  # the estimate must fall to room·tol before a (next) verification
    failed_checks = 0
    verified: _Verification | None = None
    stopped_by = "max_iter"
    steps = 0
    used = 0
    while True:
        if steps >= steps_allowed:
            stopped_by = "exhausted" if size == n_params else "max_iter"
            break
        if max_matvecs is not None and used + 1 + k > max_matvecs:
            stopped_by = "max_matvecs"
            break
        product(basis.latest(buffer), basis.next_row())  # A·q_m straight into the next row
        # cleared there of the latest two vectors, or of the whole basis after a thick restart
        _image, coefficients = basis.clear_next(whole=orthogonality is None)
        steps += 1
        size += 1
        used += 1
        beta = basis.remainder_norm  # ‖image‖, measured as it was cleared
        if orthogonality is not None and orthogonality.step(float(coefficients[-1]), beta):
            # semi-orthogonality lost (Simon's estimate): clear it of the whole basis, the
            # amounts removed kept in the projected matrix so that A Q_m = Q_m H_m + β q eᵀ
            # still holds to rounding (their asymmetry enters the residual estimate ‖K s‖)
            coefficients += basis.reorthogonalise()
            beta = basis.remainder_norm
            orthogonality.reorthogonalised(beta)
        projected[:size, size - 1] = coefficients.cpu()
        projected[size, size - 1] = beta
        ritz, ritz_vectors, skew = _rayleigh_ritz(projected[:size, :size])
        scale = max(scale, float(ritz.abs().max()))
        if on_step is not None:
            try:
                on_step(steps)
            except Stopped as stop:
                kept = _converged_at_stop(
                    op, basis, (ritz, ritz_vectors, skew), beta, previous, k, which,
                    (tol, asked, floor, scale, noisy(size)), (steps, used),
                )  # fmt: skip
                raise Stopped(kept, stop.stage) from None
        if size >= k:
            wanted = _wanted(size, k, which)
            values = [float(ritz[i]) for i in wanted]
            # |h_{m+1,m} s_m|: what more steps reduce; ‖K s‖: the products' asymmetry, which they do not
            krylov = [
                _relative(abs(beta * float(ritz_vectors[-1, i])), float(ritz[i]), scale, op.dtype)
                for i in wanted
            ]
            asymmetry = [
                _relative(
                    float((skew @ ritz_vectors[:, i]).norm()), float(ritz[i]), scale, op.dtype
                )
                for i in wanted
            ]
            estimates = [math.hypot(a, b) for a, b in zip(krylov, asymmetry, strict=True)]
            if previous is not None:
                changes = [
                    _relative(abs(v - p), v, scale, op.dtype)
                    for v, p in zip(values, previous, strict=True)
                ]
            previous = values
            if size == n_params:
                changes = [0.0] * k
            passed = all(e <= room * tol for e in estimates) and all(c <= tol for c in changes)
            # the Krylov part has converged but the asymmetry alone exceeds tol: rounding in the
            # products is the limit, which one verification confirms
            floored = all(r <= room * tol for r in krylov) and any(a > tol for a in asymmetry)
            # the estimate carries some of the noise too, so it may never reach room·tol: check
            # again anyway after a while (failed checks are bounded, so is the work)
            overdue = verified is not None and steps >= verified.steps + max(5, verified.steps // 2)
            if passed or floored or overdue or size == n_params:
                if max_matvecs is not None and used + k > max_matvecs:
                    stopped_by = "max_matvecs"
                    break
                verified = _verify(op, basis, ritz, ritz_vectors, wanted, scale, steps)
                used += k
                allowed = _allowed(tol, noisy(size), values, scale, op.dtype)
                if all(r <= a for r, a in zip(verified.residuals, allowed, strict=True)) and all(
                    c <= tol for c in changes
                ):
                    stopped_by = "tol"
                    break
                if size == n_params:
                    stopped_by = "precision"
                    break
                noise = max(
                    math.sqrt(max(r * r - e * e, 0.0))
                    for r, e in zip(verified.residuals, estimates, strict=True)
                )
                failed_checks += 1
                room = min(room, math.sqrt(max(1.0 - (noise / tol) ** 2, 0.0)) / 2)
                if noise >= tol or room < 1e-3 or failed_checks >= _MAX_FAILED_CHECKS:
                    stopped_by = "precision"
                    break
        if beta <= 100 * torch.finfo(op.dtype).eps * scale:
            # invariant subspace: restart orthogonally to it
            basis.extend(_random_unit(op, generator))
            norm = basis.remainder_norm
            if norm == 0.0:
                stopped_by = "exhausted"
                break
            projected[size, size - 1] = 0.0
            basis.commit(norm)
            if orthogonality is not None:
                orthogonality.restart()
        else:
            basis.commit(beta)
        if rows is not None and len(basis) == rows:
            size = _thick_restart(basis, projected, size, k, which, rows)
            # the arrowhead couples the next image to every kept Ritz vector, and the ω
            # recurrence holds for a tridiagonal T only: full reorthogonalisation from here on,
            # at most 2·max_basis rows read per step
            orthogonality = None
    wanted = _wanted(size, k, which)
    ritz, ritz_vectors, _skew = _rayleigh_ritz(projected[:size, :size])
    if stopped_by == "exhausted":
        changes = [0.0] * k
    if verified is None or verified.steps != steps:
        verified = _verify(op, basis, ritz, ritz_vectors, wanted, scale, steps)
        used += k
    if on_vectors is not None:  # y = Q_m s, as verified (no product)
        vectors = basis.combine(ritz_vectors[:, wanted], dtype=op.dtype)
        on_vectors(vectors.div_(basis.space.column_norms(vectors)))
    allowed = _allowed(tol, noisy(size), [float(ritz[i]) for i in wanted], scale, op.dtype)
    results = []
    for column, index in enumerate(wanted):
        residual = verified.residuals[column]
        change = changes[column]
        converged = residual <= allowed[column] and change <= tol
        status = eigen_status(residual, change, converged, asked, floor, stopped_by)
        results.append(
            EigenResult(float(ritz[index]), steps, used, residual, change, converged, status)
        )
    converged = all(r.converged for r in results)
    spectrum = EigenSpectrum(
        values=tuple(results),
        method="lanczos",
        which=which,
        tol=float(asked),
        matvecs=used,
        converged=converged,
        stopped_by="tol" if converged else stopped_by,
        limit=_limit("tol" if converged else stopped_by, steps, max_matvecs, op.dtype),
        precision_floor=floor,
    )
    _warn_unconverged(spectrum)
    return spectrum


def interrupted_spectrum(
    values: list[EigenResult],
    method: str,
    which: str,
    asked: float,
    matvecs: int,
    floor: float,
    k: int,
    shift: float | None = None,
) -> EigenSpectrum | None:
    """The spectrum an interrupted run keeps: ``values``, each converged, of the k asked for
    (``None`` when there are none); ``stopped_by`` is ``"interrupted"``."""
    if not values:
        return None
    return EigenSpectrum(
        values=tuple(values),
        method=method,
        which=which,
        tol=float(asked),
        matvecs=matvecs,
        converged=True,
        shift=shift,
        stopped_by="interrupted",
        limit=f"interrupted (Ctrl-C) with {len(values)} of the {k} values asked for converged",
        precision_floor=floor,
    )


def _converged_at_stop(
    op: LinearOperator,
    basis: KrylovBasis,
    pairs: tuple[Tensor, Tensor, Tensor],
    beta: float,
    previous: list[float] | None,
    k: int,
    which: str,
    rule: tuple[float, float, float, float, float],
    spent: tuple[int, int],
) -> EigenSpectrum | None:
    """What a Lanczos run stopped at step ``steps`` keeps: the leading wanted Ritz values (λ1,
    λ2, … in report order) whose estimated residual ‖K s‖ ⊕ |h_{m+1,m} s_m| and change since
    the last step meet ``tol``, then of those the leading ones whose true residual, measured
    with one block product, meets the rule a finished run applies. ``pairs``: the Ritz values,
    vectors and skew part of the projected matrix at this step; ``rule``: tol (raised to the
    floor), the tol asked, the floor, the scale ‖A‖ and the products' noise in a residual;
    ``spent``: steps and products so far."""
    ritz, ritz_vectors, skew = pairs
    tol, asked, floor, scale, noise = rule
    steps, used = spent
    size = ritz.shape[0]
    wanted = _wanted(size, min(k, size), which)
    values = [float(ritz[i]) for i in wanted]
    changes: list[float] = []
    for column, index in enumerate(wanted):
        krylov = _relative(
            abs(beta * float(ritz_vectors[-1, index])), values[column], scale, op.dtype
        )
        asymmetry = _relative(
            float((skew @ ritz_vectors[:, index]).norm()), values[column], scale, op.dtype
        )
        if previous is None or column >= len(previous):
            break
        change = _relative(abs(values[column] - previous[column]), values[column], scale, op.dtype)
        if math.hypot(krylov, asymmetry) > tol or change > tol:
            break
        changes.append(change)
    if not changes:
        return None
    leading = wanted[: len(changes)]
    check = _verify(op, basis, ritz, ritz_vectors, leading, scale, steps)
    allowed = _allowed(tol, noise, values[: len(leading)], scale, op.dtype)
    kept = []
    for column, residual in enumerate(check.residuals):
        if residual > allowed[column]:
            break
        status = eigen_status(residual, changes[column], True, asked, floor, "interrupted")
        kept.append(
            EigenResult(
                values[column], steps, used + len(leading), residual, changes[column], True, status
            )
        )
    return interrupted_spectrum(kept, "lanczos", which, asked, used + len(leading), floor, k)


def _with_status(result: EigenResult, asked: float, floor: float, stopped_by: str) -> EigenResult:
    """``result`` with its :attr:`~EigenResult.status` against the tol ``asked`` for."""
    status = eigen_status(
        result.residual, result.relative_change, result.converged, asked, floor, stopped_by
    )
    return dataclasses.replace(result, status=status)


def _thick_restart(
    basis: KrylovBasis, projected: Tensor, size: int, k: int, which: str, rows: int
) -> int:
    """Restart a full basis (``size`` vectors and the latest) on its l best Ritz vectors at the
    wanted end and the latest vector (see :func:`lanczos`), in place; rewrites ``projected`` to
    the arrowhead matrix of the new basis and returns l, the new ``size``."""
    ritz, ritz_vectors, _skew = _rayleigh_ritz(projected[:size, :size])
    kept = min(rows - 2, max(k + 1, rows // 2))
    chosen = _wanted(size, kept, which)
    coefficients = ritz_vectors[:, chosen]
    coupling = float(projected[size, size - 1]) * coefficients[-1]
    basis.restart(coefficients)
    projected.zero_()
    projected[:kept, :kept] = torch.diag(ritz[chosen])
    projected[kept, :kept] = coupling
    # column ``kept`` (the latest vector's image) is written by the next step; its entries above
    # the diagonal, q_iᵀ A q_{m+1} = b_i up to rounding, meet ``coupling`` in the symmetric part
    return kept


# Verifications that may fail on rounding noise before the run is declared at its precision floor.
_MAX_FAILED_CHECKS = 4


@dataclass(frozen=True)
class _Verification:
    """True relative residuals of the wanted Ritz pairs at ``steps`` Lanczos steps."""

    steps: int
    residuals: list[float]


def _verify(
    op: LinearOperator,
    basis: KrylovBasis,
    ritz: Tensor,
    ritz_vectors: Tensor,
    wanted: list[int],
    scale: float,
    steps: int,
) -> _Verification:
    """‖A y − θ y‖ / max(|θ|, √ε·‖A‖) of the wanted Ritz pairs, with one block product.

    y = Q_m s is formed in the operator's dtype (the vector the product multiplies, so the
    residual is that of the vector as used), and ‖A y − θ y‖ is summed in float64 a piece at a
    time: besides the product, the check holds the k vectors and their images, never a float64
    copy of them (at P = 10⁷ that spares two 80 MB vectors per value)."""
    vectors = basis.combine(ritz_vectors[:, wanted], dtype=op.dtype)  # y = Q_m s
    vectors.div_(basis.space.column_norms(vectors))
    images = op.matmat(vectors)  # only read: an operator may hand back a tensor it keeps
    values = ritz[wanted].to(device=vectors.device)
    squares = torch.zeros(len(wanted), dtype=torch.float64, device=vectors.device)
    for begin in range(0, vectors.shape[0], RESTART_COLUMNS):
        end = begin + RESTART_COLUMNS
        piece = images[begin:end].to(torch.float64) - vectors[begin:end].to(torch.float64) * values
        squares += piece.square().sum(dim=0)
    amounts = basis.space.reduce(squares).sqrt().tolist()
    residuals = [
        _relative(amount, float(value), scale, op.dtype)
        for amount, value in zip(amounts, values, strict=True)
    ]
    return _Verification(steps, residuals)


def _rayleigh_ritz(projected: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Ritz values (ascending) and vectors of the symmetric part of the projected matrix, and
    its skew part (the asymmetry of the products as computed), all float64."""
    symmetric = (projected + projected.t()) / 2
    values, vectors = torch.linalg.eigh(symmetric)
    return values, vectors, (projected - projected.t()) / 2


def _limit(stopped_by: str, steps: int, max_matvecs: int | None, dtype: torch.dtype) -> str:
    """The limit that stopped a run, in words, for messages."""
    if stopped_by == "max_iter":
        return f"max_iter: all {steps} steps allowed were spent (raise max_iter)"
    if stopped_by == "max_matvecs":
        return f"max_matvecs: the budget of {max_matvecs} products was spent (raise max_matvecs)"
    if stopped_by == "precision":
        name = str(dtype).removeprefix("torch.")
        return (
            f"the {name} precision floor: rounding in the products keeps the true residual "
            f"above tol (loosen tol{float64_advice(dtype, ', or compute in float64')})"
        )
    if stopped_by == "exhausted":
        return "the Krylov basis spanning the whole space"
    return "tol"


def _wanted(size: int, k: int, which: str) -> list[int]:
    """Indices of the k wanted Ritz values among ``size`` ascending ones, in report order."""
    return list(range(size - 1, size - 1 - k, -1)) if which == "largest" else list(range(k))


def _warn_unconverged(spectrum: EigenSpectrum) -> None:
    if not spectrum.converged:
        worst = max(r.residual for r in spectrum.values)
        warnings.warn(
            ConvergenceWarning(
                f"{spectrum.method}: eigenvalues did not meet tol={spectrum.tol_met:g} "
                f"(worst relative residual {worst:.3g}); stopped by {spectrum.limit}"
            ),
            stacklevel=3,
        )


def eigenvalues(
    operator: LinearOperator | Tensor,
    k: int = 1,
    *,
    method: str | None = None,
    which: str = "largest",
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    max_basis: int | None = None,
    seed: int = 0,
    on_step: OnStep = None,
    on_vectors: OnVectors = None,
    start: Tensor | None = None,
) -> EigenSpectrum:
    """The k largest (or smallest) algebraic eigenvalues of a symmetric operator.

    ``method``: ``"lanczos"`` (the default for every k) or ``"power"``. Lanczos (partial
    reorthogonalisation, :func:`lanczos`) spends one product per step, as power iteration does, and its Krylov
    space contains every power iterate, so it never needs more products; power iteration
    converges at the rate |λ₂/λ₁| and stalls on indefinite Hessians whose most negative
    eigenvalue is close to λmax in magnitude (common in trained networks).
    ``seed`` seeds the CPU generator of the start vectors. ``max_basis`` bounds Lanczos' basis
    (thick restarts, see :func:`lanczos`); power iteration keeps no basis and ignores it.
    ``start``: Lanczos' first vector instead of a random one (a warm start, such as the top
    eigenvector of the Hessian over part of the data); power iteration refuses it.
    """
    if method is None:
        method = "lanczos"
    if method not in METHODS:
        raise InputError(
            "method", f"unknown eigenvalue method {method!r}", "choose 'power' or 'lanczos'"
        )
    if method == "power":
        if start is not None:
            raise InputError(
                "start", "a start vector is taken by Lanczos only", "use method='lanczos'"
            )
        return power_iteration(
            operator,
            k,
            which=which,
            tol=tol,
            max_iter=max_iter,
            seed=seed,
            on_step=on_step,
            on_vectors=on_vectors,
        )
    return lanczos(
        operator,
        k,
        which=which,
        tol=tol,
        max_iter=max_iter,
        max_basis=max_basis,
        seed=seed,
        on_step=on_step,
        on_vectors=on_vectors,
        start=start,
    )
