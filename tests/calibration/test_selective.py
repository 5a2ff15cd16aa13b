"""Risk–coverage curve, AURC and E-AURC: hand-worked cases, the plain argsort loop, the
expectation over every order of the ties, and border cases."""

from __future__ import annotations

import itertools

import pytest
import torch

from curvcal.calibration import metrics as M
from curvcal.calibration import selective
from curvcal.calibration.metrics import calibration_metrics

F64 = torch.float64

# Confidences 0.9, 0.8, 0.7, 0.6 with errors 0, 0, 1, 0 (descending confidence).
HAND_P = torch.tensor([[0.1, 0.9], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8]], dtype=F64)
HAND_Y = torch.tensor([1, 1, 0, 1])


def test_hand_worked_curve_and_areas() -> None:
    # risk_k = 0, 0, 1/3, 1/4; AURC = (1/3 + 1/4)/4 = 7/48; the oracle keeps the error last:
    # risk* = 0, 0, 0, 1/4, AURC* = 1/16; E-AURC = 7/48 - 3/48 = 1/12.
    curve = M.risk_coverage(HAND_P, HAND_Y, kind="probs")
    assert curve.coverage.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert curve.risk.tolist() == pytest.approx([0.0, 0.0, 1 / 3, 1 / 4], abs=1e-15)
    m = calibration_metrics(HAND_P, HAND_Y, kind="probs")
    assert m.aurc == pytest.approx(7 / 48, abs=1e-15)
    assert m.e_aurc == pytest.approx(1 / 12, abs=1e-15)
    assert M.aurc(HAND_P, HAND_Y, kind="probs") == m.aurc
    assert M.excess_aurc(HAND_P, HAND_Y, kind="probs") == m.e_aurc
    # k = ceil(j·4/10): 1, 1, 2, 2, 2, 3, 3, 4, 4, 4
    risks = [0.0, 0.0, 0.0, 0.0, 0.0, 1 / 3, 1 / 3, 0.25, 0.25, 0.25]
    assert [c for c, _ in m.risk_coverage] == pytest.approx([j / 10 for j in range(1, 11)])
    assert [r for _, r in m.risk_coverage] == pytest.approx(risks, abs=1e-15)


def test_hand_worked_ties() -> None:
    # confidence 0.9 (right), then three tied at 0.6 holding one error: the error is spread
    # over the group, risk = 0, (1/3)/2, (2/3)/3, 1/4 and AURC = (1/6 + 2/9 + 1/4)/4 = 23/144.
    conf = torch.tensor([0.6, 0.9, 0.6, 0.6], dtype=F64)
    correct = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=F64)
    curve = selective.risk_coverage_curve(conf, correct)
    assert curve.risk.tolist() == pytest.approx([0.0, 1 / 6, 2 / 9, 1 / 4], abs=1e-15)
    assert curve.aurc == pytest.approx(23 / 144, abs=1e-15)


def _plain_aurc(conf: list[float], correct: list[float]) -> float:
    """Geifman et al.'s loop: sort by confidence descending (stable), risk of every prefix."""
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    errors, total = 0.0, 0.0
    for k, i in enumerate(order, start=1):
        errors += 1.0 - correct[i]
        total += errors / k
    return total / len(conf)


def test_without_ties_aurc_is_the_plain_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    conf = torch.rand(500, generator=generator, dtype=F64)
    correct = (torch.rand(500, generator=generator, dtype=F64) < conf).to(F64)
    want = _plain_aurc(conf.tolist(), correct.tolist())
    assert selective.risk_coverage_curve(conf, correct).aurc == pytest.approx(want, abs=1e-14)


@pytest.mark.parametrize("seed", range(4))
def test_ties_are_the_mean_over_every_order(seed: int) -> None:
    """AURC with ties = the plain loop's AURC averaged over all N! orders of the samples."""
    generator = torch.Generator().manual_seed(seed)
    conf = (torch.randint(3, (6,), generator=generator) / 4 + 0.25).to(F64).tolist()
    correct = torch.randint(2, (6,), generator=generator).to(F64).tolist()
    orders = list(itertools.permutations(range(6)))
    mean = sum(
        _plain_aurc([conf[i] for i in order], [correct[i] for i in order]) for order in orders
    ) / len(orders)
    got = selective.risk_coverage_curve(torch.tensor(conf), torch.tensor(correct)).aurc
    assert got == pytest.approx(mean, abs=1e-14)


def test_optimal_aurc_is_the_oracle_ranking() -> None:
    """AURC* = the plain AURC of confidences that rank every right prediction first."""
    correct = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    oracle = [0.9 if c else 0.1 for c in correct]
    want = _plain_aurc(oracle, correct)
    assert selective.optimal_aurc(torch.tensor(correct, dtype=F64)) == pytest.approx(want)
    assert selective.excess_aurc(torch.tensor(oracle, dtype=F64), torch.tensor(correct)) == (
        pytest.approx(0.0, abs=1e-15)
    )


@pytest.mark.parametrize(("label", "aurc"), [(0, 0.0), (1, 1.0)])
def test_one_sample(label: int, aurc: float) -> None:
    m = calibration_metrics(torch.tensor([[2.0, 0.0]]), torch.tensor([label]))
    assert m.aurc == aurc and m.e_aurc == 0.0
    assert m.risk_coverage == tuple((j / 10, aurc) for j in range(1, 11))


@pytest.mark.parametrize("right", [True, False])
def test_all_right_or_all_wrong(right: bool) -> None:
    z = torch.randn(40, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    pred = z.argmax(dim=1)
    m = calibration_metrics(z, pred if right else (pred + 1) % 3)
    assert m.aurc == (0.0 if right else 1.0)
    assert m.e_aurc == pytest.approx(0.0, abs=1e-15)


def test_all_tied_confidences_give_the_error_rate_at_every_coverage() -> None:
    z = torch.zeros(8, 2, dtype=F64)
    y = torch.tensor([0, 1, 0, 0, 1, 0, 1, 0])  # prediction 0: 3 errors of 8
    curve = M.risk_coverage(z, y)
    assert curve.risk.tolist() == pytest.approx([3 / 8] * 8, abs=1e-15)
    m = calibration_metrics(z, y)
    assert m.aurc == pytest.approx(3 / 8, abs=1e-15) and m.e_aurc > 0


def test_permutation_invariant() -> None:
    generator = torch.Generator().manual_seed(7)
    z = torch.randint(-2, 3, (60, 3), generator=generator).to(F64)  # many ties
    y = torch.randint(3, (60,), generator=generator)
    perm = torch.randperm(60, generator=generator)
    a, b = calibration_metrics(z, y), calibration_metrics(z[perm], y[perm])
    assert a.aurc == pytest.approx(b.aurc, abs=1e-15)
    assert a.e_aurc == pytest.approx(b.e_aurc, abs=1e-15)
    flat = [value for pair in a.risk_coverage for value in pair]
    assert flat == pytest.approx([value for pair in b.risk_coverage for value in pair], abs=1e-15)
