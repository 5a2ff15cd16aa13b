"""Result records of the curvature kernels (frozen dataclasses).

Every number a kernel reports travels with the record of how it was obtained: iterations,
Hessian-vector products spent, the residual or standard error at stop, and whether the stopping
rule was met. These records are converted to JSON by :func:`curvcal.results.to_jsonable`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


class ConvergenceWarning(UserWarning):
    """An iterative estimate stopped at its iteration or probe budget before meeting its tolerance.

    The value is still returned (with ``converged=False``); the caller decides whether to fail.
    """


class TraceMethodWarning(UserWarning):
    """``method="auto"`` could take no Gauss–Newton part of the trace (a loss without a
    closed-form Hessian in the logits, train mode, too few products): the trace is Hutch++
    alone, and the message says why."""


@dataclass(frozen=True)
class EigenResult:
    """One eigenvalue estimate of a symmetric operator ``A``.

    ``residual`` is the relative residual ‖Av − λv‖ / max(|λ|, √ε·‖A‖) of the returned unit vector
    ``v`` (ε: machine epsilon of the operator's dtype, ‖A‖ estimated by the largest |eigenvalue|
    seen), ``relative_change`` is |λ_t − λ_{t−1}| over the same denominator at the last step.
    For a value found by deflation, the residual is that of the deflated operator
    (I − UUᵀ)A(I − UUᵀ), U the vectors found before it. ``matvecs`` counts the operator products
    spent on this value; Lanczos values share one run, and each reports the run's total.
    ``converged`` is ``residual ≤ tol`` and ``relative_change ≤ tol``, tol raised to the
    operator's precision floor when it is above it (:attr:`EigenSpectrum.tol_met`).
    ``status`` says which rule was met, so that no report calls a value converged beyond what
    was checked: ``"tol"`` (residual and change ≤ the tol asked for), ``"floor"`` (only ≤ the
    tol raised to the precision floor), ``"noise"`` (only ≤ the bound the products' stated
    error leaves in a residual), or, for a value that met none, what stopped the run
    (:attr:`EigenSpectrum.stopped_by`). :func:`convergence_text` puts it in words.
    """

    value: float
    iterations: int
    matvecs: int
    residual: float
    relative_change: float
    converged: bool
    status: str = "tol"


@dataclass(frozen=True)
class EigenSpectrum:
    """Extreme eigenvalues of a symmetric operator, in the order asked for.

    ``which="largest"``: λ1 ≥ λ2 ≥ … (largest algebraic first); ``which="smallest"``: the
    smallest algebraic first. ``method`` is ``"power"`` (with deflation for k > 1) or
    ``"lanczos"`` (partial reorthogonalisation). When power iteration needed a shift (the dominant
    eigenvalue had the wrong sign for the end asked for), ``shift`` is the σ used — the values
    are those of ``A − σI`` plus σ — and ``dominant`` holds the unshifted dominant eigenvalues
    (largest in magnitude) found first. ``engine`` names the Hessian-vector-product engine that
    ran, when the operator was a :class:`~curvcal.curvature.operator.HessianOperator`.
    ``stopped_by`` names what ended the run: ``"tol"`` (every value met the rule),
    ``"max_iter"``, ``"max_matvecs"`` (the products budget), ``"precision"`` (rounding in the
    products keeps the true residual above tol: the operator's precision floor),
    ``"exhausted"`` (Lanczos' basis spans the whole space) or ``"interrupted"`` (a progress
    hook stopped the run: ``values`` holds only the leading ones that had converged, fewer
    than asked for); ``limit`` says it in words.
    ``precision_floor``: the relative accuracy of the operator's products (a model in bfloat16
    or float16; 0 when the operator states none); the values met max(``tol``, floor),
    :attr:`tol_met`, and carry no more relative accuracy than the floor.
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
    stopped_by: str = "tol"
    limit: str = "tol"
    precision_floor: float = 0.0

    @property
    def tol_met(self) -> float:
        """The tolerance the stopping rule judged: max(tol, precision_floor)."""
        return max(self.tol, self.precision_floor)

    @property
    def eigenvalues(self) -> tuple[float, ...]:
        """The eigenvalues alone, in the reported order."""
        return tuple(r.value for r in self.values)


#: the stops of a run whose values did not converge, in the few words a table cell holds
_STOPS = {
    "max_iter": "budget spent",
    "max_matvecs": "budget spent",
    "precision": "precision floor",
    "exhausted": "basis exhausted",
}


def eigen_status(
    residual: float, change: float, converged: bool, asked: float, floor: float, stopped_by: str
) -> str:
    """:attr:`EigenResult.status` of a value with relative ``residual`` and ``change``:
    ``"tol"`` when both are ≤ the tol ``asked`` for, else ``"floor"`` when the value
    ``converged`` within max(asked, ``floor``), else ``"noise"`` when it converged within a
    bound raised by the products' stated error, else ``stopped_by`` (what ended the run)."""
    if residual <= asked and change <= asked:
        return "tol"
    if converged:
        return "floor" if floor > asked and residual <= floor and change <= floor else "noise"
    return stopped_by


def convergence_text(result: EigenResult, floor: float, dtype: str = "") -> str:
    """A table's word for ``result``'s convergence: ``yes`` only when its residual and change
    met the tol asked for; ``stopped at the bfloat16 floor (3.1e-02)`` when they met only the
    precision ``floor`` of products in ``dtype``; ``at the products' noise bound`` when they met
    only the bound the products' stated error allows; ``NO (budget spent)``, ``NO (precision
    floor)`` or ``NO (basis exhausted)`` otherwise."""
    if result.status == "tol":
        return "yes"
    if result.status == "floor":
        return f"stopped at the {dtype or 'precision'} floor ({floor:.2g})"
    if result.status == "noise":
        return "at the products' noise bound"
    return f"NO ({_STOPS.get(result.status, result.status)})"


