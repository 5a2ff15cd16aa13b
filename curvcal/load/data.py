"""Dataset specs into datasets of ``(x, y)`` pairs.

Spec forms (``--data SPEC``):

=========================  ==============================================================
``tv:NAME[:train|test]``   a torchvision dataset (cifar10, cifar100, mnist, fashionmnist,
                           svhn) under ``--data-root``; the ``test`` split by default;
                           fetched only with ``--download``
``folder:PATH``            an image folder, one sub-folder per class (ImageFolder layout)
``PATH.pt|.npz|.safetensors``  tensors ``x`` (float, N first) and ``y`` (integer labels)
``py:pkg.mod:fn``          ``fn()`` returns a Dataset of ``(x, y)`` or a tuple ``(x, y)``;
                           runs your code, so it needs trust (``--trust-checkpoint``)
``curvcal:digits``         the bundled held-out split of scikit-learn's digits
``PATH.jsonl|.csv|.parquet``  texts and labels for a text classifier (:mod:`curvcal.load.texts.text`);
                           also a ``datasets`` ``save_to_disk`` folder, ``DIR[:split]``; for
                           a causal language model, multiple-choice rows
                           (:mod:`curvcal.load.texts.choices`)
=========================  ==============================================================

Image datasets are converted to ``[0, 1]`` tensors and normalised per channel,
``x' = (x - mean) / std``, with the preset of
:data:`curvcal.load.datasets.preprocessing.NORMALISATION_PRESETS` unless ``mean`` or ``std`` is given.
Tensor files and ``curvcal:digits`` are taken as stored (already preprocessed); a given
``mean``/``std`` is applied to them over dimension 1 (channels).

Batches of a loaded dataset: :mod:`curvcal.load.datasets.batches`; its labels checked against a model
and split: :mod:`curvcal.load.datasets.labels`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Subset

from curvcal.errors import InputError
from curvcal.load.datasets.image_folder import load_image_folder
from curvcal.load.datasets.loaded_data import LoadedData
from curvcal.load.datasets.py_dataset import load_py_dataset
from curvcal.load.datasets.tensor_dataset import load_bundled, load_tensor_file
from curvcal.load.datasets.torchvision_dataset import load_torchvision
from curvcal.load.files.tensorfile import is_tensor_file
from curvcal.load.texts.text_dataset import load_text
from curvcal.settings.data import NO_RESIZE, DataSettings

if TYPE_CHECKING:
    from curvcal.load.texts.text import TextModel


def load_dataset(
    options: DataSettings,
    model_preprocessing: Mapping[str, Any] | None = None,
    text_model: TextModel | None = None,
) -> LoadedData:
    """Resolve ``options.spec`` into a :class:`LoadedData`, checking it before any work.

    ``model_preprocessing`` is what the model expects
    (:attr:`curvcal.load.checkpoints.loaded_model.LoadedModel.preprocessing`: ``mean``, ``std``,
    ``input_size``, ``crop_pct``, ``source``): image datasets (``tv:``, ``folder:``) use it in
    place of their preset, and for resize/crop, when ``mean``/``std``/``resize``/``crop`` are
    not given. Tensor files are taken as already preprocessed and never use it.

    Checks: at least one sample, integer non-negative labels, as many labels as inputs, finite
    inputs (tensor files), a sane ``max_samples``. ``max_samples`` keeps a random subset drawn
    with ``subset_seed`` (the same seed gives the same subset), in ascending index order.

    Text specs (``.jsonl``, ``.csv``, ``.parquet``, a ``save_to_disk`` folder) are tokenized
    with the tokenizer of ``options.tokenizer`` or of ``text_model``'s folder, and their label
    names mapped through its ``label2id``.
    """
    _check_options(options)
    spec = options.spec
    from curvcal.load.texts.text import is_text_spec

    if spec.startswith("tv:"):
        data = load_torchvision(options, model_preprocessing)
    elif spec.startswith("folder:"):
        data = load_image_folder(options, model_preprocessing)
    elif spec.startswith("py:"):
        data = load_py_dataset(options)
    elif spec.startswith("curvcal:"):
        data = load_bundled(options)
    elif is_text_spec(spec) and text_model is not None and text_model.scores_choices:
        from curvcal.load.texts.choices import load_choices

        data = load_choices(options, text_model)
    elif is_text_spec(spec):
        data = load_text(options, text_model)
    else:
        path = Path(spec).expanduser()
        if not is_tensor_file(path):
            raise InputError(
                f"--data {spec}",
                "is not a dataset spec",
                "use tv:NAME[:train|test], folder:PATH, PATH.pt|.npz|.safetensors, "
                "PATH.jsonl|.csv|.parquet, py:module:function or curvcal:digits",
            )
        data = load_tensor_file(options, path, spec)
    if data.n_samples == 0:
        raise InputError(f"--data {spec}", "holds no samples")
    return _take_subset(data, options)


def _check_options(options: DataSettings) -> None:
    for name, values in (("--mean", options.mean), ("--std", options.std)):
        if values is not None and len(values) == 0:
            raise InputError(name, "needs at least one value")
    if (
        options.mean is not None
        and options.std is not None
        and len(options.mean) != len(options.std)
    ):
        raise InputError(
            "--mean/--std",
            f"have {len(options.mean)} and {len(options.std)} values; give one per channel",
        )
    if options.std is not None and any(not s > 0 for s in options.std):
        raise InputError("--std", f"{options.std} has a value that is not > 0")
    for name, value, least in (
        ("--resize", options.resize, NO_RESIZE),
        ("--crop", options.crop, NO_RESIZE),
        ("--max-samples", options.max_samples, 1),
        ("--max-length", options.max_length, 1),
    ):
        if value is not None and value < least:
            raise InputError(name, f"is {value}; it must be >= {max(least, 1)}")


def _take_subset(data: LoadedData, options: DataSettings) -> LoadedData:
    """``--max-samples`` of the samples, drawn with ``--subset-seed``, in ascending order."""
    if options.max_samples is None or options.max_samples >= data.n_samples:
        return data
    generator = torch.Generator().manual_seed(options.subset_seed)
    chosen = torch.randperm(data.n_samples, generator=generator)[: options.max_samples]
    indices = torch.sort(chosen).values
    return dataclasses.replace(
        data,
        dataset=Subset(data.dataset, indices.tolist()),
        n_samples=len(indices),
        labels=data.labels[indices],
        subset={
            "max_samples": options.max_samples,
            "subset_seed": options.subset_seed,
            "of": data.n_samples,
        },
    )
