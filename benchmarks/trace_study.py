"""Trace-estimator variants at a fixed product budget, for ``bench_trace.py --study``.

Every variant is written against dense truth and spends exactly ``products`` operator products
(100 by default); all of them take their probes, in the order curvcal's estimators draw them,
from one pool of Rademacher columns drawn with ``curvcal.curvature.trace.draw_probes`` from
``torch.Generator().manual_seed(seed)``. Hutchinson, Hutch++ with s = ⌊m/3⌋ and XTrace therefore
give, seed for seed, the values of curvcal's own functions (checked by ``check_against_library``;
curvcal's XTrace interval is the jackknife one).

The study works in the eigenbasis of A = V diag(λ) Vᵀ: a probe ω becomes Vᵀω, a product is then
λ ⊙ x, and traces, norms and orthogonalisation are unchanged by the rotation. One P × P × m
product per seed (the rotation of the pool) replaces the several hundred products the variants
would need together, so 200 seeds of every variant cost about what 200 runs of one estimator cost.

Variants (m products in all, s sketch columns):

* ``hutchinson``: the mean of m values ωᵀAω, Student-t interval.
* ``hutchpp s``: Q = orth(AS) (s products), tr(QᵀAQ) (s products), Hutchinson with the m − 2s
  other probes on (I − QQᵀ)A(I − QQᵀ), Student-t interval given the sketch. With m − 2s = 0
  only the sketched part remains (biased low for a PSD matrix, no interval).
* ``hutchpp power s``: Q = orth(A·A·S) (2s products), then as Hutch++ with m − 3s probes.
* ``adaptive hutchpp``: the sketch grows by blocks of ``block`` columns while the predicted
  variance F²(r)/(m − 2r) of the deflated Hutchinson part falls, F²(r) = ‖(I − Q_rQ_rᵀ)A‖²_F
  estimated without bias by ‖(I − Q_rQ_rᵀ)A S_next‖²_F / block from the next block's images
  (as A-Hutch++, Persson, Cortinovis & Kressner 2022, estimates it; they fix an accuracy and
  minimise products, here the products are fixed and the variance is minimised). F² is
  extrapolated one block ahead with the decay per block of a geometric least-squares fit to
  its last ``window`` estimates. The choice depends on the
  sketch only, so the Student-t interval of the remaining probes stays valid given the sketch.
* ``xtrace``: Epperly, Tropp & Webber (2024), m/2 probes; interval Student-t over the
  leave-one-out values t_i, as the paper suggests (too narrow).
* ``xtrace jackknife``: the same estimate; variance by the jackknife over probes,
  (n − 1)/n Σ_j (T_(j) − T̄)² with T_(j) the XTrace estimate without probe j (from the
  leave-two-out sketches, small matrices only), interval ± t(0.975, n − 1)·√var. The
  Efron–Stein inequality makes this variance conservative in expectation for a symmetric
  statistic of independent probes. This is curvcal's XTrace interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy.special import stdtrit
from torch import Tensor

from curvcal.curvature.trace import draw_probes

Apply = Callable[[Tensor], Tensor]
NAN = float("nan")


@dataclass(frozen=True)
class Run:
    """One run of one variant: estimate, 95% interval (NaN when none) and sketch size."""

    estimate: float
    low: float
    high: float
    sketch: int = 0


def _t_quantile(df: int) -> float:
    return float(stdtrit(df, 0.975))


def _t_run(samples: Tensor, offset: float = 0.0, sketch: int = 0) -> Run:
    """offset + mean(samples) with the Student-t 95% interval of the mean."""
    count = samples.numel()
    mean = offset + float(samples.mean())
    half = _t_quantile(count - 1) * float(samples.std(correction=1)) / math.sqrt(count)
    return Run(mean, mean - half, mean + half, sketch)


def _deflated_hutchinson(
    apply: Apply, basis: Tensor, probes: Tensor, exact: float, sketch: int
) -> Run:
    if probes.shape[1] == 0:
        return Run(exact, NAN, NAN, sketch)
    deflated = probes - basis @ (basis.t() @ probes)
    images = apply(deflated)
    images = images - basis @ (basis.t() @ images)
    return _t_run((deflated * images).sum(dim=0), exact, sketch)


def hutchinson(apply: Apply, pool: Tensor, products: int) -> Run:
    probes = pool[:, :products]
    return _t_run((probes * apply(probes)).sum(dim=0))


def hutchpp(apply: Apply, pool: Tensor, products: int, sketch: int, power: int = 0) -> Run:
    """Hutch++ with ``sketch`` columns and ``power`` extra products per sketch column."""
    images = apply(pool[:, :sketch])
    for _ in range(power):
        images = apply(images)
    basis, _ = torch.linalg.qr(images)
    exact = float((basis * apply(basis)).sum())
    residual = products - (2 + power) * sketch
    if residual < 0:
        raise ValueError(f"sketch {sketch} with power {power} needs more than {products} products")
    probes = pool[:, sketch : sketch + residual]
    return _deflated_hutchinson(apply, basis, probes, exact, sketch)


def _decay(frobenius: list[float]) -> float:
    """The ratio per block of a geometric fit (least squares in log) to the last F² values."""
    logs = torch.tensor(frobenius, dtype=torch.float64).clamp_min(1e-300).log()
    steps = torch.arange(len(frobenius), dtype=torch.float64)
    steps = steps - steps.mean()
    return math.exp(float((steps * (logs - logs.mean())).sum() / (steps * steps).sum()))


def adaptive_hutchpp(
    apply: Apply,
    pool: Tensor,
    products: int,
    block: int = 5,
    min_probes: int = 20,
    window: int = 3,
) -> Run:
    """Hutch++ whose sketch size minimises the predicted variance F²(r)/(m − 2r) (see above).

    With the sketch's images Y = [Y_1 … Y_k] = QR (blocks of b columns), ‖(I − Q_iQ_iᵀ)Y_j‖²_F
    for j > i is the squared norm of R's rows past i·b in block j's columns, so every later block
    gives an unbiased estimate of F²(i·b); each F²(i·b) is their mean."""
    images = apply(pool[:, :block])
    while True:
        width = images.shape[1]
        _, triangle = torch.linalg.qr(images)
        blocks = width // block
        frobenius = [
            float((triangle[i * block :, (i + 1) * block :] ** 2).sum())
            / ((blocks - i - 1) * block)
            for i in range(blocks - 1)
        ]
        if products - 2 * (width + block) < min_probes:
            break
        if len(frobenius) >= window:
            ratio = _decay(frobenius[-window:])
            # variance now ∝ F²(r)/(m − 2r); one block more ∝ ratio·F²(r)/(m − 2r − 2b)
            if ratio * (products - 2 * width) >= products - 2 * (width + block):
                break
        images = torch.cat([images, apply(pool[:, width : width + block])], dim=1)
    basis, _ = torch.linalg.qr(images)
    exact = float((basis * apply(basis)).sum())
    probes = pool[:, width : products - width]
    return _deflated_hutchinson(apply, basis, probes, exact, width)


@dataclass(frozen=True)
class _Small:
    """XTrace's small matrices: R, H = sym(QᵀAQ), W = QᵀΩ, ω_iᵀAω_i, R⁻ᵀ."""

    triangle: Tensor
    projected: Tensor
    coordinates: Tensor
    diagonal: Tensor
    inverse_t: Tensor


