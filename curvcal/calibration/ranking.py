"""Which calibration map to trust: rank stages on the evaluation split, with paired bootstrap
intervals of their differences.

Every stage (``uncalibrated`` and each fitted map) is scored on the same evaluation rows by a
proper score, NLL = mean -log p_y, and by top-label ECE (equal-width bins, the convention of
:mod:`curvcal.calibration.metrics`); Brier = mean Σ_k (p_k - 1[y = k])² is shown beside them.
Ranks: 1 for the smallest value, ties broken by stage order.

Paired bootstrap: resample b draws N row indices with replacement, *one* set of indices for all
stages, and is stored as the multiplicity w_b,i of each row (Σ_i w_b,i = N). For a stage s and
the best stage s*, the resampled difference is

    ΔNLL_b = (1/N) Σ_i w_b,i (nll_s,i - nll_s*,i),
    ΔECE_b = ECE_w_b(s) - ECE_w_b(s*)   (ECE of the rows weighted by w_b, each stage's own bins),

and its 95 % interval is the 2.5 and 97.5 percentiles of the B draws (linear interpolation).
Pairing cancels the variation both stages share (the same hard rows are drawn for both), so the
interval is much narrower than one built from separate intervals. A stage whose interval
contains 0 is *not distinguishable* from the best. The same is done against ``uncalibrated``.
The resamples come from a private generator seeded by ``seed`` and are the same draws
:func:`curvcal.calibration.metrics.calibration_metrics` uses for its intervals.

Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from curvcal.calibration import bins as binning
from curvcal.calibration.metrics import (
    INTERVAL_LEVEL,
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
        return Difference(value, percentile_interval(draws[stage][score] - draws[other][score]))

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
    values: dict[str, dict[str, list[float]]] = {s: {"nll": [], "ece": []} for s in tops}
    for w in weights:
        for stage, top in tops.items():
            values[stage]["nll"].append(float((w * top.nll).sum()) / n)
            values[stage]["ece"].append(_ece(top, index[stage], n_bins, w))
    return {
        stage: {score: torch.tensor(v, dtype=torch.float64) for score, v in scores.items()}
        for stage, scores in values.items()
    }
