"""Ranking stages with paired bootstrap intervals (curvcal.calibration.ranking), and
``--method all`` in the analysis kernel: a hand-worked resample case, pairing, a case where one
map is clearly best, and maps that do not apply."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from curvcal.calibration import intervals, registry
from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.metrics import TopLabel, calibration_metrics, resample_weights
from curvcal.calibration.ranking import Difference, rank_stages
from curvcal.errors import InputError
from curvcal.settings.calibration import CalibrationSettings


def _top(confidence: list[float], correct: list[float], nll: list[float]) -> TopLabel:
    as64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return TopLabel(as64(confidence), as64(correct), as64(nll), as64([0.0] * len(nll)))


def test_hand_worked_paired_bootstrap() -> None:
    """Two rows, one bin (ECE = |accuracy - mean confidence|), three named resamples.

    uncalibrated: nll (1, 3), confidence 0.9 on both, correct (1, 0): NLL 2, ECE 0.4.
    ts:           nll (0.5, 2), confidence 0.6 on both, correct (1, 0): NLL 1.25, ECE 0.1.
    NLL: the per-row differences uncalibrated - ts are (0.5, 1): mean 0.75, s = 0.5/√2, so
      the t interval is 0.75 ± t_{0.975, 1}·s/√2 = 0.75 ± 12.7062·0.25 = (-2.4266, 3.9266):
      two rows cannot tell the stages apart.
    ECE: one bin, ĥ = mean(correct - c): uncalibrated -0.4, ts -0.1. Resamples (2, 0), (0, 2),
      (1, 1) give ĥ* = (0.1, -0.9, -0.4) and (0.4, -0.6, -0.1), so D*_u + D*_ts =
      (0.5 + 0.5, 0.5 + 0.5, 0 + 0) = (1, 1, 0), whose 95 % quantile (linear, position 1.9)
      is 1. Calibrated null draws ‖ĥ⁰‖ = |mean(y⁰) - c|: at c = 0.9 the values 0.1, 0.4, 0.9
      with probabilities 0.81, 0.18, 0.01 (97.5 % quantile 0.4), at c = 0.6 the values 0.4,
      0.1, 0.6 with 0.36, 0.48, 0.16 (97.5 % quantile 0.6): the union bound is 1.0 as well.
      The interval is 0.3 ± 1 = (-0.7, 1.3): not distinguishable from the best.
    """
    tops = {
        "uncalibrated": _top([0.9, 0.9], [1, 0], [1.0, 3.0]),
        "ts": _top([0.6, 0.6], [1, 0], [0.5, 2.0]),
    }
    resamples = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    ranking = rank_stages(tops, n_bins=1, resamples=resamples)
    assert ranking.best == {"nll": "ts", "ece": "ts"} and ranking.n_bootstrap == 3
    ts, uncalibrated = ranking.stages  # NLL rank order
    assert (ts.stage, ts.rank, uncalibrated.rank) == (
        "ts",
        {"nll": 1, "ece": 1},
        {"nll": 2, "ece": 2},
    )
    assert (uncalibrated.nll, uncalibrated.ece) == pytest.approx((2.0, 0.4), abs=1e-15)
    assert (ts.nll, ts.ece) == pytest.approx((1.25, 0.1), abs=1e-15)
    half = 12.706204736174698 * 0.25  # t_{0.975, 1} · s/√N
    nll = uncalibrated.vs_best["nll"]
    assert nll.value == pytest.approx(0.75, abs=1e-15)
    assert nll.interval == pytest.approx((0.75 - half, 0.75 + half), abs=1e-9)
    assert nll.distinguishable is False
    ece = uncalibrated.vs_best["ece"]
    assert ece.value == pytest.approx(0.3, abs=1e-15)
    assert ece.interval == pytest.approx((-0.7, 1.3), abs=1e-12)
    assert ece.distinguishable is False
    # ts against uncalibrated: the same bound with the sign turned.
    assert ts.vs_uncalibrated is not None
    assert ts.vs_uncalibrated["nll"].interval == pytest.approx(
        (-0.75 - half, -0.75 + half), abs=1e-9
    )
    assert ts.vs_uncalibrated["ece"].interval == pytest.approx((-1.3, 0.7), abs=1e-12)
    assert uncalibrated.vs_uncalibrated is None
    assert ts.vs_best["nll"] == Difference(0.0, (0.0, 0.0))


def test_resamples_are_shared_by_every_stage() -> None:
    """Paired: a stage whose per-row NLL is another's plus a constant c differs from it by
    exactly c in every resample, so its interval is [c, c]. Unpaired draws would scatter it by
    the spread of the rows' NLL (here about ±0.1)."""
    generator = torch.Generator().manual_seed(1)
    n = 500
    nll = torch.rand(n, generator=generator, dtype=torch.float64) * 2
    confidence = 0.5 + 0.5 * torch.rand(n, generator=generator, dtype=torch.float64)
    correct = (torch.rand(n, generator=generator, dtype=torch.float64) < confidence).double()
    zeros = torch.zeros(n, dtype=torch.float64)
    tops = {
        "uncalibrated": TopLabel(confidence, correct, nll + 0.01, zeros),
        "ts": TopLabel(confidence, correct, nll, zeros),
        "vector": TopLabel(confidence, correct, nll, zeros),
    }
    ranking = rank_stages(tops, n_bins=10, n_bootstrap=50, seed=3)
    by_stage = {item.stage: item for item in ranking.stages}
    low, high = by_stage["uncalibrated"].vs_best["nll"].interval
    assert low == pytest.approx(0.01, abs=1e-12) and high == pytest.approx(0.01, abs=1e-12)
    assert by_stage["vector"].vs_best["nll"].interval == (0.0, 0.0)
    # the ECE difference's bound D_s + D_o is a sum over the two stages: it does not shrink
    # for identical stages, but it holds the difference 0 and is symmetric about it
    low, high = by_stage["vector"].vs_best["ece"].interval
    assert by_stage["vector"].vs_best["ece"].value == 0.0 and low == -high < 0.0
    assert ranking.best["nll"] == "ts"  # a tie goes to the earlier stage