def _xtrace_small(apply: Apply, probes: Tensor) -> _Small:
    images = apply(probes)
    basis, triangle = torch.linalg.qr(images)
    projected = basis.t() @ apply(basis)
    projected = (projected + projected.t()) / 2
    count = probes.shape[1]
    inverse_t = torch.linalg.solve_triangular(
        triangle.t(), torch.eye(count, dtype=triangle.dtype), upper=False
    )
    diagonal = (probes * images).sum(dim=0)
    return _Small(triangle, projected, basis.t() @ probes, diagonal, inverse_t)


def _values_without(small: _Small, drop: Tensor, keep: Tensor) -> Tensor:
    """Hutch++ values with probe i, sketch Ω without the columns ``drop[k]`` (each (pairs, c)),
    for i = keep[k]: tr(H) − tr(SᵀHS) + ω_iᵀAω_i − 2 r_iᵀd + dᵀHd, S an orthonormal basis of
    R⁻ᵀ's dropped columns, d = w_i − SSᵀw_i."""
    directions, _ = torch.linalg.qr(small.inverse_t[:, drop].permute(1, 0, 2))
    low = torch.trace(small.projected) - (directions * (small.projected @ directions)).sum(
        dim=(1, 2)
    )
    w = small.coordinates[:, keep].t()
    d = w - (directions @ (directions.transpose(1, 2) @ w.unsqueeze(2))).squeeze(2)
    correction = (
        small.diagonal[keep]
        - 2 * (small.triangle[:, keep].t() * d).sum(dim=1)
        + (d * (d @ small.projected)).sum(dim=1)
    )
    return low + correction


