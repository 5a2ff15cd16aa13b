"""looks_like_probabilities: the test --input-kind probs applies, asked of scores read as logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration.inputs import PROB_SUM_TOL, looks_like_probabilities


def test_softmax_rows_look_like_probabilities() -> None:
    probabilities = torch.softmax(torch.randn(1000, 7, dtype=torch.float64), dim=1)
    assert looks_like_probabilities(probabilities)
    assert looks_like_probabilities(probabilities.numpy())


@pytest.mark.parametrize(
    "scores",
    [
        [[0.5, 0.6], [0.3, 0.7]],  # a row sums to 1.1
        [[1.2, -0.2], [0.3, 0.7]],  # sums to 1 but a negative entry
        [[float("nan"), 1.0], [0.3, 0.7]],
        [[2.0, 1.0], [0.1, 3.0]],  # ordinary logits
    ],
)
def test_other_scores_do_not(scores: list[list[float]]) -> None:
    assert not looks_like_probabilities(np.asarray(scores))


def test_tolerance_is_that_of_input_kind_probs() -> None:
    inside = torch.tensor([[0.5, 0.5 + PROB_SUM_TOL / 2]], dtype=torch.float64)
    outside = torch.tensor([[0.5, 0.5 + PROB_SUM_TOL * 2]], dtype=torch.float64)
    assert looks_like_probabilities(inside) and not looks_like_probabilities(outside)


def test_the_last_chunk_is_checked() -> None:
    probabilities = torch.softmax(torch.randn(200_000, 2, dtype=torch.float64), dim=1)
    probabilities[-1] = torch.tensor([0.9, 0.9])
    assert not looks_like_probabilities(probabilities)
