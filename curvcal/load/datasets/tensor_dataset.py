"""Datasets held as two tensors: ``x`` (float, samples first) and ``y`` (integer labels), from a
``.pt``/``.npz``/``.safetensors`` file (:mod:`curvcal.load.files.tensorfile`) or the bundled
``curvcal:digits``. They are taken as stored (already preprocessed); a given ``--mean``/``--std``
is applied over dimension 1 (channels).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import normalisation, reject_image_transforms
from curvcal.load.files.tensorfile import as_labels, read_tensor_file
from curvcal.settings.data import DataSettings

_BUNDLED = ("digits",)


class TensorPairDataset(Dataset[tuple[torch.Tensor, int]]):
    """``x[i], int(y[i])`` from two tensors with the same first dimension (not copied)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x = x
        self.y = y

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.x[index], int(self.y[index])


def tensor_pair(
    x: torch.Tensor, y: torch.Tensor, options: DataSettings, what: str
) -> tuple[TensorPairDataset, torch.Tensor, dict[str, Any] | None, tuple[str, ...]]:
    """Check ``x``/``y`` and normalise ``x`` when --mean/--std were given."""
    if x.dim() == 0 or not x.is_floating_point():
        raise InputError(
            what,
            f"x must be a floating tensor with samples first, got dtype {x.dtype} "
            f"and shape {tuple(x.shape)}",
            "store preprocessed float inputs",
        )
    labels = as_labels(y, what)
    if x.shape[0] != labels.shape[0]:
        raise InputError(what, f"x has {x.shape[0]} samples but y has {labels.shape[0]} labels")
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    finite = torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1) if x.numel() else None
    if finite is not None and not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise InputError(what, f"sample {row} of x has a NaN or infinite value")
    norm = normalisation(options, None, x.shape[1] if x.dim() > 1 else None)
    names: tuple[str, ...] = ("as stored",)
    description = None
    if norm is not None:
        mean, std, description = norm
        shape = (1, -1) + (1,) * max(x.dim() - 2, 0)
        x = (x - torch.tensor(mean, dtype=x.dtype).view(shape)) / torch.tensor(
            std, dtype=x.dtype
        ).view(shape)
        names = ("normalise (x - mean) / std",)
    return TensorPairDataset(x, labels), labels, description, names


def load_tensor_file(options: DataSettings, path: Path, spec: str) -> LoadedData:
    """The tensors named ``--x-key`` and ``--y-key`` in the file at ``path``."""
    reject_image_transforms(options, "tensor files")
    tensors = read_tensor_file(path)
    for key, option in ((options.x_key, "--x-key"), (options.y_key, "--y-key")):
        if key not in tensors:
            raise InputError(
                str(path),
                f"has no tensor named '{key}' (it has: {', '.join(sorted(tensors)) or 'none'})",
                f"name the tensor with {option}",
            )
    dataset, labels, description, names = tensor_pair(
        tensors[options.x_key], tensors[options.y_key], options, str(path)
    )
    return loaded_data(dataset, spec, labels, (path,), normalisation=description, transforms=names)


def load_bundled(options: DataSettings) -> LoadedData:
    """``curvcal:digits``: the held-out split of scikit-learn's digits shipped with curvcal."""
    name = options.spec[len("curvcal:") :]
    if name not in _BUNDLED:
        raise InputError(
            f"--data {options.spec}",
            "is not a bundled dataset",
            f"bundled: {', '.join('curvcal:' + n for n in _BUNDLED)}",
        )
    from curvcal.assets import demo_data

    data = load_tensor_file(
        DataSettings(data=options.spec, mean=options.mean, std=options.std),
        demo_data(),
        options.spec,
    )
    return dataclasses.replace(data, num_classes=10, num_classes_source="dataset")