def test_the_draws_are_the_metrics_own_resamples() -> None:
    """The ranking's resamples are those behind calibration_metrics' intervals (same seed):
    over resample_weights, the 95% quantile of the ECE's error norm
    D* = Σ_b |ĥ*_b − ĥ_b| (ĥ_b the mean of (1[correct] − c)·1{c in bin b}), written out here,
    and that of the calibrated null's ‖ĥ⁰‖₁, the larger being q, give the ECE's interval
    [ECE − q, ECE + q]."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 4, generator=generator, dtype=torch.float64)
    labels = torch.randint(4, (300,), generator=generator)
    metrics = calibration_metrics(logits, labels, bootstrap=40, seed=7)
    p = torch.softmax(logits, 1)
    confidence, prediction = p.max(1)
    residual = (prediction == labels).to(torch.float64) - confidence
    index = (torch.ceil(confidence * 15) - 1).clamp(0, 14).to(torch.int64)  # (a, b] bins
    mean = torch.bincount(index, weights=residual, minlength=15) / 300
    draws = torch.tensor(
        [
            float(
                (torch.bincount(index, weights=w * residual, minlength=15) / 300 - mean).abs().sum()
            )
            for w in resample_weights(300, 40, 7)
        ],
        dtype=torch.float64,
    )
    # the calibrated null draws: y⁰ ~ Bernoulli(c) from the generator of null_seed(7), 1000
    # draws in batches of 32 (a 95 % quantile of 40 draws is too noisy), ‖ĥ⁰‖₁ each
    null_generator = torch.Generator().manual_seed(intervals.null_seed(7))
    null = []
    for size in [32] * 31 + [8]:
        u = torch.rand(size, 300, generator=null_generator, dtype=torch.float64)
        outcomes = (u < confidence).to(torch.float64)
        sums = torch.zeros(size, 15, dtype=torch.float64).index_add_(
            1, index, outcomes - confidence
        )
        null.append((sums / 300).abs().sum(dim=1))
    q = max(float(torch.quantile(draws, 0.95)), float(torch.quantile(torch.cat(null), 0.95)))
    low, high = metrics.intervals["ece"]
    assert low == pytest.approx(max(0.0, metrics.ece - q), rel=1e-12, abs=1e-15)
    assert high == pytest.approx(metrics.ece + q, rel=1e-12)


def _under_confident(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(z), scores 0.3·z: under-confident (the best T is near 0.3)."""
    generator = torch.Generator().manual_seed(seed)
    z = 2.5 * torch.randn(n, k, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(z, 1), 1, generator=generator)[:, 0]
    return 0.3 * z, labels


