"""recorded_loss: the training loss a checkpoint's metadata records (for `--loss own`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from curvcal.errors import InputError
from curvcal.load.checkpoints.loaded_model import LoadedModel
from curvcal.load.checkpoints.metadata import recorded_loss


def _loaded(metadata: dict[str, str]) -> LoadedModel:
    return LoadedModel(
        module=nn.Linear(2, 2),
        form="safetensors",
        path=Path("model.safetensors"),
        arch=None,
        state_dict_key=None,
        stripped_prefix=None,
        num_classes=2,
        metadata=metadata,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"curvcal.loss": "ce", "curvcal.gamma": "0"}, ("ce", 0.0)),
        ({"curvcal.loss": "cross_entropy"}, ("ce", 0.0)),
        ({"curvcal.loss": "Focal", "curvcal.gamma": "1.5"}, ("focal", 1.5)),
        ({"curvcal.loss": "focal", "curvcal.gamma": "0"}, ("focal", 0.0)),
    ],
)
def test_recorded_losses(metadata: dict[str, str], expected: tuple[str, float]) -> None:
    assert recorded_loss(_loaded(metadata)) == expected


@pytest.mark.parametrize(
    ("metadata", "needle"),
    [
        ({}, "records no training loss"),
        ({"curvcal.loss": "mse"}, "'mse', not a loss curvcal knows"),
        ({"curvcal.loss": "focal"}, "without curvcal.gamma"),
        ({"curvcal.loss": "focal", "curvcal.gamma": "two"}, "not a number"),
        ({"curvcal.loss": "focal", "curvcal.gamma": "-1"}, "must be ≥ 0"),
        ({"curvcal.loss": "focal", "curvcal.gamma": "nan"}, "must be ≥ 0"),
        ({"curvcal.loss": "ce", "curvcal.gamma": "2"}, "loss ce with curvcal.gamma"),
    ],
)
def test_unusable_metadata_names_the_checkpoint(metadata: dict[str, str], needle: str) -> None:
    with pytest.raises(InputError, match=r"^model\.safetensors: ") as caught:
        recorded_loss(_loaded(metadata))
    assert needle in str(caught.value)
