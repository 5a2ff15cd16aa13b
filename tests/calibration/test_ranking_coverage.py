"""Ranking's paired difference intervals hold the population difference as often as claimed.

Ground truth: a model of :mod:`curvcal.calibration.simulate` and its perfect recalibration on
the same rows (the top class's probability c replaced by the accuracy a(c)): the recalibrated
scores have population ECE 0 in every bin, so the population ECE difference is minus the
model's ECE, in closed form for a linear accuracy curve, and the NLL difference is known by
quadrature. The percentile interval of the resampled ECE difference these replace held it in
48 of 100 data sets here (over-confident, K = 2, N = 500).
"""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.calibration.metrics import TopLabel, calibration_metrics, top_label_of
from curvcal.calibration.ranking import rank_stages
from curvcal.calibration.simulate import binomial_se, models


def test_the_recalibrated_model_is_calibrated_and_its_nll_is_right() -> None:
    model = models(2)[0]  # over-confident: a(c) = 1/2 + 0.8 (c - 1/2)
    assert model.ece() == pytest.approx(0.2 * 0.5 * 5.0 / 6.5, abs=1e-10)  # (1 - s) E[c - 1/2]
    scores, labels = model.draw(400_000, seed=5)
    recalibrated = calibration_metrics(model.recalibrate(scores), labels, kind="probs")
    # sampling error at 400,000 rows: the plug-in ECE of a calibrated model is ~1e-3
    assert recalibrated.ece == pytest.approx(0.0, abs=2e-3)
    assert recalibrated.nll == pytest.approx(model.recalibrated_nll(), abs=3e-3)
    assert model.recalibrated_nll() < model.nll()  # recalibration lowers a proper score


def test_paired_differences_hold_the_population_difference() -> None:
    # 30 data sets, 50 resamples: a 95 % interval must hold in 0.95 - 3 SE (≥ 83 %)
    datasets = 30
    floor = 0.95 - 3 * binomial_se(0.95, datasets)
    model = models(2)[0]
    truth = {"ece": -model.ece(), "nll": model.recalibrated_nll() - model.nll()}
    held = dict.fromkeys(truth, 0)
    for seed in range(datasets):
        scores, labels = model.draw(500, seed=77_000 + seed)
        tops = {
            "uncalibrated": top_label_of(scores, labels, "probs"),
            "recalibrated": top_label_of(model.recalibrate(scores), labels, "probs"),
        }
        ranking = rank_stages(tops, n_bootstrap=50, seed=seed)
        stage = next(s for s in ranking.stages if s.stage == "recalibrated")
        assert stage.vs_uncalibrated is not None
        for score in truth:
            difference = stage.vs_uncalibrated[score]
            assert difference.interval is not None
            low, high = difference.interval
            assert low <= difference.value <= high
            held[score] += low <= truth[score] <= high
    for score, count in held.items():
        assert count / datasets >= floor, (score, count)


def test_an_infinite_nll_difference_falls_back_to_the_paired_percentiles() -> None:
    # a row with p_y = 0 under one stage: the t interval needs finite differences, so the
    # interval is the paired resamples' percentile one (nearest order statistic), here infinite
    as64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    zeros = as64([0.0, 0.0, 0.0])
    tops = {
        "uncalibrated": TopLabel(
            as64([0.9, 0.8, 0.7]), as64([1, 1, 0]), as64([0.1, 0.2, 1.2]), zeros
        ),
        "ts": TopLabel(as64([0.9, 0.8, 0.7]), as64([1, 1, 0]), as64([0.1, 0.2, math.inf]), zeros),
    }
    resamples = torch.tensor([[3.0, 0, 0], [0, 3, 0], [1, 1, 1]])
    ranking = rank_stages(tops, n_bins=1, resamples=resamples)
    ts = next(s for s in ranking.stages if s.stage == "ts")
    assert ts.vs_uncalibrated is not None
    nll = ts.vs_uncalibrated["nll"]
    assert nll.value == math.inf
    # resampled differences 0, 0, inf: percentiles 2.5 and 97.5 by the nearest draw
    assert nll.interval == (0.0, math.inf)
