"""One-vs-rest isotonic regression with every class of a block fitted together (one pooling
with a segment per class) against the per-class implementation it replaced, kept here
verbatim as the reference, bit for bit: fitted points and values on synthetic, tied and
saturated data, classes still pooling after the vectorised passes (the stack pass), classes
without positives, and blocks of classes split at every size; and the segmented
pool-adjacent-violators against one segment at a time, with segments whose neighbours would
pool across the border."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration import isotonic
from curvcal.calibration.isotonic import (
    VECTOR_PASSES,
    one_vs_rest_points,
    pool_adjacent_violators,
    sorted_tie_starts,
)
from tests.calibration.test_isotonic_ovr_paths import hard_columns, same_bits


def reference_pool(targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The per-class pool-adjacent-violators before the classes were fitted together."""
    weight: np.ndarray = weights.astype(np.float64)
    total: np.ndarray = targets.astype(np.float64) * weight
    size = np.ones(len(targets), dtype=np.int64)
    for _ in range(VECTOR_PASSES):
        if len(weight) < 2:
            break
        mean = total / weight
        violates = mean[:-1] >= mean[1:]
        if not violates.any():
            return np.repeat(mean, size)
        opens = np.ones(len(weight), dtype=bool)
        opens[1:] = ~violates
        block = np.cumsum(opens) - 1
        weight = np.bincount(block, weights=weight)
        total = np.bincount(block, weights=total)
        size = np.bincount(block, weights=size).astype(np.int64)
    stack_weight: list[float] = []
    stack_total: list[float] = []
    stack_size: list[int] = []
    for w, t, n in zip(weight.tolist(), total.tolist(), size.tolist(), strict=True):
        stack_weight.append(w)
        stack_total.append(t)
        stack_size.append(n)
        while (
            len(stack_weight) > 1
            and stack_total[-2] / stack_weight[-2] > stack_total[-1] / stack_weight[-1]
        ):
            w, t, n = stack_weight.pop(), stack_total.pop(), stack_size.pop()
            stack_weight[-1] += w
            stack_total[-1] += t
            stack_size[-1] += n
    return np.repeat(np.array(stack_total) / np.array(stack_weight), stack_size)


