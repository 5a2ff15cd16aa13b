""":func:`curvcal.calibration.isotonic.sorted_tie_starts` with its gap pass in cache-sized
blocks (the runs' ends found block by block from where the marks change) against the function
it replaced, copied here verbatim as the reference (gaps in blocks of 2^20, then the runs'
ends over the whole array), bit for bit: on tied and saturated softmax columns, on rows of
sub-resolution chains, with blocks that cut runs and rows anywhere, and on the border cases
(one score, one score a row, no scores, a row of equal scores, a run reaching the end)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration import isotonic
from curvcal.calibration.isotonic import (
    FRONTIER_RUNS,
    TIE_RESOLUTION,
    _next_group,
    _walk_run,
    sorted_tie_starts,
)
from tests.calibration.test_isotonic_ovr_paths import chained_rows, hard_columns
from tests.calibration.test_isotonic_ties import sequential_starts

PREVIOUS_GAP_BLOCK = 1 << 20


def previous_sorted_tie_starts(rows: np.ndarray) -> np.ndarray:
    """The replaced function, verbatim but for the block's name."""
    n_rows, n = rows.shape
    x = rows.reshape(-1)
    start = np.empty(len(x), dtype=bool)
    for low in range(0, len(x), PREVIOUS_GAP_BLOCK):
        high = min(low + PREVIOUS_GAP_BLOCK, len(x))
        gap = x[low + 1 : high + 1] - x[low : min(high, len(x) - 1)]
        np.greater_equal(gap, TIE_RESOLUTION, out=start[low + 1 : high + 1])
    if len(x):
        start[::n] = True  # each row's first score
    # runs of small gaps [first, end) of two or more scores, and those spanning the resolution
    inner = ~start
    first = np.flatnonzero(start[:-1] & inner[1:])
    end = np.flatnonzero(inner[:-1] & start[1:]) + 1
    if len(end) < len(first):
        end = np.append(end, len(x))
    wide = x[end - 1] - x[first] >= TIE_RESOLUTION
    first, end = first[wide], end[wide]
    opened = []
    while len(first) >= FRONTIER_RUNS:
        first = _next_group(x, first, end)
        more = first < end
        first, end = first[more], end[more]
        opened.append(first)
    for run_first, run_end in zip(first.tolist(), end.tolist(), strict=True):
        opened.append(run_first + _walk_run(x[run_first:run_end]))
    if opened:
        start[np.concatenate(opened)] = True
    return start.reshape(n_rows, n)


def sorted_columns(p: np.ndarray) -> np.ndarray:
    columns = np.ascontiguousarray(p.T)
    columns.sort(axis=1)
    return columns


def softmax_columns(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted K×N columns of over-confident softmax probabilities (most of them tiny, in runs of
    sub-resolution gaps spanning many groups, as at 50,000 × 1,000), a tenth saturated."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=generator, dtype=torch.float64) * 2.5 * (1 + np.log(k) / 2)
    z[: n // 10] *= 50
    return sorted_columns(torch.softmax(z, dim=1).numpy())


@pytest.mark.parametrize("block", [1, 7, 64, 1000, 1 << 15])
@pytest.mark.parametrize("case", ["hard", "softmax", "chains"])
def test_blocks_anywhere_give_the_previous_marks(
    monkeypatch: pytest.MonkeyPatch, block: int, case: str
) -> None:
    if case == "hard":
        rows = sorted_columns(hard_columns(98 * 40 + 3000, 40, seed=5)[0])
    elif case == "softmax":
        rows = softmax_columns(3000, 60, seed=2)
    else:
        rows = chained_rows(np.random.default_rng(3), 3 * FRONTIER_RUNS, 700)
    expected = previous_sorted_tie_starts(rows)
    assert expected.sum() > 100 and (~expected).sum() > 100
    monkeypatch.setattr(isotonic, "GAP_BLOCK", block)
    got = sorted_tie_starts(rows)
    assert got.dtype == np.bool_ and got.shape == rows.shape
    np.testing.assert_array_equal(got, expected)


def test_the_softmax_columns_hold_the_runs_the_blocks_cut() -> None:
    """The softmax case is the one the speed-up is for: many scores lie in runs of
    sub-resolution gaps that span more than the resolution (several groups each)."""
    rows = softmax_columns(3000, 60, seed=2)
    gaps = np.diff(rows, axis=1)
    assert (gaps < TIE_RESOLUTION).mean() > 0.1
    starts = sorted_tie_starts(rows)
    assert (starts & np.concatenate([np.zeros((60, 1), bool), gaps < TIE_RESOLUTION], 1)).any()
    for row, marks in zip(rows[:5], starts[:5], strict=True):  # the rule, score by score
        np.testing.assert_array_equal(marks, sequential_starts(row))


@pytest.mark.parametrize(
    "rows",
    [
        np.zeros((0, 5)),  # no rows
        np.zeros((4, 0)),  # rows of no scores
        np.array([[0.25]]),  # one score
        np.array([[0.1], [0.2], [0.2]]),  # one score a row: each opens its group
        np.zeros((3, 6)),  # rows of equal scores: one group each
        np.array([[0.0, 4e-16, 8e-16, 1.2e-15, 1.6e-15, 2.0e-15, 2.4e-15]]),  # run to the end
        np.array([[0.1, 0.2, 0.3], [0.3, 0.3 + 4e-16, 0.3 + 1.1e-15]]),  # a run opens a row
    ],
)
def test_the_border_cases_give_the_previous_marks(
    monkeypatch: pytest.MonkeyPatch, rows: np.ndarray
) -> None:
    expected = previous_sorted_tie_starts(np.ascontiguousarray(rows))
    for block in (1, 2, 1 << 15):
        monkeypatch.setattr(isotonic, "GAP_BLOCK", block)
        got = sorted_tie_starts(np.ascontiguousarray(rows))
        assert got.shape == rows.shape
        np.testing.assert_array_equal(got, expected)
    for row, marks in zip(rows, expected, strict=True):
        np.testing.assert_array_equal(marks, sequential_starts(row) if len(row) else marks)
