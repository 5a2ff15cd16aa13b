"""A loaded dataset: its ``(x, y)`` items, labels and provenance."""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class LoadedData:
    """A dataset of ``(x, y: int)`` items with its labels and provenance (``x`` a tensor, or
    token id lists that the dataset's ``collate`` pads, for text).

    ``num_classes`` comes from the dataset when it knows it (``num_classes_source ==
    "dataset"``: torchvision classes, folder classes, the bundled digits) and is otherwise
    ``max(label) + 1`` (``"inferred"``), which may undercount classes absent from the data.

    ``chosen``: the preprocessing curvcal chose on its own (a normalisation preset, a model
    config's mean/std or resize and crop), one sentence each, for the report's header and
    stderr; ``warnings``: what the user should check (a model config's input size that
    differs from the images').
    """

    dataset: Dataset[Any]
    spec: str
    n_samples: int
    num_classes: int | None
    labels: torch.Tensor
    files: tuple[Path, ...]
    num_classes_source: str = "inferred"
    normalisation: dict[str, Any] | None = None
    transforms: tuple[str, ...] = ()
    subset: dict[str, Any] | None = field(default=None)
    text: dict[str, Any] | None = field(default=None)
    chosen: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def modality(self) -> str:
        """``text`` for tokenized texts, ``image`` for everything else (tensors included)."""
        return "text" if self.text is not None else "image"

    def describe(self) -> dict[str, Any]:
        """JSON-ready description: spec, N, classes, normalisation, transforms, subset, text
        (columns, max_length, truncated count, tokenizer source; text data only), and the
        files read (path, size, SHA-256)."""
        from curvcal.load.checkpoints.digest import file_info

        return {
            **({"text": self.text} if self.text is not None else {}),
            "spec": self.spec,
            "n_samples": self.n_samples,
            "num_classes": self.num_classes,
            "num_classes_source": self.num_classes_source,
            "normalisation": self.normalisation,
            "transforms": list(self.transforms),
            **({"chosen_preprocessing": list(self.chosen)} if self.chosen else {}),
            "subset": self.subset,
            "files": [file_info(path) for path in self.files],
        }


def loaded_data(
    dataset: Dataset[Any],
    spec: str,
    labels: torch.Tensor,
    files: tuple[Path, ...] = (),
    classes: Sized | None = None,
    **provenance: Any,
) -> LoadedData:
    """``dataset`` (N = its length) read for ``--data spec`` from ``files``: ``num_classes`` is
    ``len(classes)`` when the dataset names its classes (source ``"dataset"``), else
    ``max(label) + 1`` (``"inferred"``; None for no labels). ``provenance``: the other fields
    of :class:`LoadedData` (normalisation, transforms, text, chosen, warnings)."""
    num_classes: int | None = None
    if classes:
        num_classes = len(classes)
    elif labels.numel():
        num_classes = int(labels.max()) + 1
    return LoadedData(
        dataset=dataset,
        spec=spec,
        n_samples=len(dataset),  # type: ignore[arg-type]
        num_classes=num_classes,
        labels=labels,
        files=files,
        num_classes_source="dataset" if classes else "inferred",
        **provenance,
    )