#: trace methods whose value is exact up to rounding (no sampling error, so no ± and no 95%
#: interval: only an allowance for rounding)
EXACT_TRACE_METHODS = ("exact", "gauss-newton")


@dataclass(frozen=True)
class TraceResult:
    """A stochastic estimate of tr(A) with its error bar.

    ``standard_error`` is s/√m over the m Hutchinson samples vᵀAv (for Hutch++, over the samples
    of the deflated remainder; the sketched part is exact given the sketch). ``ci95`` is
    estimate ± t(0.975, m−1)·standard_error (Student's t quantile). ``stopped_by`` is
    ``"n_probes"`` (fixed budget), ``"rtol"`` (adaptive stop: half-width ≤ rtol·|estimate|) or
    ``"max_probes"`` (adaptive budget exhausted, ``converged=False``). ``method`` is
    ``"hutchinson"``, ``"hutchpp"``, ``"xtrace"`` (standard error by the jackknife over its probes)
    or ``"exact"``; ``interval`` says how the interval was formed. ``stopped_by`` is
    ``"exhausted"`` when a sketching estimator's basis spans the whole space (its trace is then
    exact up to rounding and the remaining products were not spent). ``sketch_bytes`` is the
    memory the estimator's sketch held besides the products in flight (s × P values; 0 for
    Hutchinson). ``parts``: for the split methods (``"gauss-newton+hutchpp"``,
    ``"gauss-newton+xtrace"``, :mod:`curvcal.curvature.residual`), the exact trace of the
    Gauss–Newton part (``"gauss_newton"``) and the estimate of the rest (``"residual"``).
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
    interval: str = ""
    sketch_bytes: int = 0
    parts: dict[str, float] | None = None

    @property
    def half_width(self) -> float:
        """Half the width of the 95% interval."""
        return (self.ci95[1] - self.ci95[0]) / 2.0

    @property
    def exact(self) -> bool:
        """Whether the value is exact up to rounding (:data:`EXACT_TRACE_METHODS`): its
        ``ci95`` is then a rounding allowance, not a 95% interval, and no report prints ±."""
        return self.method in EXACT_TRACE_METHODS


@dataclass(frozen=True)
class DensityResult:
    """Spectral density of A by stochastic Lanczos quadrature (SLQ).

    ``density[i]`` is the Gaussian-smoothed density at ``grid[i]``:
    ρ(t) = (1/R) Σ_r Σ_j w_rj · N(t; θ_rj, σ²), with θ_rj the Ritz values (``nodes``) of run r,
    w_rj the squared first components of the Ritz vectors (``weights``, Σ_j w_rj = 1), σ the
    ``bandwidth``. ρ integrates to 1 over the real line. ``reorthogonalised``: whether each run
    kept its Lanczos basis (full reorthogonalisation) or ran the three-term recurrence alone.
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
    reorthogonalised: bool = True


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


@dataclass(frozen=True)
class HessianAnalysis:
    """Everything one ``curvcal hessian`` run measured on one Hessian operator.

    ``lambda_max`` is the largest algebraic eigenvalue (``spectrum.values[0]``), ``lambda_min``
    the smallest (only when asked for; its record is ``smallest``). ``trace``, ``density`` and
    ``layers`` are ``None`` when not asked for. ``operator`` describes the Hessian measured and
    what it cost: ``loss`` (criterion), ``gamma``, ``mean_loss``, ``mode``, ``engine`` (the engine
    that ran), ``engine_requested``, ``engine_fallback`` (why ``auto`` left ``func``, or
    ``None``), ``cache_mode``, ``n_params``, ``n_samples``, ``probe_batch``, ``n_matvecs`` and
    ``n_data_passes`` (all stages, per-module blocks included). ``timings`` are wall seconds by
    stage (``setup`` counts and caches the data).
    """

    lambda_max: float
    lambda_min: float | None
    spectrum: EigenSpectrum
    smallest: EigenSpectrum | None
    trace: TraceResult | None
    density: DensityResult | None
    layers: list[LayerCurvature] | None
    operator: dict[str, Any]
    timings: dict[str, float]

    @property
    def unconverged(self) -> list[str]:
        """The estimates that stopped at their budget before meeting their tolerance."""
        failed = []
        for index, value in enumerate(self.spectrum.values):
            if not value.converged:
                failed.append(
                    f"eigenvalue {index + 1} (relative residual {value.residual:.3g}; "
                    f"stopped by {self.spectrum.stopped_by})"
                )
        if self.smallest is not None and not self.smallest.converged:
            failed.append(
                f"λmin (relative residual {self.smallest.values[0].residual:.3g}; "
                f"stopped by {self.smallest.stopped_by})"
            )
        if self.trace is not None and not self.trace.converged:
            failed.append(f"trace (stopped by {self.trace.stopped_by})")
        for layer in self.layers or []:
            if not layer.lambda_max.converged:
                failed.append(f"λmax of {layer.module}")
            if not layer.trace.converged:
                failed.append(f"trace of {layer.module}")
        return failed

    @property
    def converged(self) -> bool:
        """True when every iterative estimate met its stopping rule."""
        return not self.unconverged

    def to_dict(self) -> dict[str, Any]:
        """Fields, plus ``eigenvalues`` (the values alone) and ``converged``, for JSON."""
        body: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        body["eigenvalues"] = list(self.spectrum.eigenvalues)
        body["converged"] = self.converged
        return body
