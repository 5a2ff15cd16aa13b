"""``py:pkg.mod:fn``: a dataset made by your own code, ``fn()`` returning a Dataset of
``(x, y)`` pairs or a tuple of tensors ``(x, y)``. Calling it runs that code, so it needs
``--trust-checkpoint``."""

from __future__ import annotations

from typing import Any

import torch

from curvcal.errors import InputError, TrustError
from curvcal.inputs import import_recorded
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import reject_image_transforms
from curvcal.load.datasets.tensor_dataset import tensor_pair
from curvcal.load.files.tensorfile import as_labels
from curvcal.settings.data import DataSettings


def load_py_dataset(options: DataSettings) -> LoadedData:
    """What the named function returns: tensors are checked (and normalised with
    ``--mean``/``--std``) like a tensor file's; a Dataset is taken as returned."""
    target = options.spec[len("py:") :]
    what = f"--data {options.spec}"
    module_name, _, function_name = target.rpartition(":")
    if not module_name or not function_name:
        raise InputError(what, "is not of the form py:package.module:function")
    if not options.trust_checkpoint:
        raise TrustError(
            what,
            f"calls {function_name}() from {module_name}, which runs code",
            "pass --trust-checkpoint if you trust that module",
        )
    reject_image_transforms(options, "py: factories")
    try:
        module = import_recorded(module_name, "--data module source")
    except ImportError as exc:
        raise InputError(
            what, f"cannot import {module_name} ({exc})", "is it on PYTHONPATH?"
        ) from exc
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise InputError(what, f"{module_name} has no function {function_name}")
    produced = factory()
    if (
        isinstance(produced, tuple)
        and len(produced) == 2
        and all(isinstance(t, torch.Tensor) for t in produced)
    ):
        dataset, labels, description, names = tensor_pair(produced[0], produced[1], options, what)
        classes = None
    else:
        if not (hasattr(produced, "__getitem__") and hasattr(produced, "__len__")):
            raise InputError(
                what, f"returned a {type(produced).__name__}, not a Dataset or a tuple (x, y)"
            )
        if options.mean is not None or options.std is not None:
            raise InputError("--mean/--std", "do not apply to a py: Dataset; normalise in it")
        dataset = produced
        labels = _dataset_labels(dataset, what)
        description, names = None, ("as returned",)
        classes = getattr(dataset, "classes", None)
    return loaded_data(
        dataset, options.spec, labels, classes=classes, normalisation=description, transforms=names
    )


def _dataset_labels(dataset: Any, what: str) -> torch.Tensor:
    """The dataset's ``targets``, else the ``y`` of every item."""
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return as_labels(torch.as_tensor(targets), what)
    labels = []
    for index in range(len(dataset)):
        item = dataset[index]
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise InputError(what, f"item {index} is not a pair (x, y)")
        labels.append(torch.as_tensor(item[1]))
    return as_labels(torch.stack(labels) if labels else torch.zeros(0, dtype=torch.int64), what)