def xtrace_runs(apply: Apply, pool: Tensor, products: int) -> tuple[Run, Run]:
    """XTrace with its leave-one-out Student-t interval, and with the jackknife interval."""
    count = products // 2
    small = _xtrace_small(apply, pool[:, :count])
    index = torch.arange(count)
    values = _values_without(small, index.unsqueeze(1), index)
    plain = _t_run(values, sketch=count)
    first, second = torch.meshgrid(index, index, indexing="ij")
    pairs = first != second
    keep, drop = first[pairs], second[pairs]
    two_out = _values_without(small, torch.stack([keep, drop], dim=1), keep)
    table = torch.zeros(count, count, dtype=values.dtype)
    table[keep, drop] = two_out
    without = table.sum(dim=0) / (count - 1)  # T_(j): XTrace without probe j
    variance = (count - 1) / count * float(((without - without.mean()) ** 2).sum())
    half = _t_quantile(count - 1) * math.sqrt(variance)
    jackknife = Run(plain.estimate, plain.estimate - half, plain.estimate + half, count)
    return plain, jackknife


def variants(products: int) -> dict[str, Callable[[Apply, Tensor], Run]]:
    """The studied variants, each a function of (apply, pool) spending ``products`` products."""
    found: dict[str, Callable[[Apply, Tensor], Run]] = {
        "hutchinson": lambda a, p: hutchinson(a, p, products),
    }
    default = max(1, products // 3)
    for sketch in sorted({products // 4, default, int(0.4 * products), products // 2}):
        name = f"hutchpp s={sketch}" + (" (default)" if sketch == default else "")
        found[name] = lambda a, p, s=sketch: hutchpp(a, p, products, s)
    for sketch in (products // 5, products // 4):
        found[f"hutchpp power s={sketch}"] = lambda a, p, s=sketch: hutchpp(a, p, products, s, 1)
    found["adaptive hutchpp"] = lambda a, p: adaptive_hutchpp(a, p, products)
    return found


def run_seed(apply: Apply, pool: Tensor, products: int) -> dict[str, Run]:
    """Every variant on one pool of probes (already in the coordinates ``apply`` works in)."""
    runs = {name: function(apply, pool) for name, function in variants(products).items()}
    runs["xtrace"], runs["xtrace jackknife"] = xtrace_runs(apply, pool, products)
    return runs


def pool_of(n_params: int, products: int, seed: int) -> Tensor:
    """The probes curvcal's estimators draw with ``seed``, in their order (m columns)."""
    return draw_probes(n_params, products, "rademacher", torch.Generator().manual_seed(seed))
