"""check_model_runs: a model that cannot take the data's inputs is an input error, up front."""

from __future__ import annotations

import pytest
import torch

from curvcal.errors import InputError
from curvcal.models import DigitsCNN
from curvcal.pipeline.inference import check_model_runs


def test_wrong_channels_name_the_data_and_the_shape() -> None:
    model = DigitsCNN(num_classes=3, width=1).eval()
    with pytest.raises(InputError, match=r"inputs of shape \(3, 5, 5\)") as refused:
        check_model_runs(model, torch.zeros(3, 5, 5), torch.device("cpu"), "--data d.pt")
    assert refused.value.what == "--data d.pt"


def test_returns_the_number_of_logits_and_leaves_the_model_alone() -> None:
    model = DigitsCNN(num_classes=3, width=1).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert check_model_runs(model, torch.zeros(1, 8, 8), torch.device("cpu"), "--data d") == 3
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_output_that_is_not_logits_is_refused() -> None:
    with pytest.raises(InputError, match="not \\(1, classes\\) logits"):
        check_model_runs(torch.nn.Flatten(0), torch.zeros(2, 2), torch.device("cpu"), "--data d")
