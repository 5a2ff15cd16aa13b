"""The bundled digits demo: checkpoint and held-out data load and fit together."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from curvcal.assets import demo_checkpoint, demo_data
from curvcal.load.data import load_dataset
from curvcal.load.datasets.batches import iter_batches
from curvcal.load.datasets.labels import check_labels
from curvcal.load.files.tensorfile import read_safetensors_metadata
from curvcal.models import DigitsCNN
from curvcal.settings.data import DataSettings


def test_assets_exist_and_name_the_architecture() -> None:
    assert demo_checkpoint().is_file() and demo_data().is_file()
    meta = read_safetensors_metadata(demo_checkpoint())
    assert meta["curvcal.arch"] == "curvcal:DigitsCNN"
    assert json.loads(meta["curvcal.arch_kwargs"]) == {}
    assert meta["curvcal.loss"] == "ce" and float(meta["curvcal.gamma"]) == 0.0
    data_meta = read_safetensors_metadata(demo_data())
    assert data_meta["curvcal.dataset"] == meta["curvcal.dataset"] == "sklearn-digits"
    # the data were standardised with the same numbers the checkpoint records
    assert json.loads(data_meta["curvcal.normalisation"]) == json.loads(
        meta["curvcal.normalisation"]
    )


def test_bundled_checkpoint_is_accurate_on_held_out_digits() -> None:
    model = DigitsCNN()
    model.load_state_dict(load_file(str(demo_checkpoint())))
    model.eval()
    data = load_dataset(DataSettings(data="curvcal:digits"))
    check_labels(data, 10)
    split = json.loads(read_safetensors_metadata(demo_data())["curvcal.split"])
    assert data.n_samples == split["n_held_out"]
    # every class of the 10 digits is present in the held-out split
    assert torch.bincount(data.labels, minlength=10).min() > 0
    correct = 0
    with torch.no_grad():
        for x, y in iter_batches(data.dataset, 256):
            correct += int((model(x).argmax(dim=1) == y).sum())
    assert correct / data.n_samples > 0.9