def test_a_clearly_better_map_ranks_above_uncalibrated_with_a_real_difference() -> None:
    scores, labels = _under_confident(3000, 5, seed=0)
    settings = CalibrationSettings(method="all", bootstrap=100, seed=0, gammas=(0.0, 1.0))
    analysis = analyse_calibration(
        scores[:1500], labels[:1500], scores[1500:], labels[1500:], "logits", settings
    )
    ranking = analysis.ranking
    assert ranking is not None
    stages = {item.stage: item for item in ranking.stages}
    skipped = {item.stage for item in ranking.skipped}
    assert set(stages) == {"uncalibrated", *registry.MAPS} - skipped
    assert {"ts", "focal_ts", "vector", "matrix"} <= set(stages)
    # Every score is the evaluation-split metric of that stage (computed independently).
    for stage, metrics in analysis.evaluation.present():
        assert stages[stage].nll == pytest.approx(metrics.nll, rel=1e-12)
        assert stages[stage].ece == pytest.approx(metrics.ece, rel=1e-12, abs=1e-15)
        assert stages[stage].brier == pytest.approx(metrics.brier, rel=1e-12)
    # Uncalibrated NLL by hand (float64 log-softmax on the evaluation rows).
    logp = torch.log_softmax(scores[1500:], 1)
    assert stages["uncalibrated"].nll == pytest.approx(
        float(-logp.gather(1, labels[1500:, None]).mean()), rel=1e-12
    )
    uncalibrated = stages["uncalibrated"]
    # last by the proper score among the stages whose NLL is finite (histogram binning and
    # isotonic regression can give a label probability 0: an infinite NLL, ranked after)
    finite = [item for item in stages.values() if math.isfinite(item.nll)]
    assert uncalibrated.rank["nll"] == len(finite)
    assert uncalibrated.vs_best["nll"].distinguishable is True
    assert uncalibrated.vs_best["nll"].value > 0.1  # a large margin
    ts = stages["ts"]
    assert ts.vs_uncalibrated is not None
    low, high = ts.vs_uncalibrated["nll"].interval
    assert low < high < 0  # TS really is better than the raw scores
    assert ranking.stages[0].stage != "uncalibrated"


def test_without_bootstrap_the_ranking_has_no_intervals() -> None:
    scores, labels = _under_confident(600, 3, seed=1)
    settings = CalibrationSettings(method="all", gammas=(0.0,))
    ranking = analyse_calibration(
        scores[:300], labels[:300], scores[300:], labels[300:], "logits", settings
    ).ranking
    assert ranking is not None and ranking.n_bootstrap == 0
    for item in ranking.stages:
        assert all(d.interval is None and d.distinguishable is None for d in item.vs_best.values())


def test_a_map_that_does_not_apply_is_skipped_with_its_reason(monkeypatch) -> None:
    binary = dataclasses.replace(registry.MAPS["vector"], skip_reason=registry.binary_only)
    monkeypatch.setitem(registry.MAPS, "vector", binary)
    scores, labels = _under_confident(600, 3, seed=2)
    fit, evaluate = (scores[:300], labels[:300]), (scores[300:], labels[300:])
    analysis = analyse_calibration(
        *fit, *evaluate, "logits", CalibrationSettings(method="all", gammas=(0.0,))
    )
    assert analysis.ranking is not None
    skipped = {s.stage: s.reason for s in analysis.ranking.skipped}
    assert skipped["vector"] == "binary problems (K = 2) only; these scores have 3 classes"
    assert set(skipped) == {"vector", "platt", "beta", "laplace"}  # K = 3, and scores only
    assert analysis.fits.vector is None and analysis.evaluation.vector is None
    assert "vector" not in {item.stage for item in analysis.ranking.stages}
    with pytest.raises(InputError, match=r"binary problems \(K = 2\) only"):
        analyse_calibration(*fit, *evaluate, "logits", CalibrationSettings(method="vector"))


def test_skip_reasons() -> None:
    assert registry.applies_always(1, False) is None
    assert registry.binary_only(2, False) is None and registry.binary_only(10, True)
    assert registry.needs_model(10, True) is None and registry.needs_model(10, False)
    for name in ("ts", "focal_ts", "vector", "matrix"):
        assert registry.MAPS[name].skip_reason is registry.applies_always
    kept, skipped = registry.applicable_stages(registry.fitted_stages("all"), 4, False)
    assert {"ts", "focal_ts", "vector", "matrix"} <= set(kept)
    assert sorted([*kept, *skipped]) == sorted(registry.MAPS)
