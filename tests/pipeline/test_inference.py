"""The inference pass concatenates exactly what the model returns, batch by batch."""

from __future__ import annotations

import pytest
import torch

from curvcal.errors import NumericalError
from curvcal.pipeline.inference import predict_logits


def test_logits_equal_one_full_forward_with_uneven_batches() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).eval()
    x, y = torch.randn(10, 4), torch.arange(10) % 3
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 10, 4)]
    seen: list[int] = []
    logits, labels = predict_logits(model, batches, torch.device("cpu"), seen.append)
    torch.testing.assert_close(logits, model(x).detach(), rtol=0, atol=1e-6)
    assert torch.equal(labels, y) and seen == [4, 4, 2]


def test_no_batches_gives_empty_tensors() -> None:
    logits, labels = predict_logits(torch.nn.Linear(2, 2), [], torch.device("cpu"))
    assert logits.numel() == 0 and labels.numel() == 0


def test_non_logit_output_is_a_clear_error() -> None:
    model = torch.nn.Flatten(0)
    with pytest.raises(NumericalError, match="expected logits"):
        predict_logits(model, [(torch.zeros(2, 3), torch.zeros(2))], torch.device("cpu"))
