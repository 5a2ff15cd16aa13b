"""A warm start for Lanczos: the top eigenvectors of the Hessian over a fraction of the data.

The Hessian of the mean loss over a sample S of the data, H_S = (1/|S|) Σ_{i∈S} ∇²ℓ_i, is an
unbiased estimate of H = (1/N) Σ_i ∇²ℓ_i, and where H's top eigenvalues stand apart from the
rest its top eigenvectors are close to H_S's. Lanczos on H_S to a loose tolerance costs
|S|/N of a full product per step; its top Ritz vector, the start of Lanczos on H, holds less of
the directions that Lanczos must otherwise remove from a random start. The full run's stopping
rule, residual and products are its own: a warm start changes how many products it takes,
never what it reports.

The sample: ⌈f·n⌉ of the n rows of this process's data (at least one), drawn without
replacement by a generator seeded with ``seed``, in their order in the data, each source batch
keeping its chosen rows (a batch with none is left out). Under torchrun each rank draws from its
own shard with the same rule and seed, and the products over the sample are summed across the
ranks as the full ones are, so every rank holds the same start vector.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from curvcal import rows
from curvcal.curvature.batches import Batch
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.progress import OnStep
from curvcal.curvature.results import ConvergenceWarning, EigenSpectrum
from curvcal.curvature.vectors import space_of
from curvcal.errors import SettingsError, setting_name
from curvcal.seeds import seeded_generator

#: The tolerance the warm stage runs to: its vector only starts the full run, which meets the
#: tolerance asked for on its own (``benchmarks/bench_warm_start.py`` measured 1e-2 and 1e-3).
WARM_TOL = 1e-2


def check_fraction(fraction: object) -> float:
    """``fraction`` as a float in (0, 1), or :class:`~curvcal.errors.SettingsError` naming the
    ``warm_start`` setting."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not math.isfinite(fraction)
        or not 0.0 < fraction < 1.0
    ):
        raise SettingsError(
            "warm_start",
            f"the fraction of the data must be a number strictly between 0 and 1, got {fraction!r}",
        )
    return float(fraction)


def sample_rows(n_rows: int, fraction: float, seed: int) -> Tensor:
    """The indices of ⌈``fraction``·``n_rows``⌉ rows (at least 1) of ``n_rows``, drawn without
    replacement by a CPU generator seeded with ``seed``, ascending."""
    count = min(n_rows, max(1, math.ceil(fraction * n_rows)))
    generator = seeded_generator(seed)
    return torch.randperm(n_rows, generator=generator)[:count].sort().values


def sample_batches(batches: Iterable[Batch], chosen: Tensor) -> list[Batch]:
    """The rows ``chosen`` (ascending indices over the rows of ``batches`` in order) as batches:
    each batch keeps its chosen rows, a batch with none is left out."""
    kept: list[Batch] = []
    offset = 0
    for x, y in batches:
        size = int(y.shape[0])
        inside = chosen[(chosen >= offset) & (chosen < offset + size)] - offset
        if inside.numel():
            kept.append((rows.take_rows(x, inside), y[inside]))
        offset += size
    return kept


@dataclass(frozen=True)
class WarmStart:
    """The warm stage's outcome: the start ``vector`` (unit, in the operator's vector space),
    the ``spectrum`` of the Hessian over the sample, its ``fraction`` asked for, the
    ``n_samples`` it held (summed over the ranks) and the ``n_matvecs`` products it made (on
    the sample's operator, not the full one's)."""

    vector: Tensor
    spectrum: EigenSpectrum
    fraction: float
    n_samples: int
    n_matvecs: int

    def as_dict(self) -> dict[str, object]:
        """The JSON record: the fraction, the samples, the warm stage's products (each over
        ``n_samples`` rows, so that they cost about n_samples/N of a full product), its λmax
        and whether it met its tolerance."""
        return {
            "fraction": self.fraction,
            "n_samples": self.n_samples,
            "n_matvecs": self.n_matvecs,
            "tol": self.spectrum.tol,
            "lambda_max": self.spectrum.values[0].value,
            "converged": self.spectrum.converged,
        }


def warm_start(
    operator: HessianOperator,
    fraction: float,
    k: int = 1,
    *,
    seed: int = 0,
    tol: float = WARM_TOL,
    max_basis: int | None = None,
    on_step: OnStep = None,
) -> WarmStart:
    """The start vector of Lanczos for the top ``k`` eigenvalues of ``operator``: the sum of
    the top ``k`` Ritz vectors of Lanczos on the Hessian of its model and loss over a
    ``fraction`` of its data (module docstring), to ``tol``, made unit (one vector with a
    share of each wanted direction).

    The sample's operator is built as ``operator`` was (same parameters, loss, engine, mode,
    cache and memory settings; the same sum across ranks). A model sharded with fully_shard is
    refused: its vectors are slices whose sample operator is not built here. ``on_step`` is
    called with the products the stage has made so far (on the sample's operator, whose
    count ``operator``'s does not hold), after each step and once at the end.
    """
    from curvcal.sharding import is_sharded  # as build_operator imports it: on first use

    fraction = check_fraction(fraction)
    if is_sharded(operator.model):
        raise SettingsError(
            "warm_start",
            "is not available for a model sharded with fully_shard",
            f"leave {setting_name('warm_start')} out",
        )
    chosen = sample_rows(operator.n_local, fraction, seed)
    part = operator.over_batches(sample_batches(operator.source_batches(), chosen))
    kept: list[Tensor] = []
    with warnings.catch_warnings():
        # the stage only starts the full run, which is judged on its own: whether the stage met
        # its loose tol is recorded (:meth:`WarmStart.as_dict`), not a warning about the result
        warnings.simplefilter("ignore", ConvergenceWarning)
        spectrum = eigenvalues(
            part,
            k,
            tol=tol,
            max_basis=max_basis,
            seed=seed,
            on_step=None if on_step is None else lambda _steps: on_step(part.total_matvecs),
            on_vectors=kept.append,
        )
    if on_step is not None:  # Lanczos's residual checks come after its last step
        on_step(part.total_matvecs)
    vector = kept[0].sum(dim=1)
    return WarmStart(
        vector / space_of(part).norm(vector),
        spectrum,
        fraction,
        part.n_samples,
        part.total_matvecs,
    )


__all__ = [
    "WARM_TOL",
    "WarmStart",
    "check_fraction",
    "sample_batches",
    "sample_rows",
    "warm_start",
]
