"""The per-map benchmark's probability difference for peers that return N values: netcal's
binary maps give the probability of class 1, the top-label peers the top class's."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_calibration")


def test_binary_peer_output_is_the_probability_of_class_one(bench: ModuleType) -> None:
    ours = torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64)
    assert bench._max_difference(ours, np.array([0.1, 0.7])) == 0.0
    assert bench._max_difference(ours, np.array([0.9, 0.7])) == pytest.approx(0.8)


def test_top_label_peer_output_is_the_top_class_probability(bench: ModuleType) -> None:
    ours = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]], dtype=torch.float64)
    assert bench._max_difference(ours, np.array([0.5, 0.6]), top_label=True) == 0.0
    assert bench._max_difference(ours, np.array([0.5, 0.6])) is None  # K = 3, not top-label
    assert set(bench.TOP_LABEL_MAPS) <= set(bench.PEER_MAPS)
