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

Probes come from a CPU ``torch.Generator`` seeded by ``seed``, one probe at a time, then move to
the operator's device: the same seed gives the same probes on any device and with any
``probe_batch``. At most ``probe_batch`` probes are held at once.
"""

from __future__ import annotations

import math
import warnings

import torch
from scipy.special import stdtrit
from torch import Tensor

from curvcal.curvature.operators import LinearOperator, as_operator
from curvcal.curvature.results import ConvergenceWarning, TraceResult
from curvcal.errors import InputError
from curvcal.progress import OnStep

DISTRIBUTIONS = ("rademacher", "gaussian")
METHODS = ("hutchinson", "hutch++")


def draw_probes(n_params: int, count: int, distribution: str, generator: torch.Generator) -> Tensor:
    """``count`` probe vectors as columns of a (P, count) float64 CPU tensor, drawn one by one."""
    columns = []
    for _ in range(count):
        if distribution == "rademacher":
            column = (
                torch.randint(0, 2, (n_params,), generator=generator, dtype=torch.int64).to(
                    torch.float64
                )
                * 2
                - 1
            )
        else:
            column = torch.randn(n_params, generator=generator, dtype=torch.float64)
        columns.append(column)
    return torch.stack(columns, dim=1)


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
            "distribution",
            f"unknown probe distribution {distribution!r}",
            "choose 'rademacher' or 'gaussian'",
        )


def _quadratic_forms(op: LinearOperator, probes: Tensor) -> list[float]:
    """v_iᵀ A v_i for each column v_i of ``probes`` (CPU float64), computed on the operator's device."""
    vectors = probes.to(device=op.device, dtype=op.dtype)
    images = op.matmat(vectors)
    return [float(x) for x in (vectors * images).sum(dim=0).to(torch.float64).cpu()]


def hutchinson_trace(
    operator: LinearOperator | Tensor,
    n_probes: int = 100,
    *,
    rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    distribution: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    on_step: OnStep = None,
) -> TraceResult:
    """Hutchinson's estimate of tr(A) with a standard error and a 95% interval.

    Without ``rtol``: exactly ``n_probes`` probes (≥ 2). With ``rtol`` > 0: adaptive, between
    ``min_probes`` and ``max_probes`` probes (``n_probes`` is then ignored). ``on_step`` receives
    the number of probes used so far after each block.
    """
    op = as_operator(operator)
    _check_distribution(distribution)
    _positive_int("probe_batch", probe_batch)
    adaptive = rtol is not None
    if adaptive:
        if not (isinstance(rtol, int | float) and math.isfinite(rtol) and rtol > 0):
            raise InputError(
                "rtol", f"the relative tolerance must be a finite number > 0, got {rtol!r}"
            )
        _positive_int("min_probes", min_probes, 2)
        _positive_int("max_probes", max_probes, min_probes)
        budget = max_probes
    else:
        _positive_int("n_probes", n_probes, 2)
        budget = n_probes
    generator = torch.Generator().manual_seed(seed)
    n_params = op.shape[0]
    samples: list[float] = []
    stopped_by = "n_probes"
    while len(samples) < budget:
        block = min(probe_batch, budget - len(samples))
        samples += _quadratic_forms(op, draw_probes(n_params, block, distribution, generator))
        if on_step is not None:
            on_step(len(samples))
        if adaptive and len(samples) >= min_probes:
            estimate, _error, (low, high) = _interval(samples)
            if (high - low) / 2 <= rtol * abs(estimate):  # type: ignore[operator]
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
        distribution=distribution,
        seed=seed,
        rtol=float(rtol) if rtol is not None else None,
        stopped_by=stopped_by,
        converged=stopped_by != "max_probes",
    )
    if not result.converged:
        warnings.warn(
            ConvergenceWarning(
                f"hutchinson: the 95% half-width {result.half_width:.3g} is still above "
                f"rtol·|estimate| after {len(samples)} probes; raise max_probes or rtol"
            ),
            stacklevel=2,
        )
    return result


