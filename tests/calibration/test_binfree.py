"""KS calibration error, Kuiper statistic and MMCE: hand-worked cases, independent loop and
O(N²) references, ties, border cases and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from curvcal.calibration import binfree
from curvcal.calibration import metrics as M
from curvcal.calibration.metrics import calibration_metrics
from curvcal.errors import InputError

F64 = torch.float64

# Binary probabilities whose confidences are 0.6 (right), 0.7 (wrong), 0.8 (right), 0.9 (right):
# mean confidence = accuracy = 0.75, so every one-signed summary is 0, yet the cumulative gaps
# are not. a_i = c_i - y_i = (-0.4, 0.7, -0.2, -0.1); S = (0, -0.1, 0.075, 0.025, 0).
HAND_P = torch.tensor([[0.1, 0.9], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8]], dtype=F64)
HAND_Y = torch.tensor([1, 1, 0, 1])


def test_hand_worked_ks_and_kuiper() -> None:
    m = calibration_metrics(HAND_P, HAND_Y, kind="probs")
    assert m.mean_confidence == pytest.approx(m.accuracy, abs=1e-15)
    assert m.ks_ce == pytest.approx(0.1, abs=1e-15)
    assert m.kuiper == pytest.approx(0.075 + 0.1, abs=1e-15)
    assert M.ks_calibration_error(HAND_P, HAND_Y, kind="probs") == m.ks_ce
    assert M.kuiper_statistic(HAND_P, HAND_Y, kind="probs") == m.kuiper


def test_hand_worked_mmce() -> None:
    # y - c = (0.4, -0.7, 0.2, 0.1) at r = (0.6, 0.7, 0.8, 0.9): Σ a_i² = 0.70; the pairs at
    # distance 0.1 sum to -0.40, at 0.2 to 0.01, at 0.3 to 0.04 (each counted twice).
    total = 0.70 + 2 * (-0.40 * math.exp(-0.25) + 0.01 * math.exp(-0.5) + 0.04 * math.exp(-0.75))
    want = math.sqrt(total / 16)
    m = calibration_metrics(HAND_P, HAND_Y, kind="probs")
    assert m.mmce == pytest.approx(want, rel=1e-13)
    assert M.maximum_mean_calibration_error(HAND_P, HAND_Y, kind="probs") == m.mmce


def _loop_ks_kuiper(conf: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """S(t) = (1/N) Σ_{c_i ≤ t} (c_i - y_i) at every distinct confidence t, and S = 0."""
    n = len(conf)
    values = [0.0]
    for t in sorted(set(conf.tolist())):
        values.append(sum(c - y for c, y in zip(conf, correct, strict=True) if c <= t) / n)
    return max(abs(v) for v in values), max(values) - min(values)


def _dense_mmce(conf: np.ndarray, correct: np.ndarray, width: float = 0.4) -> float:
    """The double sum of Kumar et al. with the whole N×N kernel matrix."""
    a = correct - conf
    kernel = np.exp(-np.abs(conf[:, None] - conf[None, :]) / width)
    return math.sqrt(max(0.0, float(a @ kernel @ a)) / len(conf) ** 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("levels", [0, 7])
def test_against_independent_references(seed: int, levels: int) -> None:
    """Random over- and under-confident scores; ``levels`` > 0 rounds logits to make ties."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 301, 5
    z = torch.randn(n, k, generator=generator, dtype=F64) * 2.5
    if levels:
        z = torch.round(z * levels / 4) / levels
    y = torch.randint(k, (n,), generator=generator)
    y[: n // 2] = z[: n // 2].argmax(dim=1)  # a mix of right and wrong predictions
    p = torch.softmax(z, dim=1)
    conf = p.max(dim=1).values.numpy()
    correct = (p.argmax(dim=1) == y).to(F64).numpy()
    m = calibration_metrics(z, y)
    ks, kuiper = _loop_ks_kuiper(conf, correct)
    assert m.ks_ce == pytest.approx(ks, abs=1e-14)
    assert m.kuiper == pytest.approx(kuiper, abs=1e-14)
    assert m.mmce == pytest.approx(_dense_mmce(conf, correct), rel=1e-10)


def test_without_ties_ks_is_the_papers_argsort_formula() -> None:
    """Gupta et al.'s code: cumulative sums at every position of an argsort."""
    generator = torch.Generator().manual_seed(5)
    conf = torch.rand(200, generator=generator, dtype=F64) * 0.5 + 0.5
    correct = (torch.rand(200, generator=generator, dtype=F64) < conf**2).to(F64)
    order = np.argsort(conf.numpy())
    h = np.cumsum(correct.numpy()[order]) / 200
    h_tilde = np.cumsum(conf.numpy()[order]) / 200
    assert binfree.ks_calibration_error(conf, correct) == pytest.approx(
        float(np.abs(h - h_tilde).max()), abs=1e-15
    )
    kuiper = max(0.0, float((h_tilde - h).max())) - min(0.0, float((h_tilde - h).min()))
    assert binfree.kuiper_statistic(conf, correct) == pytest.approx(kuiper, abs=1e-15)


def test_ties_are_evaluated_after_the_whole_group() -> None:
    """Two samples at confidence 0.5, one right: any order inside the tie gives a partial sum of
    ±0.25, but the empirical distribution jumps once, to 0."""
    conf = torch.tensor([0.5, 0.5], dtype=F64)
    for correct in (torch.tensor([1.0, 0.0], dtype=F64), torch.tensor([0.0, 1.0], dtype=F64)):
        assert binfree.ks_calibration_error(conf, correct) == 0.0
        assert binfree.kuiper_statistic(conf, correct) == 0.0
        assert binfree.mmce(conf, correct) == 0.0


def test_one_sample() -> None:
    for label, gap in ((0, 1 - torch.sigmoid(torch.tensor(2.0, dtype=F64))), (1, None)):
        z = torch.tensor([[2.0, 0.0]], dtype=F64)
        conf = float(torch.sigmoid(torch.tensor(2.0, dtype=F64)))
        want = float(gap) if gap is not None else conf  # |c - y|
        m = calibration_metrics(z, torch.tensor([label]))
        assert m.ks_ce == pytest.approx(want, rel=1e-15)
        assert m.kuiper == pytest.approx(want, rel=1e-15)
        assert m.mmce == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize("right", [True, False])
def test_all_right_or_all_wrong_is_the_one_signed_gap(right: bool) -> None:
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(50, 4, generator=generator, dtype=F64)
    pred = z.argmax(dim=1)
    y = pred if right else (pred + 1) % 4
    m = calibration_metrics(z, y)
    gap = abs(m.accuracy - m.mean_confidence)
    assert m.ks_ce == pytest.approx(gap, abs=1e-15)
    assert m.kuiper == pytest.approx(gap, abs=1e-15)
    assert 0.0 < m.mmce <= gap + 1e-15


def test_all_tied_confidences_give_the_accuracy_gap() -> None:
    """One confidence for every sample: S jumps once, and k(r, r') = 1 everywhere."""
    z = torch.zeros(7, 3, dtype=F64)
    y = torch.tensor([0, 0, 0, 1, 2, 1, 0])
    gap = 4 / 7 - 1 / 3  # prediction 0 is right 4 times
    m = calibration_metrics(z, y)
    for value in (m.ks_ce, m.kuiper, m.mmce):
        assert value == pytest.approx(gap, abs=1e-15)


@st.composite
def scored(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    n = draw(st.integers(1, 25))
    k = draw(st.integers(1, 4))
    levels = draw(st.lists(st.integers(-3, 3), min_size=n * k, max_size=n * k))
    labels = draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    return torch.tensor(levels, dtype=F64).view(n, k), torch.tensor(labels)


@settings(max_examples=60, deadline=None)
@given(scored(), st.randoms(use_true_random=False))
def test_permutation_invariant_and_in_the_unit_interval(
    data: tuple[torch.Tensor, torch.Tensor], rnd: object
) -> None:
    z, y = data
    perm = torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(z.shape[0]))
    a, b = calibration_metrics(z, y), calibration_metrics(z[perm], y[perm])
    for name in ("ks_ce", "kuiper", "mmce"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-14), name
        assert 0.0 <= getattr(a, name) <= 1.0, name
    assert a.ks_ce <= a.kuiper + 1e-15 <= 2 * a.ks_ce + 2e-15
    assert a.ks_ce >= abs(a.accuracy - a.mean_confidence) - 1e-15


Z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
Y = torch.tensor([0, 1, 1])
PUBLIC = [
    M.ks_calibration_error,
    M.kuiper_statistic,
    M.maximum_mean_calibration_error,
    M.aurc,
    M.excess_aurc,
    M.risk_coverage,
]


@pytest.mark.parametrize("function", PUBLIC, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("scores", "labels", "text"),
    [
        (torch.tensor([[0.0, math.nan]] * 3), Y, "NaN"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64), "empty"),
        (torch.zeros(3), Y, "2-D"),
        (Z, torch.tensor([0, 1]), "2 labels for 3 rows"),
        (Z, torch.tensor([0, 2, 0]), "[0, 2)"),
    ],
)
def test_bad_inputs_go_through_the_validation_stage(
    function: object, scores: torch.Tensor, labels: torch.Tensor, text: str
) -> None:
    with pytest.raises(InputError) as caught:
        function(scores, labels)  # type: ignore[operator]
    assert text in caught.value.why
