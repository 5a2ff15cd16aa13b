"""The command line's pass and the API's `predict` run one inference loop: same logits, same
checks on what the model returns."""

from __future__ import annotations

import pytest
import torch

from curvcal.calibration.inference import predict
from curvcal.errors import NumericalError
from curvcal.pipeline.inference import predict_logits


def test_pipeline_and_api_give_the_same_rows_as_one_forward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x, y = torch.randn(11, 4), torch.arange(11) % 3
    batches = [(x[i : i + 5], y[i : i + 5]) for i in range(0, 11, 5)]  # 5, 5, 1
    piped, piped_labels = predict_logits(model.eval(), batches, torch.device("cpu"))
    api, api_labels = predict(model, batches)
    with torch.no_grad():
        expected = model(x)
    assert torch.equal(piped, api) and torch.equal(piped_labels, api_labels)
    torch.testing.assert_close(piped, expected, rtol=0, atol=1e-6)
    assert torch.equal(piped_labels, y)


class _Duplicates(torch.nn.Module):
    """Returns one more row than it was given: logits that cannot be paired with the labels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x[:1]])


def test_an_output_with_another_row_count_is_refused_naming_the_batch() -> None:
    batches = [(torch.zeros(2, 3), torch.zeros(2)), (torch.zeros(2, 3), torch.zeros(2))]
    with pytest.raises(
        NumericalError, match=r"batch 0: expected logits of shape \(2, classes\), got \(3, 3\)"
    ):
        predict_logits(_Duplicates(), batches, torch.device("cpu"))