def reference_class_points(
    ranked: np.ndarray, opens: np.ndarray, positives: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One class's kept points as the per-class loop found them."""
    first = np.flatnonzero(opens)
    bounds = np.append(first, len(ranked))
    group = np.searchsorted(first, np.searchsorted(ranked, positives, side="right") - 1, "right")
    positive, hits = np.unique(group - 1, return_counts=True)
    low = np.empty(2 * len(positive) + 1, dtype=np.int64)
    high = np.empty_like(low)
    low[0], low[2::2], low[1::2] = 0, positive + 1, positive
    high[-1], high[:-1:2], high[1::2] = len(first), positive, positive + 1
    weight = bounds[high] - bounds[low]
    target = np.zeros(len(low))
    target[1::2] = hits / weight[1::2]
    used = high > low
    low, high = low[used], high[used]
    fitted = reference_pool(target[used], weight[used].astype(np.float64))
    change = np.flatnonzero(fitted[1:] != fitted[:-1]) + 1
    run_first = np.concatenate([[0], change])
    run_last = np.append(change, len(fitted)) - 1
    ends = np.stack([low[run_first], high[run_last] - 1], axis=1)
    both = ends[:, 0] < ends[:, 1]
    kept = np.where(both[:, None], ends, ends[:, :1]).reshape(-1)
    kept = kept[np.stack([np.ones(len(both), dtype=bool), both], axis=1).reshape(-1)]
    values = np.repeat(fitted[run_first], np.where(both, 2, 1))
    return ranked[first[kept]], values


def reference_points(p: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every class's kept points, one class at a time (the loop that was replaced)."""
    n, k = p.shape
    columns = np.ascontiguousarray(p.T)
    own = columns[y, np.arange(n)]
    columns.sort(axis=1)
    opens = sorted_tie_starts(columns)
    return [reference_class_points(columns[j], opens[j], own[y == j]) for j in range(k)]


def cascading_columns(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores whose positives fall as the score rises in long runs (every class pools far back
    after the vectorised passes, so the stack pass runs), beside random ones."""
    rng = np.random.default_rng(seed)
    p = rng.random((n, k))
    p /= p.sum(axis=1, keepdims=True)
    y = rng.integers(0, k, n)
    # class 0: positive where its score is low, with a rising density of negatives
    order = np.argsort(p[:, 0])
    y[order[: n // 3 : 2]] = 0
    y[order[n // 3 :]] = np.where(y[order[n // 3 :]] == 0, 1, y[order[n // 3 :]])
    return p, y


def assert_same_points(
    fitted: list[tuple[np.ndarray, np.ndarray]], expected: list[tuple[np.ndarray, np.ndarray]]
) -> None:
    assert len(fitted) == len(expected)
    for j, ((x, values), (rx, rvalues)) in enumerate(zip(fitted, expected, strict=True)):
        assert same_bits(x, rx), j
        assert same_bits(values, rvalues), j


@pytest.mark.parametrize("k", [2, 3, 40])
def test_classes_together_are_the_per_class_loop_on_hard_data(k: int) -> None:
    p, y = hard_columns(98 * k + 3000, k, seed=k)
    assert not (y == k - 1).any()  # a class with no positives
    assert_same_points(one_vs_rest_points(np.ascontiguousarray(p.T), y), reference_points(p, y))


def test_classes_together_are_the_per_class_loop_through_the_stack_pass() -> None:
    p, y = cascading_columns(6000, 5, seed=3)
    expected = reference_points(p, y)
    # the stack pass is reached: class 0's pooling is not done after the vectorised passes
    calls: list[int] = []
    original = isotonic._stack_pool

    def counted(*args: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(args[0]))
        return original(*args)

    isotonic._stack_pool = counted
    try:
        fitted = one_vs_rest_points(np.ascontiguousarray(p.T), y)
    finally:
        isotonic._stack_pool = original
    assert calls and max(calls) > 2
    assert_same_points(fitted, expected)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 10_000])
def test_blocks_of_classes_of_any_size_give_the_same_points(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, k = 700, 9
    rng = np.random.default_rng(block)
    z = rng.standard_normal((n, k)) * 2
    z[:50] *= 300  # saturated rows: scores 0 and 1
    z[50:200] = np.round(z[50:200])  # exact ties
    p = torch.softmax(torch.tensor(z), dim=1).numpy().copy()
    y = rng.integers(0, k - 2, n)  # the last two classes without positives
    monkeypatch.setattr(isotonic, "CLASS_BLOCK_SCORES", block * n)
    assert_same_points(one_vs_rest_points(np.ascontiguousarray(p.T), y), reference_points(p, y))


def test_synthetic_benchmark_data_at_many_classes() -> None:
    rng = np.random.default_rng(11)
    n, k = 3000, 300
    z = rng.standard_normal((n, k)) * 2.5
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += 3.0
    p = torch.softmax(torch.tensor(z), dim=1).numpy().copy()
    assert_same_points(one_vs_rest_points(np.ascontiguousarray(p.T), y), reference_points(p, y))


def test_segments_never_pool_across_their_border() -> None:
    # each segment alone is non-decreasing; together they fall at every border
    targets = np.array([0.5, 0.9, 0.1, 0.2, 0.0])
    weights = np.array([1.0, 2.0, 1.0, 4.0, 1.0])  # t·w/w is t
    starts = np.array([True, False, True, False, True])
    np.testing.assert_array_equal(pool_adjacent_violators(targets, weights, starts), targets)
    # one segment: all pooled, (0.5·1 + 0.9·2 + 0.1·1 + 0.2·4 + 0)/9 = 3.2/9
    np.testing.assert_allclose(pool_adjacent_violators(targets, weights), 3.2 / 9, rtol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_segmented_pooling_is_each_segment_alone(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, 12)
    pieces = []
    for length in lengths:  # falling trends need a pass per block: the stack pass runs
        trend = np.linspace(1, 0, length) if rng.random() < 0.5 else np.linspace(0, 1, length)
        pieces.append(np.clip(trend + rng.normal(0, 0.3, length), 0, 1))
    weights = [rng.integers(1, 5, length).astype(np.float64) for length in lengths]
    starts = np.zeros(int(lengths.sum()), dtype=bool)
    starts[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
    together = pool_adjacent_violators(np.concatenate(pieces), np.concatenate(weights), starts)
    alone = np.concatenate([reference_pool(t, w) for t, w in zip(pieces, weights, strict=True)])
    assert same_bits(together, alone)
    assert same_bits(
        pool_adjacent_violators(pieces[0], weights[0]), reference_pool(pieces[0], weights[0])
    )


def test_one_and_two_samples_by_hand() -> None:
    # one sample of class 0 at uniform scores: one point per class, its target
    fitted = one_vs_rest_points(np.full((3, 1), 1 / 3), np.array([0]))
    assert [(x.tolist(), v.tolist()) for x, v in fitted] == [
        ([1 / 3], [1.0]),
        ([1 / 3], [0.0]),
        ([1 / 3], [0.0]),
    ]
    # two samples, each right with the higher score: two points per class, 0 then 1
    p = np.array([[0.25, 0.75], [0.75, 0.25]])
    fitted = one_vs_rest_points(np.ascontiguousarray(p.T), np.array([1, 0]))
    for x, values in fitted:
        assert x.tolist() == [0.25, 0.75]
        assert values.tolist() == [0.0, 1.0]
