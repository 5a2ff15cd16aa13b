"""Confidences equal in exact arithmetic but a few units of rounding apart: the tie-aware
metrics (AdaECE, KS, Kuiper, the risk–coverage curve, AURC, E-AURC) treat them as one tie group,
and the top-label maps give rows with the same f(c) the same confidence bit for bit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from curvcal.calibration import ties
from curvcal.calibration.binning import bin_of, fit_histogram
from curvcal.calibration.isotonic import fit_isotonic
from curvcal.calibration.metrics import calibration_metrics, top_label_of
from curvcal.calibration.univariate import top_label_log_probabilities

F64 = torch.float64
U = 2.0**-53
#: every number calibration_metrics reports that a tie group could move
NUMBERS = ("ece", "adaece", "classwise_ece", "ks_ce", "kuiper", "mmce", "smooth_ece", "aurc",
           "e_aurc", "nll", "brier")  # fmt: skip


def nudged(value: float, steps: int) -> float:
    """``value`` moved ``steps`` representable numbers up (down when negative)."""
    target = math.inf if steps > 0 else -math.inf
    for _ in range(abs(steps)):
        value = math.nextafter(value, target)
    return value


def logprobs_with_confidence(confidence: list[float], k: int = 3) -> torch.Tensor:
    """log of rows whose class 0 has probability c and the rest share 1 − c evenly."""
    c = torch.tensor(confidence, dtype=F64)[:, None]
    return torch.log(torch.cat([c, ((1 - c) / (k - 1)).expand(-1, k - 1)], 1))


def assert_same_metrics(got: object, expected: object, tol: float = 1e-12) -> None:
    for name in NUMBERS:
        assert getattr(got, name) == pytest.approx(getattr(expected, name), abs=tol), name
    assert got.adaece_bins_used == expected.adaece_bins_used  # type: ignore[attr-defined]
    got_bins = [(b.count, b.accuracy) for b in got.adaece_bins]  # type: ignore[attr-defined]
    expected_bins = [(b.count, b.accuracy) for b in expected.adaece_bins]  # type: ignore[attr-defined]
    assert got_bins == pytest.approx(expected_bins, abs=tol)
    curve = [number for point in got.risk_coverage for number in point]  # type: ignore[attr-defined]
    expected_curve = [number for point in expected.risk_coverage for number in point]  # type: ignore[attr-defined]
    assert curve == pytest.approx(expected_curve, abs=tol)


def piecewise_constant_case(
    n: int = 600, k: int = 10
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded float64 logits, labels that make some steps over- and others under-confident,
    and the values f(c) of a four-step map of the confidences."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(n, k, generator=generator, dtype=F64) * 3
    c, prediction = torch.softmax(logits, 1).max(1)
    step = (c * 4).floor().clamp(0, 3).long()
    f = torch.tensor([0.55, 0.7, 0.85, 0.95], dtype=F64)[step]
    truth = torch.tensor([0.5, 0.8, 0.8, 0.99], dtype=F64)[step]
    hit = torch.rand(n, generator=generator, dtype=F64) < truth
    return logits, torch.where(hit, prediction, (prediction + 1) % k), f


def test_piecewise_constant_map_metrics_do_not_move_with_last_bits_of_the_logits() -> None:
    # The device finding: logits that differ by rounding (here a relative 1e-15) moved AdaECE,
    # KS, Kuiper and AURC of a piecewise-constant map by 1e-2..1e-3 (the confidences of one
    # step came out a few units of rounding apart, and the tie groups split differently).
    logits, labels, f = piecewise_constant_case()
    generator = torch.Generator().manual_seed(1)
    noise = torch.randn(logits.shape, generator=generator, dtype=F64)
    perturbed = logits * (1 + 1e-15 * noise)
    assert not torch.equal(perturbed, logits)

    def metrics(z: torch.Tensor) -> object:
        logq = top_label_log_probabilities(torch.log_softmax(z, 1), f)
        return calibration_metrics(logq, labels, kind="logprobs")

    expected = metrics(logits)
    assert expected.adaece_bins_used == 3  # type: ignore[attr-defined]
    assert_same_metrics(metrics(perturbed), expected)


def test_top_label_rule_gives_equal_f_equal_bits() -> None:
    # Rows with the same f(c) but different other entries: q_t = f(c) exactly (no
    # renormalisation that mixes in the other entries), so the confidences are equal bit for bit.
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(400, 50, generator=generator, dtype=F64) * 2
    f = torch.full((400,), 0.8, dtype=F64)
    logq = top_label_log_probabilities(torch.log_softmax(logits, 1), f)
    confidence = top_label_of(logq, torch.zeros(400, dtype=torch.long), "logprobs").confidence
    assert torch.unique(confidence).numel() == 1
    assert float(confidence[0]) == pytest.approx(0.8, abs=4 * U)
    assert torch.exp(logq).sum(1).sub(1).abs().max() < 1e-14


def histogram_f(fit: object, c: np.ndarray) -> np.ndarray:
    calibrator = fit.calibrator  # type: ignore[attr-defined]
    edges = np.asarray(calibrator.edges[0], dtype=np.float64)
    return np.asarray(calibrator.values[0], dtype=np.float64)[bin_of(c, edges)]


def isotonic_f(fit: object, c: np.ndarray) -> np.ndarray:
    calibrator = fit.calibrator  # type: ignore[attr-defined]
    return np.interp(c, np.asarray(calibrator.x[0]), np.asarray(calibrator.y[0]))


@pytest.mark.parametrize(
    ("fit", "direct"),
    [(fit_histogram, histogram_f), (fit_isotonic, isotonic_f)],
    ids=["histogram", "isotonic"],
)
def test_fitted_maps_give_rows_with_one_f_one_confidence(fit: Any, direct: Any) -> None:
    logits, labels, _ = piecewise_constant_case(800)
    fitted = fit(logits[:400], labels[:400], kind="logits")
    logq = fitted.calibrator.apply(logits[400:], "logits", "scores")
    confidence = top_label_of(logq, labels[400:], "logprobs").confidence
    f = torch.from_numpy(direct(fitted, torch.softmax(logits[400:], 1).max(1).values.numpy()))
    steps = torch.unique(f)
    assert steps.numel() < 50  # piecewise constant on these rows: many rows share one f(c)
    for value in steps:
        # rows where the floor does not bind have q_t = f(c): one confidence, bit for bit
        mapped = confidence[(f == value) & ((confidence - value).abs() <= 1e-12)]
        assert mapped.numel() and torch.unique(mapped).numel() == 1, float(value)


def test_hand_worked_adaece_with_near_ties() -> None:
    # Six confidences, M = 3: 0.6 three times and 0.9 three times, each a unit of rounding
    # apart. Cuts at round(2) = 2 and round(4) = 4 move to the ends of their tie groups (3 and
    # 6): two bins. Bin 1: conf 0.6, acc 1/3 (over-confident by 4/15); bin 2: conf 0.9, acc 1
    # (under-confident by 1/10). AdaECE = (4/15 + 1/10)/2 = 11/60. Exact ties only would cut
    # the 0.6 group after two samples: bins {0.6−, 0.6}, {0.6+, 0.9−}, {0.9, 0.9+} and 0.15.
    confidence = [nudged(0.6, -1), 0.6, nudged(0.6, 1), nudged(0.9, -1), 0.9, nudged(0.9, 1)]
    labels = torch.tensor([0, 1, 1, 0, 0, 0])  # class 0 is the prediction: correct 1 0 0 1 1 1
    logp = logprobs_with_confidence(confidence)
    m = calibration_metrics(logp, labels, kind="logprobs", bins=3)
    assert m.adaece == pytest.approx(11 / 60, abs=1e-12)
    assert m.adaece_bins_used == 2
    assert [b.count for b in m.adaece_bins] == [3, 3]
    assert [b.accuracy for b in m.adaece_bins] == pytest.approx([1 / 3, 1.0], abs=1e-15)
    # KS/Kuiper: S after the 0.6 group = (1.8 − 1)/6 = 2/15, after all = (4.5 − 4)/6 = 1/12
    assert m.ks_ce == pytest.approx(2 / 15, abs=1e-12)
    assert m.kuiper == pytest.approx(2 / 15, abs=1e-12)
    # risk-coverage: the 0.9 group has no error; the 0.6 group's two errors spread evenly:
    # risk_k = 0, 0, 0, 2/3/4, 4/3/5, 2/6; AURC = (1/6 + 4/15 + 1/3)/6
    assert m.aurc == pytest.approx((1 / 6 + 4 / 15 + 1 / 3) / 6, abs=1e-12)
    # every order of the samples gives the same numbers
    for order in ([5, 4, 3, 2, 1, 0], [2, 0, 4, 1, 5, 3], [1, 3, 5, 0, 2, 4]):
        shuffled = calibration_metrics(logp[order], labels[order], kind="logprobs", bins=3)
        assert_same_metrics(shuffled, m, tol=1e-15)


def test_all_confidences_within_the_band_are_one_group() -> None:
    # a chain 0.7·(1 + 6u·i), i = 0..9: each neighbour within 16u, the ends ~54u apart; one
    # group, so AdaECE and KS are |mean confidence − accuracy| and the curve is flat
    confidence = [0.7 * (1 + 6 * U * i) for i in range(10)]
    assert len(set(confidence)) > 5
    assert ties.group_sizes(torch.tensor(confidence, dtype=F64)).tolist() == [10]
    labels = torch.tensor([0, 1, 0, 0, 1, 0, 0, 0, 1, 0])  # 7 correct
    m = calibration_metrics(logprobs_with_confidence(confidence), labels, kind="logprobs")
    mean = sum(confidence) / 10
    assert m.adaece_bins_used == 1
    assert m.adaece == pytest.approx(0.0, abs=1e-12)  # |0.7 − 0.7|
    assert m.ks_ce == pytest.approx(abs(mean - 0.7), abs=1e-15)
    assert [risk for _, risk in m.risk_coverage] == pytest.approx([0.3] * 10, abs=1e-15)
    assert m.aurc == pytest.approx(0.3, abs=1e-15)


def test_group_bound_is_sixteen_units_of_rounding() -> None:
    # at 0.5 a unit of rounding u·0.5 is 2^-54; 0.5 + 2^-50 is 16 u·0.5 away: joined.
    # 0.5 + 2^-49 (32 u·0.5, above 16 u·max) starts a new group; so does any real difference.
    joined = torch.tensor([0.5, 0.5 + 2.0**-50], dtype=F64)
    split = torch.tensor([0.5, 0.5 + 2.0**-49], dtype=F64)
    assert ties.group_starts(joined).tolist() == [True, False]
    assert ties.group_starts(split).tolist() == [True, True]
    assert ties.group_sizes(torch.tensor([0.0, 0.0, 1e-300, 0.3, 0.3], dtype=F64)).tolist() == [
        2,
        1,
        2,
    ]
    assert ties.group_sizes(torch.zeros(0, dtype=F64)).tolist() == []
    assert ties.group_sizes(torch.tensor([0.25], dtype=F64)).tolist() == [1]


def test_without_near_ties_the_groups_are_the_exact_ties() -> None:
    # softmax confidences of seeded logits, with exact repeats: the groups are exactly
    # torch.unique_consecutive's (the rule changes nothing where no values are that close)
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5000, 10, generator=generator, dtype=F64)
    logits = torch.cat([logits, logits[:700]])
    ascending = torch.softmax(logits, 1).max(1).values.sort().values
    _, exact = torch.unique_consecutive(ascending, return_counts=True)
    assert torch.equal(ties.group_sizes(ascending), exact)


@pytest.mark.parametrize("fit", [fit_histogram, fit_isotonic], ids=["histogram", "isotonic"])
def test_fitted_map_metrics_do_not_move_with_last_bits_of_the_logits(fit: Any) -> None:
    # the device finding end to end: a map fitted once, applied to logits and to the same
    # logits changed by a relative 1e-15 (as another device computes them)
    logits, labels, _ = piecewise_constant_case(1200)
    fitted = fit(logits[:600], labels[:600], kind="logits").calibrator
    noise = torch.randn(600, 10, generator=torch.Generator().manual_seed(4), dtype=F64)
    evaluation = logits[600:]

    def metrics(z: torch.Tensor) -> Any:
        return calibration_metrics(fitted.apply(z, "logits", "scores"), labels[600:], "logprobs")

    assert_same_metrics(metrics(evaluation * (1 + 1e-15 * noise)), metrics(evaluation))
