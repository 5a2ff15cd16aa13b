"""Calibration metrics: golden micro-cases, hand-worked tables, invariances, bad and border inputs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from curvcal.calibration import metrics as M
from curvcal.calibration.metrics import calibration_metrics
from curvcal.errors import InputError

F64 = torch.float64
GOLDEN_P = torch.tensor(
    [
        [0.5, 0.25, 0.25],
        [0.5, 0.25, 0.25],
        [0.75, 0.125, 0.125],
        [0.75, 0.125, 0.125],
        [0.25, 0.25, 0.5],
    ],
    dtype=F64,
)
GOLDEN_Y = torch.tensor([0, 0, 0, 1, 2])


def test_golden_edge_side_left_is_0_400() -> None:
    m = calibration_metrics(GOLDEN_P, GOLDEN_Y, kind="probs", bins=2, edges="left")
    assert m.ece == pytest.approx(0.4, abs=1e-12)
    assert M.expected_calibration_error(GOLDEN_P, GOLDEN_Y, kind="probs", bins=2) == pytest.approx(
        0.4, abs=1e-12
    )


def test_golden_edge_side_right_is_0_200() -> None:
    m = calibration_metrics(GOLDEN_P, GOLDEN_Y, kind="probs", bins=2, edges="right")
    assert m.ece == pytest.approx(0.2, abs=1e-12)
    assert m.edges == "right"


def test_golden_confidence_exactly_one_goes_to_the_last_bin() -> None:
    p = torch.tensor([[0.9, 0.1, 0.0], [1.0, 0.0, 0.0], [0.0, 0.3, 0.7]], dtype=F64)
    m = calibration_metrics(p, torch.tensor([0, 1, 2]), kind="probs", bins=2)
    assert m.ece == pytest.approx(0.2, abs=1e-12)
    assert [b.count for b in m.ece_bins] == [0, 3]
    assert math.isinf(m.nll)  # p_y = 0 for the second sample


def test_hand_worked_reliability_table_and_scalars() -> None:
    m = calibration_metrics(GOLDEN_P, GOLDEN_Y, kind="probs", bins=2)
    low, high = m.ece_bins
    assert (low.lower, low.upper, low.count, low.confidence, low.accuracy) == (
        0.0,
        0.5,
        3,
        0.5,
        1.0,
    )
    assert low.gap == pytest.approx(0.5)
    assert (high.lower, high.upper, high.count) == (0.5, 1.0, 2)
    assert (high.confidence, high.accuracy, high.gap) == pytest.approx((0.75, 0.5, -0.25))
    assert m.mce == pytest.approx(0.5)
    assert m.rms_ce == pytest.approx(math.sqrt(0.175))
    # Kumar et al.: 3/5·(0.25 - 0) + 2/5·(0.0625 - 0.5·0.5/1)
    assert m.rms_ce_debiased == pytest.approx(math.sqrt(0.075))
    # equal mass: cut at round(5/2) = 3 -> {.5,.5,.5} and {.75,.75}
    assert m.adaece_bins_used == 2
    assert [(b.lower, b.upper, b.count) for b in m.adaece_bins] == [(0.5, 0.5, 3), (0.75, 0.75, 2)]
    assert m.adaece == pytest.approx(0.4)
    # classwise: class 0 (0.75 + 0.5)/5, class 1 0, class 2 0.25/5
    assert m.classwise_ece == pytest.approx((0.25 + 0.0 + 0.05) / 3)
    assert m.accuracy == pytest.approx(0.8)
    assert m.mean_confidence == pytest.approx(0.6)
    assert m.nll == pytest.approx((3 * math.log(2) + math.log(4 / 3) + math.log(8)) / 5)
    assert m.brier == pytest.approx(2.5625 / 5)
    assert m.positive_class_ece is None


def test_scalars_are_the_table_numbers() -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(300, 4, generator=g, dtype=F64) * 2
    y = torch.randint(4, (300,), generator=g)
    m = calibration_metrics(z, y, bins=7)
    for table, ece in ((m.ece_bins, m.ece), (m.adaece_bins, m.adaece)):
        n = sum(b.count for b in table)
        assert n == 300
        assert sum(b.count / n * abs(b.gap) for b in table if b.count) == pytest.approx(
            ece, abs=1e-12
        )
    assert max(abs(b.gap) for b in m.ece_bins if b.count) == pytest.approx(m.mce)


def test_binary_reports_both_eces() -> None:
    p = torch.tensor([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.1, 0.9]], dtype=F64)
    y = torch.tensor([0, 1, 1, 1])
    m = calibration_metrics(p, y, kind="probs", bins=2)
    assert m.ece == pytest.approx(0.0, abs=1e-12)  # top-label: acc .75, conf .75
    # p_1 bins: (.2,.4) vs labels (0,1): |1 - .6|; (.7,.9) vs (1,1): |2 - 1.6|
    assert m.positive_class_ece == pytest.approx(0.2)
    assert M.positive_class_calibration_error(p, y, kind="probs", bins=2) == pytest.approx(0.2)


def test_matches_dense_reference_on_random_data() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 5, generator=g, dtype=F64) * 3
    y = torch.randint(5, (500,), generator=g)
    p = torch.softmax(z, 1).numpy()
    conf, pred, yy = p.max(1), p.argmax(1), y.numpy()
    correct = (pred == yy).astype(float)
    ece = 0.0
    for b in range(10):
        inside = (conf > b / 10) & (conf <= (b + 1) / 10) if b else conf <= 0.1
        if inside.any():
            ece += inside.sum() / 500 * abs(correct[inside].mean() - conf[inside].mean())
    m = calibration_metrics(z, y, bins=10)
    assert m.ece == pytest.approx(ece, abs=1e-12)
    assert m.nll == pytest.approx(-np.log(p[np.arange(500), yy]).mean(), abs=1e-12)
    assert m.brier == pytest.approx(((p - np.eye(5)[yy]) ** 2).sum(1).mean(), abs=1e-12)


def test_float32_logits_with_a_top_gap_of_50() -> None:
    z = torch.tensor([[50.0, 0.0, 0.0], [50.0, 0.0, 0.0], [0.0, 50.0, 0.0]], dtype=torch.float32)
    y = torch.tensor([0, 1, 1])
    m = calibration_metrics(z, y, bins=15)
    tail = 2 * math.exp(-50)
    assert math.isfinite(m.nll) and math.isfinite(m.ece) and math.isfinite(m.smooth_ece)
    assert m.nll == pytest.approx((2 * math.log1p(tail) + 50 + math.log1p(tail)) / 3, rel=1e-12)
    assert M.negative_log_likelihood(z[1:2], y[1:2]) == pytest.approx(50.0, rel=1e-15)
    # far past float32's range: p_y = e^-200 underflows a float32 softmax to 0 (NLL inf)
    far = torch.tensor([[200.0, 0.0]], dtype=torch.float32)
    assert M.negative_log_likelihood(far, torch.tensor([1])) == pytest.approx(200.0, rel=1e-15)
    assert m.ece == pytest.approx(abs(2 / 3 - 1 / (1 + tail)), abs=1e-12)


def test_bootstrap_intervals_are_seeded_and_bracket_the_estimate() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(400, 3, generator=g, dtype=F64) * 2
    y = torch.randint(3, (400,), generator=g)
    a = calibration_metrics(z, y, bootstrap=40, seed=7)
    b = calibration_metrics(z, y, bootstrap=40, seed=7)
    c = calibration_metrics(z, y, bootstrap=40, seed=8)
    assert a.intervals == b.intervals != c.intervals
    assert set(a.intervals) == {"ece", "adaece", "mce", "nll", "classwise_ece", "smooth_ece"}
    for name, (low, high) in a.intervals.items():
        assert low <= getattr(a, name) <= high, name
    low, high = a.intervals["nll"]
    assert low < a.nll < high
    assert a.n_bootstrap == 40 and calibration_metrics(z, y).intervals == {}


def test_input_is_not_modified() -> None:
    z = torch.randn(20, 3, dtype=torch.float32)
    before = z.clone()
    calibration_metrics(z, torch.zeros(20, dtype=torch.int64))
    assert torch.equal(z, before)


def test_logits_probs_and_logprobs_agree() -> None:
    z = torch.randn(50, 4, dtype=F64, generator=torch.Generator().manual_seed(2))
    y = torch.arange(50) % 4
    a = calibration_metrics(z, y)
    b = calibration_metrics(torch.softmax(z, 1), y, kind="probs")
    c = calibration_metrics(torch.log_softmax(z, 1), y, kind="logprobs")
    for name in ("ece", "adaece", "classwise_ece", "nll", "brier", "smooth_ece"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-12)
        assert getattr(a, name) == pytest.approx(getattr(c, name), abs=1e-12)


def test_small_public_functions_agree_with_the_one_pass() -> None:
    z = torch.randn(80, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    y = torch.arange(80) % 3
    m = calibration_metrics(z, y, bins=6, edges="right")
    assert M.expected_calibration_error(z, y, bins=6, edges="right") == m.ece
    assert M.maximum_calibration_error(z, y, bins=6, edges="right") == m.mce
    assert M.rms_calibration_error(z, y, bins=6, edges="right") == m.rms_ce
    assert M.rms_calibration_error(z, y, bins=6, edges="right", debiased=True) == m.rms_ce_debiased
    assert M.adaptive_calibration_error(z, y, bins=6) == m.adaece
    assert M.classwise_calibration_error(z, y, bins=6, edges="right") == m.classwise_ece
    assert M.negative_log_likelihood(z, y) == m.nll
    assert M.brier_score(z, y) == m.brier
    assert M.accuracy(z, y) == m.accuracy
    assert M.mean_confidence(z, y) == m.mean_confidence
    # repr: empty bins carry NaN means, and NaN != NaN
    assert repr(M.reliability_bins(z, y, bins=6, edges="right")) == repr(m.ece_bins)
    assert repr(M.reliability_bins(z, y, bins=6, binning_scheme="equal-mass")) == repr(
        m.adaece_bins
    )


# ---- properties ---------------------------------------------------------------------------

SCALARS = [
    "accuracy", "mean_confidence", "ece", "mce", "rms_ce", "rms_ce_debiased", "adaece",
    "adaece_bins_used", "classwise_ece", "nll", "brier", "smooth_ece", "smooth_ece_bandwidth",
]  # fmt: skip


@st.composite
def scored(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    n = draw(st.integers(1, 30))
    k = draw(st.integers(1, 4))
    # coarse logit levels make ties and edge values common
    levels = draw(st.lists(st.integers(-3, 3), min_size=n * k, max_size=n * k))
    labels = draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    return torch.tensor(levels, dtype=F64).view(n, k), torch.tensor(labels)


@settings(max_examples=60, deadline=None)
@given(
    scored(),
    st.integers(1, 12),
    st.sampled_from(["left", "right"]),
    st.randoms(use_true_random=False),
)
def test_every_metric_is_permutation_invariant(
    data: tuple[torch.Tensor, torch.Tensor], bins: int, edges: str, rnd: object
) -> None:
    z, y = data
    perm = torch.randperm(
        z.shape[0], generator=torch.Generator().manual_seed(z.shape[0] * 31 + bins)
    )
    a = calibration_metrics(z, y, bins=bins, edges=edges)
    b = calibration_metrics(z[perm], y[perm], bins=bins, edges=edges)
    for name in SCALARS:
        assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-12), name
    assert [(r.lower, r.upper, r.count) for r in a.adaece_bins] == [
        (r.lower, r.upper, r.count) for r in b.adaece_bins
    ]


@settings(max_examples=60, deadline=None)
@given(scored(), st.integers(1, 12), st.sampled_from(["left", "right"]))
def test_errors_lie_in_the_unit_interval(
    data: tuple[torch.Tensor, torch.Tensor], bins: int, edges: str
) -> None:
    m = calibration_metrics(*data, bins=bins, edges=edges)
    for name in (
        "ece",
        "mce",
        "rms_ce",
        "rms_ce_debiased",
        "adaece",
        "classwise_ece",
        "smooth_ece",
    ):
        assert 0.0 <= getattr(m, name) <= 1.0, name
    assert m.ece <= m.mce + 1e-15 and m.ece <= m.rms_ce + 1e-15


@settings(max_examples=60, deadline=None)
@given(scored(), st.integers(1, 12), st.sampled_from(["left", "right"]), st.booleans())
def test_one_signed_miscalibration_ece_is_the_accuracy_gap(
    data: tuple[torch.Tensor, torch.Tensor], bins: int, edges: str, all_correct: bool
) -> None:
    z, _ = data
    k = z.shape[1]
    pred = z.argmax(dim=1)
    if not all_correct and k == 1:
        return
    y = pred if all_correct else (pred + 1) % k  # every bin under- (or over-) confident
    m = calibration_metrics(z, y, bins=bins, edges=edges)
    assert m.ece == pytest.approx(abs(m.accuracy - m.mean_confidence), abs=1e-12)
    assert m.adaece == pytest.approx(abs(m.accuracy - m.mean_confidence), abs=1e-12)


def test_mixed_signs_make_ece_exceed_the_accuracy_gap() -> None:
    m = calibration_metrics(GOLDEN_P, GOLDEN_Y, kind="probs", bins=2)
    assert m.ece > abs(m.accuracy - m.mean_confidence) + 0.1


# ---- border cases -------------------------------------------------------------------------


def test_one_sample() -> None:
    m = calibration_metrics(torch.tensor([[2.0, 1.0]]), torch.tensor([1]))
    c = 1 / (1 + math.exp(-1))
    assert m.ece == pytest.approx(c) and m.mce == pytest.approx(c) and m.adaece == pytest.approx(c)
    assert m.adaece_bins_used == 1 and m.rms_ce_debiased == 0.0


def test_one_class() -> None:
    m = calibration_metrics(torch.tensor([[3.0], [-1.0]]), torch.tensor([0, 0]))
    assert (m.accuracy, m.mean_confidence, m.ece, m.nll, m.brier, m.classwise_ece) == (
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
    )


def test_all_confidences_tied() -> None:
    z = torch.zeros(6, 3)
    m = calibration_metrics(z, torch.tensor([0, 1, 2, 0, 0, 0]), bins=4)
    assert m.adaece_bins_used == 1
    assert m.accuracy == pytest.approx(4 / 6)
    assert m.ece == pytest.approx(4 / 6 - 1 / 3) and m.adaece == pytest.approx(4 / 6 - 1 / 3)
    assert all(math.isfinite(getattr(m, name)) for name in SCALARS)


def test_fewer_samples_than_bins() -> None:
    p = torch.tensor([[0.9, 0.1], [0.35, 0.65]], dtype=F64)
    m = calibration_metrics(p, torch.tensor([0, 0]), kind="probs", bins=15)
    assert m.ece == pytest.approx((0.1 + 0.65) / 2)
    assert m.adaece_bins_used == 2
    assert sum(b.count for b in m.ece_bins) == 2 and len(m.ece_bins) == 15
    assert all(math.isnan(b.confidence) for b in m.ece_bins if b.count == 0)


def test_confidence_exactly_on_an_edge() -> None:
    p = torch.tensor([[0.6, 0.4], [0.8, 0.2]], dtype=F64)  # 0.6 = 3/5 is an edge of 5 bins
    left = calibration_metrics(p, torch.tensor([0, 1]), kind="probs", bins=5)
    right = calibration_metrics(p, torch.tensor([0, 1]), kind="probs", bins=5, edges="right")
    assert left.ece_bins[2].count == 1 and right.ece_bins[3].count == 1


# ---- bad inputs -----------------------------------------------------------------------------

Z = torch.zeros(3, 2)
Y = torch.tensor([0, 1, 0])


@pytest.mark.parametrize(
    ("scores", "labels", "kwargs", "what", "text"),
    [
        (torch.tensor([[0.0, math.nan]] * 3), Y, {}, "val.pt", "NaN"),
        (torch.tensor([[0.5, 0.6]] * 3), Y, {"kind": "probs"}, "val.pt", "sums to 1.1"),
        (torch.tensor([[1.5, -0.5]] * 3), Y, {"kind": "probs"}, "val.pt", "negative"),
        (torch.tensor([[0.1, 0.0]] * 3), Y, {"kind": "logprobs"}, "val.pt", "<= 0"),
        (Z, torch.tensor([0, 2, 0]), {}, "labels.npy", "[0, 2)"),
        (Z, torch.tensor([0, -1, 0]), {}, "labels.npy", "[0, 2)"),
        (Z, torch.tensor([0, 1]), {}, "labels.npy", "2 labels for 3 rows"),
        (Z, torch.tensor([0.0, 1.0, 0.0]), {}, "labels.npy", "integers"),
        (torch.zeros(3), Y, {}, "val.pt", "2-D"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64), {}, "val.pt", "empty"),
        (Z, Y, {"bins": 0}, "bins", ">= 1"),
        (Z, Y, {"edges": "middle"}, "edges", "unknown edge"),
        (Z, Y, {"kind": "scores"}, "kind", "unknown score kind"),
        (Z, Y, {"bootstrap": -1}, "bootstrap", ">= 0"),
    ],
)
def test_bad_inputs_raise_input_error_naming_the_source(
    scores: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, object], what: str, text: str
) -> None:
    with pytest.raises(InputError) as caught:
        calibration_metrics(scores, labels, source="val.pt", labels_source="labels.npy", **kwargs)  # type: ignore[arg-type]
    assert caught.value.what == what
    assert text in caught.value.why


def test_results_are_frozen() -> None:
    m = calibration_metrics(Z, Y)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.ece = 0.0  # type: ignore[misc]
