"""Result records of the curvature kernels (frozen dataclasses).

Every number a kernel reports travels with the record of how it was obtained: iterations,
Hessian-vector products spent, the residual or standard error at stop, and whether the stopping
rule was met. These records are converted to JSON by :func:`curvcal.results.to_jsonable`.
"""

from __future__ import annotations

from dataclasses import dataclass


class ConvergenceWarning(UserWarning):
    """An iterative estimate stopped at its iteration or probe budget before meeting its tolerance.

    The value is still returned (with ``converged=False``); the caller decides whether to fail.
    """


@dataclass(frozen=True)
class EigenResult:
    """One eigenvalue estimate of a symmetric operator ``A``.

    ``residual`` is the relative residual ‖Av − λv‖ / max(|λ|, √ε·‖A‖) of the returned unit vector
    ``v`` (ε: machine epsilon of the operator's dtype, ‖A‖ estimated by the largest |eigenvalue|
    seen), ``relative_change`` is |λ_t − λ_{t−1}| over the same denominator at the last step.
    For a value found by deflation, the residual is that of the deflated operator
    (I − UUᵀ)A(I − UUᵀ), U the vectors found before it. ``matvecs`` counts the operator products
    spent on this value; Lanczos values share one run, and each reports the run's total.
    ``converged`` is ``residual ≤ tol`` and ``relative_change ≤ tol``.
    """

    value: float
    iterations: int
    matvecs: int
    residual: float
    relative_change: float
    converged: bool


@dataclass(frozen=True)
class EigenSpectrum:
    """Extreme eigenvalues of a symmetric operator, in the order asked for.

    ``which="largest"``: λ1 ≥ λ2 ≥ … (largest algebraic first); ``which="smallest"``: the
    smallest algebraic first. ``method`` is ``"power"`` (with deflation for k > 1) or
    ``"lanczos"`` (full reorthogonalisation). When power iteration needed a shift (the dominant
    eigenvalue had the wrong sign for the end asked for), ``shift`` is the σ used — the values
    are those of ``A − σI`` plus σ — and ``dominant`` holds the unshifted dominant eigenvalues
    (largest in magnitude) found first. ``engine`` names the Hessian-vector-product engine that
    ran, when the operator was a :class:`~curvcal.curvature.hvp.HessianOperator`.
    """

    values: tuple[EigenResult, ...]
    method: str
    which: str
    tol: float
    matvecs: int
    converged: bool
    shift: float | None = None
    dominant: tuple[EigenResult, ...] | None = None
    engine: str | None = None

    @property
    def eigenvalues(self) -> tuple[float, ...]:
        """The eigenvalues alone, in the reported order."""
        return tuple(r.value for r in self.values)


@dataclass(frozen=True)
class TraceResult:
    """A stochastic estimate of tr(A) with its error bar.

    ``standard_error`` is s/√m over the m Hutchinson samples vᵀAv (for Hutch++, over the samples
    of the deflated remainder; the sketched part is exact given the sketch). ``ci95`` is
    estimate ± t(0.975, m−1)·standard_error (Student's t quantile). ``stopped_by`` is
    ``"n_probes"`` (fixed budget), ``"rtol"`` (adaptive stop: half-width ≤ rtol·|estimate|) or
    ``"max_probes"`` (adaptive budget exhausted, ``converged=False``).
    """

    estimate: float
    standard_error: float
    ci95: tuple[float, float]
    n_probes: int
    matvecs: int
    method: str
    distribution: str
    seed: int
    rtol: float | None
    stopped_by: str
    converged: bool
    engine: str | None = None

    @property
    def half_width(self) -> float:
        """Half the width of the 95% interval."""
        return (self.ci95[1] - self.ci95[0]) / 2.0


@dataclass(frozen=True)
class DensityResult:
    """Spectral density of A by stochastic Lanczos quadrature (SLQ).

    ``density[i]`` is the Gaussian-smoothed density at ``grid[i]``:
    ρ(t) = (1/R) Σ_r Σ_j w_rj · N(t; θ_rj, σ²), with θ_rj the Ritz values (``nodes``) of run r,
    w_rj the squared first components of the Ritz vectors (``weights``, Σ_j w_rj = 1), σ the
    ``bandwidth``. ρ integrates to 1 over the real line.
    """

    grid: tuple[float, ...]
    density: tuple[float, ...]
    nodes: tuple[tuple[float, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    runs: int
    steps: int
    bandwidth: float
    matvecs: int
    seed: int
    engine: str | None = None


@dataclass(frozen=True)
class LayerCurvature:
    """Curvature of one module's diagonal Hessian block (its own parameters, not its children's).

    ``lambda_max`` is the largest algebraic eigenvalue of the block, ``trace`` its trace estimate.
    """

    module: str
    parameters: tuple[str, ...]
    n_params: int
    lambda_max: EigenResult
    trace: TraceResult
    engine: str