def hutchpp_trace(
    operator: LinearOperator | Tensor,
    matvecs: int = 99,
    *,
    distribution: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    on_step: OnStep = None,
) -> TraceResult:
    """Hutch++ estimate of tr(A) with ``matvecs`` operator products (≥ 4).

    A third (rounded down, at least 1) of the products builds the sketch Q = orth(A S), as many
    compute tr(QᵀAQ), and the rest (≥ 2) are Hutchinson probes of the deflated operator.
    ``n_probes`` in the result counts those remaining probes.
    """
    op = as_operator(operator)
    _check_distribution(distribution)
    _positive_int("matvecs", matvecs, 4)
    _positive_int("probe_batch", probe_batch)
    generator = torch.Generator().manual_seed(seed)
    n_params = op.shape[0]
    sketch_size = max(1, matvecs // 3)
    n_residual = matvecs - 2 * sketch_size

    def apply(columns: Tensor) -> Tensor:
        blocks = [
            op.matmat(columns[:, i : i + probe_batch])
            for i in range(0, columns.shape[1], probe_batch)
        ]
        return torch.cat(blocks, dim=1)

    sketch = draw_probes(n_params, sketch_size, distribution, generator).to(
        device=op.device, dtype=op.dtype
    )
    basis, _ = torch.linalg.qr(apply(sketch))
    exact_part = float(torch.trace(basis.t() @ apply(basis)))
    if on_step is not None:
        on_step(2 * sketch_size)
    samples: list[float] = []
    while len(samples) < n_residual:
        block = min(probe_batch, n_residual - len(samples))
        probes = draw_probes(n_params, block, distribution, generator).to(
            device=op.device, dtype=op.dtype
        )
        deflated = probes - basis @ (basis.t() @ probes)
        images = op.matmat(deflated)
        images = images - basis @ (basis.t() @ images)
        samples += [float(x) for x in (deflated * images).sum(dim=0).to(torch.float64).cpu()]
        if on_step is not None:
            on_step(2 * sketch_size + len(samples))
    remainder, error, (low, high) = _interval(samples)
    return TraceResult(
        estimate=exact_part + remainder,
        standard_error=error,
        ci95=(exact_part + low, exact_part + high),
        n_probes=n_residual,
        matvecs=matvecs,
        method="hutch++",
        distribution=distribution,
        seed=seed,
        rtol=None,
        stopped_by="n_probes",
        converged=True,
    )


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
    return TraceResult(
        estimate=total,
        standard_error=0.0,
        ci95=(total, total),
        n_probes=n_params,
        matvecs=n_params,
        method="exact",
        distribution="unit",
        seed=0,
        rtol=None,
        stopped_by="n_probes",
        converged=True,
    )


def trace_estimate(
    operator: LinearOperator | Tensor,
    n_probes: int = 100,
    *,
    method: str = "hutchinson",
    rtol: float | None = None,
    max_probes: int = 1000,
    min_probes: int = 10,
    distribution: str = "rademacher",
    seed: int = 0,
    probe_batch: int = 8,
    on_step: OnStep = None,
) -> TraceResult:
    """tr(A) by ``method`` ``"hutchinson"`` (``n_probes`` probes, or adaptive with ``rtol``) or
    ``"hutch++"`` (``n_probes`` operator products in all; ``rtol`` not supported)."""
    if method == "hutchinson":
        return hutchinson_trace(
            operator,
            n_probes,
            rtol=rtol,
            max_probes=max_probes,
            min_probes=min_probes,
            distribution=distribution,
            seed=seed,
            probe_batch=probe_batch,
            on_step=on_step,
        )
    if method == "hutch++":
        if rtol is not None:
            raise InputError("rtol", "the adaptive stop is only available with method 'hutchinson'")
        return hutchpp_trace(
            operator,
            n_probes,
            distribution=distribution,
            seed=seed,
            probe_batch=probe_batch,
            on_step=on_step,
        )
    raise InputError(
        "method", f"unknown trace method {method!r}", "choose 'hutchinson' or 'hutch++'"
    )
