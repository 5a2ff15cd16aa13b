"""``py:pkg.mod:fn``: a dataset made by your own code, ``fn()`` returning a Dataset of
``(x, y)`` pairs or a tuple of tensors ``(x, y)``. Calling it runs that code, so it needs
``--trust-checkpoint``.

Whatever that code raises (the call, the Dataset's ``__len__`` or ``__getitem__``, its
``targets`` or ``classes``) is the data's error, not curvcal's: an
:class:`~curvcal.errors.InputError` naming ``--data`` and the sample, exit 2, never an
internal error. The Dataset is read through :class:`FactoryDataset`, which checks each item it
hands on (a pair whose ``x`` is numbers and whose ``y`` is the label ``targets`` gave)."""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset

from curvcal.errors import CurvcalError, InputError, TrustError
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
    produced = _users(what, f"calling {function_name}()", factory)
    if (
        isinstance(produced, tuple)
        and len(produced) == 2
        and all(isinstance(t, torch.Tensor) for t in produced)
    ):
        pair, labels, description, names = tensor_pair(produced[0], produced[1], options, what)
        dataset: Dataset[Any] = pair
        classes = None
    else:
        if not (hasattr(produced, "__getitem__") and hasattr(produced, "__len__")):
            raise InputError(
                what, f"returned a {type(produced).__name__}, not a Dataset or a tuple (x, y)"
            )
        if options.mean is not None or options.std is not None:
            raise InputError("--mean/--std", "do not apply to a py: Dataset; normalise in it")
        items = FactoryDataset(produced, what)
        labels = items.labels = _dataset_labels(items, what)
        dataset = items
        description, names = None, ("as returned",)
        classes = _users(what, "reading its classes", lambda: getattr(produced, "classes", None))
        if classes is not None and not isinstance(classes, Sized):
            raise InputError(
                what,
                f"its classes attribute is of type {type(classes).__name__}, not a list of "
                "class names",
            )
    return loaded_data(
        dataset, options.spec, labels, classes=classes, normalisation=description, transforms=names
    )


Result = TypeVar("Result")


def _users(what: str, doing: str, call: Callable[[], Result]) -> Result:
    """``call()``, which runs the user's code: what it raises is an :class:`InputError`
    naming ``what`` and what was being done (an error of curvcal's own passes unchanged)."""
    try:
        return call()
    except CurvcalError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split())
        said = f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__
        raise InputError(what, f"{doing} failed: {said[:300]}") from exc


class FactoryDataset(Dataset[tuple[Any, int]]):
    """A ``py:`` factory's Dataset, read so that what its code raises, or an item that is not
    ``(x, y)`` with ``x`` numbers and ``y`` one integer (the label its ``targets`` gave for it,
    when it has them), is an :class:`InputError` naming ``--data`` and the sample."""

    def __init__(self, inner: Any, what: str) -> None:
        self.inner = inner
        self.what = what
        length = _users(what, "asking its length", lambda: len(inner))
        self.length = int(length)
        #: every sample's label, once read (:func:`_dataset_labels`); items are checked against it
        self.labels: torch.Tensor | None = None
        collate = getattr(inner, "collate", None)
        if collate is not None:
            self.collate = collate  # read by iter_batches (a dataset that pads its own batches)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        item = _users(self.what, f"reading sample {index}", lambda: self.inner[index])
        if hasattr(self, "collate"):
            return item  # its own collate reads the items
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise InputError(self.what, f"sample {index} is not a pair (x, y)")
        x = _users(self.what, f"reading x of sample {index}", lambda: torch.as_tensor(item[0]))
        if x.dtype == torch.bool or x.is_complex():
            raise InputError(self.what, f"x of sample {index} has dtype {x.dtype}, not numbers")
        label = _label(item[1], self.what, index)
        if self.labels is not None and label != int(self.labels[index]):
            raise InputError(
                self.what,
                f"sample {index} has label {label} but its targets say {int(self.labels[index])}",
                "make the targets the labels the items give",
            )
        return x, label


def _label(value: Any, what: str, index: int) -> int:
    """One sample's label as an int; an :class:`InputError` naming the sample when it is not one
    whole number."""
    try:
        number = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        number = None
    if number is None or number.numel() != 1 or number.dtype == torch.bool:
        raise InputError(what, f"sample {index} has label {value!r}, not one integer class")
    return int(as_labels(number.reshape(1), f"{what} (sample {index})")[0])


def _dataset_labels(dataset: FactoryDataset, what: str) -> torch.Tensor:
    """The dataset's ``targets`` (as many as it has samples), else the ``y`` of every item."""
    targets = _users(what, "reading its targets", lambda: getattr(dataset.inner, "targets", None))
    if targets is not None:
        labels = as_labels(
            _users(what, "reading its targets", lambda: torch.as_tensor(targets)), what
        )
        if labels.shape[0] != len(dataset):
            raise InputError(
                what, f"has {len(dataset)} samples but {labels.shape[0]} targets (labels)"
            )
        return labels
    read = [int(dataset[index][1]) for index in range(len(dataset))]
    return torch.tensor(read, dtype=torch.int64)
