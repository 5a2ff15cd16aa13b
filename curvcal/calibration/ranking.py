"""Which calibration map to trust: rank stages on the evaluation split, with paired bootstrap
intervals of their differences.

Every stage (``uncalibrated`` and each fitted map) is scored on the same evaluation rows by a
proper score, NLL = mean -log p_y, and by top-label ECE (equal-width bins, the convention of
:mod:`curvcal.calibration.metrics`); Brier = mean Σ_k (p_k - 1[y = k])² is shown beside them.
Ranks: 1 for the smallest value, ties broken by stage order.

Paired bootstrap: resample b draws N row indices with replacement, *one* set of indices for all
stages, and is stored as the multiplicity w_b,i of each row (Σ_i w_b,i = N). Each difference of
a stage s from another stage o (the best, or uncalibrated) gets a 95 % interval of the
*population* difference, the difference the same maps would show on the whole distribution:

* NLL: the difference is the mean of the per-row differences d_i = nll_s,i - nll_o,i, and its
  interval Student's t one, d̄ ± t_{0.975, N-1} s_d/√N (the percentile interval of the paired
  resamples' (1/N) Σ_i w_b,i d_i when some d_i is not finite).
* ECE: with D_s = Σ_b |ĥ_s,b - h_s,b| the error norm of :mod:`curvcal.calibration.intervals`
  (each stage's own equal-width bins), the triangle inequality gives
  |(ECE_s - ECE_o) - (plug-in_s - plug-in_o)| ≤ D_s + D_o, so the interval is
  plug-in difference ± q with q the larger of the 95 % quantile of the paired resamples'
  D*_s + D*_o and the sum of each stage's 97.5 % quantile of its calibrated null draws (a union
  bound; the null draws see the errors a thin bin of a calibrated stage did not hold).

The percentile interval of the resampled difference ECE_w_b(s) - ECE_w_b(o) these replace
carries each plug-in's upward bias, which differs between a calibrated and a miscalibrated
stage: it held the population difference of a model and its perfect recalibration in 38 to 83
of 100 data sets (K = 2, N = 500 and 2,000), the t interval of the NLL difference in 94 to 97
where the percentile one held 89 to 95 (``benchmarks/bench_coverage.py --ranking``).
A stage whose interval contains 0 is *not distinguishable* from the other. The resamples come
from a private generator seeded by ``seed`` and are the same draws
:func:`curvcal.calibration.metrics.calibration_metrics` uses for its intervals.

Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from curvcal.calibration import bins as binning
from curvcal.calibration import intervals
from curvcal.calibration.intervals import upper_quantile
from curvcal.calibration.metrics import (
    INTERVAL_LEVEL,
    RESAMPLE_BATCH,
    TopLabel,
    binned_errors,
    percentile_interval,
    resample_weights,
)
from curvcal.errors import InputError

#: The scores stages are ranked by (a proper score first).
RANK_SCORES = ("nll", "ece")
#: The stage every other is also compared with.
REFERENCE = "uncalibrated"


@dataclass(frozen=True)
class Difference:
    """``value`` of a stage minus that of another (point estimate on all rows) and its paired
    bootstrap interval ``(low, high)`` (``None`` without resamples). ``distinguishable``: the
    interval excludes 0 (``None`` without an interval)."""

    value: float
    interval: tuple[float, float] | None

    @property
    def distinguishable(self) -> bool | None:
        if self.interval is None:
            return None
        low, high = self.interval
        return not (low <= 0.0 <= high)

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "interval": None if self.interval is None else list(self.interval),
            "distinguishable": self.distinguishable,
        }


@dataclass(frozen=True)
class RankedStage:
    """One stage's scores on the evaluation split, its ranks by NLL and by ECE, and its
    differences from the best stage (``vs_best``) and from uncalibrated
    (``vs_uncalibrated``, ``None`` for uncalibrated itself), each keyed by score."""

    stage: str
    nll: float
    ece: float
    brier: float
    rank: dict[str, int]
    vs_best: dict[str, Difference]
    vs_uncalibrated: dict[str, Difference] | None


@dataclass(frozen=True)
class SkippedMap:
    """A map ``--method all`` did not fit, and why."""

    stage: str
    reason: str


@dataclass(frozen=True)
class Ranking:
    """Stages ranked on the evaluation split (``stages`` in NLL rank order); ``best`` names the
    best stage by each score; ``skipped`` the maps that did not apply."""

    stages: tuple[RankedStage, ...]
    best: dict[str, str]
    n_bootstrap: int
    seed: int
    interval_level: float
    n_bins: int
    edges: str
    skipped: tuple[SkippedMap, ...] = ()
    scores: tuple[str, ...] = RANK_SCORES
    paired: bool = True


def _ece(top: TopLabel, index: torch.Tensor, n_bins: int, weights: torch.Tensor | None) -> float:
    return binned_errors(*binning.bin_sums(index, top.confidence, top.correct, n_bins, weights)).ece


def rank_stages(
    tops: Mapping[str, TopLabel],
    n_bins: int = 15,
    edges: str = "left",
    n_bootstrap: int = 0,
    seed: int = 0,
    skipped: Mapping[str, str] | None = None,
    resamples: torch.Tensor | None = None,
) -> Ranking:
    """Rank the stages of ``tops`` (stage -> per-row top-label quantities on the same
    evaluation rows, in report order, ``uncalibrated`` among them) by NLL and by ECE
    (``n_bins`` equal-width bins, ``edges``), with paired bootstrap intervals of each
    difference from ``n_bootstrap`` resamples seeded by ``seed``.

    ``resamples`` (B×N multiplicities, each row summing to N) replaces the seeded draws, so a
    hand-worked case can name its resamples. ``skipped``: stage -> why it was not fitted.
    """
    if not tops:
        raise InputError("ranking", "no stage to rank")
    names = list(tops)
    n = int(next(iter(tops.values())).nll.shape[0])
    if any(int(top.nll.shape[0]) != n for top in tops.values()):
        raise InputError("ranking", "the stages were measured on different numbers of rows")
    index = {
        stage: binning.equal_width_index(top.confidence, n_bins, edges)
        for stage, top in tops.items()
    }
    point = {
        stage: {"nll": float(top.nll.mean()), "ece": _ece(top, index[stage], n_bins, None)}
        for stage, top in tops.items()
    }
    draws = _draws(tops, index, n_bins, n, n_bootstrap, seed, resamples)
    rank = {
        score: {
            stage: position + 1
            for position, stage in enumerate(
                sorted(names, key=lambda s: (point[s][score], names.index(s)))
            )
        }
        for score in RANK_SCORES
    }
    best = {score: next(s for s, r in rank[score].items() if r == 1) for score in RANK_SCORES}

    def difference(stage: str, other: str, score: str) -> Difference:
        value = point[stage][score] - point[other][score]
        if draws is None:
            return Difference(value, None)
        if stage == other:
            return Difference(0.0, (0.0, 0.0))
        if score == "nll":
            paired = tops[stage].nll - tops[other].nll
            interval = intervals.mean_interval(paired) or percentile_interval(
                draws[stage]["nll"] - draws[other]["nll"]
            )
            return Difference(value, interval)
        resampled = upper_quantile(draws[stage]["deviation"] + draws[other]["deviation"])
        null = draws[stage]["null"][0] + draws[other]["null"][0]
        q = max(resampled, float(null))
        return Difference(value, (value - q, value + q))

    ranked = [
        RankedStage(
            stage=stage,
            nll=point[stage]["nll"],
            ece=point[stage]["ece"],
            brier=float(tops[stage].brier.mean()),
            rank={score: rank[score][stage] for score in RANK_SCORES},
            vs_best={score: difference(stage, best[score], score) for score in RANK_SCORES},
            vs_uncalibrated=None
            if stage == REFERENCE or REFERENCE not in tops
            else {score: difference(stage, REFERENCE, score) for score in RANK_SCORES},
        )
        for stage in names
    ]
    ranked.sort(key=lambda r: r.rank["nll"])
    n_draws = 0 if draws is None else (n_bootstrap if resamples is None else resamples.shape[0])
    return Ranking(
        stages=tuple(ranked),
        best=best,
        n_bootstrap=int(n_draws),
        seed=seed,
        interval_level=INTERVAL_LEVEL,
        n_bins=n_bins,
        edges=edges,
        skipped=tuple(SkippedMap(stage, reason) for stage, reason in (skipped or {}).items()),
    )


def _draws(
    tops: Mapping[str, TopLabel],
    index: Mapping[str, torch.Tensor],
    n_bins: int,
    n: int,
    n_bootstrap: int,
    seed: int,
    resamples: torch.Tensor | None,
) -> dict[str, dict[str, torch.Tensor]] | None:
    """Each stage's NLL and ECE on every resample (one set of weights for all stages)."""
    if resamples is not None:
        if resamples.ndim != 2 or resamples.shape[1] != n:
            raise InputError("resamples", f"must be B×{n} multiplicities")
        weights: Any = iter(resamples.to(torch.float64))
    elif n_bootstrap > 0:
        weights = resample_weights(n, n_bootstrap, seed)
    else:
        return None
    deviation = {
        stage: intervals.BinnedDeviation(
            index[stage], top.correct - top.confidence, n_bins, top.confidence
        )
        for stage, top in tops.items()
    }
    values: dict[str, dict[str, list[float]]] = {s: {"nll": [], "ece": []} for s in tops}
    drawn = 0
    for w in weights:
        drawn += 1
        for stage, top in tops.items():
            # a row not drawn adds nothing, an infinite -log p_y included (0·inf is nan)
            drawn_nll = torch.where(w > 0, w * top.nll, 0.0)
            values[stage]["nll"].append(float(drawn_nll.sum()) / n)
            values[stage]["ece"].append(_ece(top, index[stage], n_bins, w))
            deviation[stage].draw(w[None, :])
    null = torch.Generator().manual_seed(intervals.null_seed(seed))
    out: dict[str, dict[str, torch.Tensor]] = {}
    for stage, scores in values.items():
        out[stage] = {score: torch.tensor(v, dtype=torch.float64) for score, v in scores.items()}
        out[stage]["deviation"] = torch.cat(deviation[stage].l1)
        out[stage]["null"] = torch.tensor(
            [_null_quantile(tops[stage], index[stage], n_bins, drawn, null)]
        )
    return out


def _null_quantile(
    top: TopLabel, index: torch.Tensor, n_bins: int, n_resamples: int, generator: torch.Generator
) -> float:
    """The 97.5 % quantile of a stage's calibrated null draws ‖ĥ⁰‖₁ (its half of the union
    bound of an ECE difference; :class:`curvcal.calibration.intervals.BinnedDeviation`)."""
    n = int(top.confidence.shape[0])
    deviation = intervals.BinnedDeviation(
        index, top.correct - top.confidence, n_bins, top.confidence
    )
    total = intervals.null_draw_count(n_resamples, n)
    for start in range(0, total, RESAMPLE_BATCH):
        size = min(RESAMPLE_BATCH, total - start)
        deviation.draw_null(intervals.calibrated_outcomes(top.confidence, size, generator))
    draws = torch.cat(deviation.null)
    return float(torch.quantile(draws, 1.0 - (1.0 - INTERVAL_LEVEL) / 2))
