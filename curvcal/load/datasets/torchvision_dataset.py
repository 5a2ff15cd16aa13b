"""``tv:NAME[:train|test]``: a torchvision dataset under ``--data-root``, fetched only with
``--download``, its images preprocessed by :func:`curvcal.load.datasets.preprocessing.image_transform`
with the dataset's normalisation preset."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import image_transform
from curvcal.load.files.tensorfile import as_labels
from curvcal.paths import readable_folder
from curvcal.settings.data import DataSettings

_TV_CHANNELS = {"cifar10": 3, "cifar100": 3, "mnist": 1, "fashionmnist": 1, "svhn": 3}
_TV_CLASS_NAMES = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "mnist": "MNIST",
    "fashionmnist": "FashionMNIST",
    "svhn": "SVHN",
}
#: Native image side of the torchvision datasets (all square).
_TV_SIDE = {"cifar10": 32, "cifar100": 32, "mnist": 28, "fashionmnist": 28, "svhn": 32}


def load_torchvision(options: DataSettings, model: Mapping[str, Any] | None) -> LoadedData:
    """The split (``test`` by default) of the named torchvision dataset; ``model`` is the
    model's recorded preprocessing, used in place of the preset."""
    parts = options.spec.split(":")
    name = parts[1].lower() if len(parts) > 1 else ""
    split = parts[2].lower() if len(parts) > 2 else "test"
    if name not in _TV_CLASS_NAMES or len(parts) > 3:
        raise InputError(
            f"--data {options.spec}",
            "is not a known torchvision dataset",
            f"use tv:NAME[:train|test] with NAME one of {', '.join(_TV_CLASS_NAMES)}",
        )
    if split not in ("train", "test"):
        raise InputError(f"--data {options.spec}", f"unknown split '{split}'", "use train or test")
    import torchvision.datasets

    root = readable_folder((options.data_root or Path("data")).expanduser(), "--data-root folder")
    side = _TV_SIDE[name]
    image = image_transform(options, name, _TV_CHANNELS[name], model, (side, side))
    factory = getattr(torchvision.datasets, _TV_CLASS_NAMES[name])
    split_args: dict[str, Any] = {"split": split} if name == "svhn" else {"train": split == "train"}
    try:
        dataset = factory(
            root=str(root), download=options.download, transform=image.transform, **split_args
        )
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if options.download:
            raise InputError(
                f"--data {options.spec}", f"download into {root} failed ({reason})"
            ) from exc
        if "not found" not in reason.lower():
            raise InputError(
                f"--data {options.spec}", f"cannot be read under --data-root {root} ({reason})"
            ) from exc
        raise InputError(
            f"--data {options.spec}",
            f"not found, or incomplete, under --data-root {root}",
            "pass --download to fetch it, or --data-root to point at it",
        ) from exc
    raw = dataset.labels if name == "svhn" else dataset.targets
    labels = as_labels(torch.as_tensor(raw), f"--data {options.spec}")
    return loaded_data(
        dataset,
        options.spec,
        labels,
        classes=getattr(dataset, "classes", None) or range(10),  # all of them have 10
        **image.provenance(),
    )
