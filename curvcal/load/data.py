"""Dataset specs into datasets of ``(x, y)`` pairs; labels, batching and stratified splits.

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
``PATH.jsonl|.csv|.parquet``  texts and labels for a text classifier (:mod:`curvcal.load.text`);
                           also a ``datasets`` ``save_to_disk`` folder, ``DIR[:split]``
=========================  ==============================================================

Image datasets are converted to ``[0, 1]`` tensors and normalised per channel,
``x' = (x - mean) / std``, with the preset of :data:`NORMALISATION_PRESETS` unless ``mean`` or
``std`` is given. Tensor files and ``curvcal:digits`` are taken as stored (already
preprocessed); a given ``mean``/``std`` is applied to them over dimension 1 (channels).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, Subset

from curvcal.errors import InputError, TrustError
from curvcal.load.tensorfile import as_labels, is_tensor_file, read_tensor_file
from curvcal.paths import readable_file
from curvcal.settings.data import NO_RESIZE, DataSettings

if TYPE_CHECKING:
    from curvcal.load.text import TextModel
    from curvcal.rows import Inputs

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Per-channel (mean, std) of the training images in [0, 1], used unless --mean/--std are given.
NORMALISATION_PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashionmnist": ((0.2860,), (0.3530,)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
}

_TV_CHANNELS = {"cifar10": 3, "cifar100": 3, "mnist": 1, "fashionmnist": 1, "svhn": 3}
_TV_CLASS_NAMES = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "mnist": "MNIST",
    "fashionmnist": "FashionMNIST",
    "svhn": "SVHN",
}
_BUNDLED = ("digits",)
#: Native image side of the torchvision datasets (all square).
_TV_SIDE = {"cifar10": 32, "cifar100": 32, "mnist": 28, "fashionmnist": 28, "svhn": 32}


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
        from curvcal.load.digest import file_info

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


class TensorPairDataset(Dataset[tuple[torch.Tensor, int]]):
    """``x[i], int(y[i])`` from two tensors with the same first dimension (not copied)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x = x
        self.y = y

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.x[index], int(self.y[index])


# ---------------------------------------------------------------------------------------------
# load_dataset


def load_dataset(
    options: DataSettings,
    model_preprocessing: Mapping[str, Any] | None = None,
    text_model: TextModel | None = None,
) -> LoadedData:
    """Resolve ``options.spec`` into a :class:`LoadedData`, checking it before any work.

    ``model_preprocessing`` is what the model expects
    (:attr:`curvcal.load.checkpoint.LoadedModel.preprocessing`: ``mean``, ``std``,
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
    from curvcal.load.text import is_text_spec

    if spec.startswith("tv:"):
        data = _load_torchvision(options, model_preprocessing)
    elif spec.startswith("folder:"):
        data = _load_folder(options, model_preprocessing)
    elif spec.startswith("py:"):
        data = _load_factory(options)
    elif spec.startswith("curvcal:"):
        data = _load_bundled(options)
    elif is_text_spec(spec):
        data = _load_text(options, text_model)
    else:
        path = Path(spec).expanduser()
        if not is_tensor_file(path):
            raise InputError(
                f"--data {spec}",
                "is not a dataset spec",
                "use tv:NAME[:train|test], folder:PATH, PATH.pt|.npz|.safetensors, "
                "PATH.jsonl|.csv|.parquet, py:module:function or curvcal:digits",
            )
        data = _load_tensor_file(options, path, spec)
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
    if options.max_samples is None or options.max_samples >= data.n_samples:
        return data
    generator = torch.Generator().manual_seed(options.subset_seed)
    chosen = torch.randperm(data.n_samples, generator=generator)[: options.max_samples]
    indices = torch.sort(chosen).values
    return LoadedData(
        dataset=Subset(data.dataset, indices.tolist()),
        spec=data.spec,
        n_samples=len(indices),
        num_classes=data.num_classes,
        labels=data.labels[indices],
        files=data.files,
        num_classes_source=data.num_classes_source,
        normalisation=data.normalisation,
        transforms=data.transforms,
        chosen=data.chosen,
        warnings=data.warnings,
        subset={
            "max_samples": options.max_samples,
            "subset_seed": options.subset_seed,
            "of": data.n_samples,
        },
        text=data.text,
    )


def _load_text(options: DataSettings, model: TextModel | None) -> LoadedData:
    from curvcal.load import text

    _reject_image_transforms(options, "text data")
    if options.mean is not None or options.std is not None:
        raise InputError("--mean/--std", "do not apply to text data")
    columns, files, file = text.read_table(options.spec)
    texts = text.as_texts(
        text.text_column(columns, options.text_key, file, "--text-key"), file, options.text_key
    )
    pairs = None
    if options.text_pair_key is not None:
        pairs = text.as_texts(
            text.text_column(columns, options.text_pair_key, file, "--text-pair-key"),
            file,
            options.text_pair_key,
        )
    raw_labels = text.text_column(columns, options.label_key, file, "--label-key")
    labels = text.text_labels(raw_labels, model.label2id if model else {}, file, options.label_key)
    tokenizer, source = text.load_tokenizer(options.tokenizer, model, options.trust_checkpoint)
    if options.max_length is not None:
        max_length, length_source = options.max_length, "--max-length"
    else:
        max_length, length_source = text.default_max_length(tokenizer, model)
    encodings, truncated = text.tokenize(tokenizer, texts, pairs, max_length)
    return LoadedData(
        dataset=text.TextDataset(encodings, labels, tokenizer),
        spec=options.spec,
        n_samples=len(encodings),
        num_classes=int(labels.max()) + 1 if labels.numel() else None,
        labels=labels,
        files=files,
        num_classes_source="inferred",
        transforms=("tokenize", "pad per batch"),
        text={
            "file": file,
            "columns": {
                "text": options.text_key,
                "text_pair": options.text_pair_key,
                "label": options.label_key,
            },
            "n_texts": len(encodings),
            "max_length": max_length,
            "max_length_source": length_source,
            "truncated": truncated,
            "tokenizer": source,
            "tokenizer_class": type(tokenizer).__name__,
        },
    )


def _normalisation(
    options: DataSettings,
    preset: str | None,
    channels: int | None,
    model: Mapping[str, Any] | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...], dict[str, Any]] | None:
    """The (mean, std) to apply and its description; None when nothing is applied. The
    model's own mean/std, when it records them, replace the preset."""
    base = NORMALISATION_PRESETS.get(preset) if preset else None
    if model is not None and "mean" in model and "std" in model:
        base = (tuple(model["mean"]), tuple(model["std"]))
        preset = f"model ({model.get('source', 'its config')})"
    mean = options.mean if options.mean is not None else (base[0] if base else None)
    std = options.std if options.std is not None else (base[1] if base else None)
    if mean is None and std is None:
        return None
    if mean is None:
        mean = (0.0,) * len(std or ())
    if std is None:
        std = (1.0,) * len(mean)
    for values in (mean, std):
        if channels is not None and len(values) not in (1, channels):
            raise InputError(
                "--mean/--std",
                f"have {len(values)} values but --data {options.spec} has {channels} channels",
            )
    if len(mean) != len(std):
        raise InputError(
            "--mean/--std",
            f"give {len(mean)} mean and {len(std)} std values; give one of each per channel",
        )
    overridden = options.mean is not None or options.std is not None
    source = (preset if not overridden else f"{preset} (overridden)") if base else "given"
    return mean, std, {"preset": source, "mean": list(mean), "std": list(std)}


@dataclass(frozen=True)
class _ImageTransform:
    """An image pipeline, its step names, the normalisation record, and what curvcal chose on
    its own (sentences) with the warnings it raises."""

    transform: Any
    names: tuple[str, ...]
    normalisation: dict[str, Any] | None
    chosen: tuple[str, ...]
    warnings: tuple[str, ...]


def _image_transform(
    options: DataSettings,
    preset: str | None,
    channels: int | None,
    model: Mapping[str, Any] | None,
    image_size: tuple[int, int] | None = None,
) -> _ImageTransform:
    """The transform of ``tv:``/``folder:`` images: resize and center-crop (given, or the
    model config's eval transform when neither is given), to ``[0, 1]``, normalise.

    ``image_size`` (height, width) is the images' own size where known: a model config whose
    input size differs from it is a warning (the images are rescaled to what the config says,
    which may not be what the model was trained on)."""
    from torchvision import transforms

    steps: list[Any] = []
    names: list[str] = []
    chosen: list[str] = []
    warnings: list[str] = []
    resize, crop = options.resize, options.crop
    if resize is None and crop is None and model is not None and "input_size" in model:
        # timm's eval transform: resize the short side to side / crop_pct, then center-crop
        crop = int(model["input_size"][-1])
        resize = math.floor(crop / float(model.get("crop_pct", 1.0)))
        source = model.get("source", "the model's config")
        chosen.append(
            f"resize {resize}, center-crop {crop} (from {source}; --resize/--crop choose them)"
        )
        expected = (int(model["input_size"][-2]), int(model["input_size"][-1]))
        if image_size is not None and image_size != expected:
            warnings.append(
                f"--data {options.spec}: images are {_size(image_size)} but {source} says "
                f"the model takes {_size(expected)}, so they are "
                f"{'up' if min(image_size) < min(expected) else 'down'}scaled (resize "
                f"{resize}, center-crop {crop}); pass --resize none to keep them as they "
                "are, or --resize N/--crop N to choose"
            )
    if resize:
        steps.append(transforms.Resize(resize))
        names.append(f"resize {resize}")
    if crop:
        steps.append(transforms.CenterCrop(crop))
        names.append(f"center-crop {crop}")
    steps.append(transforms.ToTensor())
    names.append("to-tensor [0, 1]")
    norm = _normalisation(options, preset, channels, model)
    description = None
    if norm is not None:
        mean, std, description = norm
        steps.append(transforms.Normalize(mean, std))
        names.append("normalise (x - mean) / std")
        if options.mean is None or options.std is None:
            origin = (
                model.get("source", "the model's config")
                if model is not None and "mean" in model and "std" in model
                else f"the {preset} preset"
            )
            chosen.append(
                f"normalisation mean {_numbers(mean)}, std {_numbers(std)} (from {origin}; "
                "--mean/--std choose them)"
            )
    return _ImageTransform(
        transforms.Compose(steps), tuple(names), description, tuple(chosen), tuple(warnings)
    )


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}×{size[1]}"


def _numbers(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def _load_torchvision(options: DataSettings, model: Mapping[str, Any] | None) -> LoadedData:
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

    root = (options.data_root or Path("data")).expanduser()
    side = _TV_SIDE[name]
    image = _image_transform(options, name, _TV_CHANNELS[name], model, (side, side))
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
    classes = getattr(dataset, "classes", None)
    num_classes = len(classes) if classes else 10
    return LoadedData(
        dataset=dataset,
        spec=options.spec,
        n_samples=len(dataset),
        num_classes=num_classes,
        labels=labels,
        files=(),
        num_classes_source="dataset",
        normalisation=image.normalisation,
        transforms=image.names,
        chosen=image.chosen,
        warnings=image.warnings,
    )


class CheckedImages(Dataset[Any]):
    """A torchvision ``ImageFolder`` whose unreadable image (truncated, not an image, no
    permission) is an :class:`InputError` naming the file, and which names the file of any
    sample (:meth:`source_of`)."""

    def __init__(self, folder: Any) -> None:
        self.folder = folder
        self.targets = folder.targets
        self.classes = folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def source_of(self, index: int) -> str:
        return str(self.folder.samples[index][0])

    def __getitem__(self, index: int) -> Any:
        # an image named like one that is a named pipe or a device would block the decoder
        readable_file(Path(self.source_of(index)), "image file")
        try:
            return self.folder[index]
        except (OSError, ValueError, SyntaxError) as exc:  # what PIL raises for a bad file
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if isinstance(exc, PermissionError):
                reason = exc.strerror or reason
            raise InputError(
                self.source_of(index), f"cannot be read as an image ({reason})"
            ) from exc


def _load_folder(options: DataSettings, model: Mapping[str, Any] | None) -> LoadedData:
    from torchvision.datasets import ImageFolder

    path = Path(options.spec[len("folder:") :]).expanduser()
    what = f"--data {options.spec}"
    if not path.is_dir():
        raise InputError(what, f"{path} is not a folder")
    try:
        folder = ImageFolder(str(path))
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(
            what, f"is not an image folder ({reason})", "put images in one sub-folder per class"
        ) from exc
    image = _image_transform(options, "imagenet", 3, model, _first_image_size(folder))
    folder.transform = image.transform
    dataset = CheckedImages(folder)
    labels = as_labels(torch.as_tensor(dataset.targets, dtype=torch.int64), what)
    return LoadedData(
        dataset=dataset,
        spec=options.spec,
        n_samples=len(dataset),
        num_classes=len(dataset.classes),
        labels=labels,
        # the folder, not each image: its digest covers every file's relative name and size,
        # so a report records what was read without hashing a whole image collection
        files=(path,),
        num_classes_source="dataset",
        normalisation=image.normalisation,
        transforms=image.names,
        chosen=image.chosen,
        warnings=image.warnings,
    )


def _first_image_size(folder: Any) -> tuple[int, int] | None:
    """(height, width) of the folder's first image, read from its header; None when it cannot
    be read (the sample's own read then names the file)."""
    from PIL import Image

    if not folder.samples:
        return None
    try:
        with Image.open(folder.samples[0][0]) as picture:
            width, height = picture.size
    except (OSError, ValueError, SyntaxError):
        return None
    return int(height), int(width)


def _reject_image_transforms(options: DataSettings, kind: str) -> None:
    if options.resize is not None or options.crop is not None:
        raise InputError(
            "--resize/--crop", f"apply to tv: and folder: datasets only, not to {kind}"
        )


def _tensor_pair(
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
    norm = _normalisation(options, None, x.shape[1] if x.dim() > 1 else None)
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


def _load_tensor_file(options: DataSettings, path: Path, spec: str) -> LoadedData:
    _reject_image_transforms(options, "tensor files")
    tensors = read_tensor_file(path)
    for key, option in ((options.x_key, "--x-key"), (options.y_key, "--y-key")):
        if key not in tensors:
            raise InputError(
                str(path),
                f"has no tensor named '{key}' (it has: {', '.join(sorted(tensors)) or 'none'})",
                f"name the tensor with {option}",
            )
    dataset, labels, description, names = _tensor_pair(
        tensors[options.x_key], tensors[options.y_key], options, str(path)
    )
    return LoadedData(
        dataset=dataset,
        spec=spec,
        n_samples=len(dataset),
        num_classes=int(labels.max()) + 1 if labels.numel() else None,
        labels=labels,
        files=(path,),
        num_classes_source="inferred",
        normalisation=description,
        transforms=names,
    )


def _load_bundled(options: DataSettings) -> LoadedData:
    name = options.spec[len("curvcal:") :]
    if name not in _BUNDLED:
        raise InputError(
            f"--data {options.spec}",
            "is not a bundled dataset",
            f"bundled: {', '.join('curvcal:' + n for n in _BUNDLED)}",
        )
    from curvcal.assets import demo_data

    data = _load_tensor_file(
        DataSettings(data=options.spec, mean=options.mean, std=options.std),
        demo_data(),
        options.spec,
    )
    return LoadedData(
        dataset=data.dataset,
        spec=data.spec,
        n_samples=data.n_samples,
        num_classes=10,
        labels=data.labels,
        files=data.files,
        num_classes_source="dataset",
        normalisation=data.normalisation,
        transforms=data.transforms,
    )


def _load_factory(options: DataSettings) -> LoadedData:
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
    _reject_image_transforms(options, "py: factories")
    try:
        module = importlib.import_module(module_name)
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
        dataset, labels, description, names = _tensor_pair(produced[0], produced[1], options, what)
        classes = None
    else:
        if not (hasattr(produced, "__getitem__") and hasattr(produced, "__len__")):
            raise InputError(
                what, f"returned a {type(produced).__name__}, not a Dataset or a tuple (x, y)"
            )
        if options.mean is not None or options.std is not None:
            raise InputError("--mean/--std", "do not apply to a py: Dataset; normalise in it")
        dataset = produced
        labels = _factory_labels(dataset, what)
        description, names = None, ("as returned",)
        classes = getattr(dataset, "classes", None)
    num_classes = len(classes) if classes else (int(labels.max()) + 1 if len(labels) else None)
    return LoadedData(
        dataset=dataset,
        spec=options.spec,
        n_samples=len(dataset),
        num_classes=num_classes,
        labels=labels,
        files=(),
        num_classes_source="dataset" if classes else "inferred",
        normalisation=description,
        transforms=names,
    )


def _factory_labels(dataset: Any, what: str) -> torch.Tensor:
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


# ---------------------------------------------------------------------------------------------
# labels, batches, splits


def check_labels(data: LoadedData, num_outputs: int | None, what: str | None = None) -> None:
    """Check the labels against a model with ``num_outputs`` logits.

    Labels must be integers in ``[0, num_outputs)``. When the dataset itself knows its number
    of classes (``num_classes_source == "dataset"``) it must equal ``num_outputs``. Errors name
    ``what`` (default ``--data SPEC``).
    """
    what = what or f"--data {data.spec}"
    labels = as_labels(data.labels, what)
    if num_outputs is None:
        return
    if data.num_classes_source == "dataset" and data.num_classes not in (None, num_outputs):
        raise InputError(
            what,
            f"has {data.num_classes} classes but the model has {num_outputs} outputs",
        )
    if labels.numel() and int(labels.max()) >= num_outputs:
        row = int((labels >= num_outputs).nonzero()[0, 0])
        raise InputError(
            what,
            f"label {int(labels[row])} (sample {row}) is out of range for a model with "
            f"{num_outputs} outputs (labels must be in [0, {num_outputs}))",
        )


def _collate_of(dataset: Dataset[Any]) -> Any:
    """The dataset's own ``collate`` (text data: pad per batch), looked up through Subsets."""
    inner = dataset
    while isinstance(inner, Subset):
        inner = inner.dataset
    return getattr(inner, "collate", None)


def first_input(dataset: Dataset[Any]) -> Inputs:
    """The inputs of sample 0 as a one-row batch, as :func:`iter_batches` would give them."""
    x, _y = next(iter_batches(dataset, 1, [0]))
    return x


def iter_batches(
    dataset: Dataset[Any], batch_size: int, indices: Sequence[int] | None = None
) -> Iterator[tuple[Inputs, torch.Tensor]]:
    """Yield ``(x, y)`` batches in a fixed order: ``indices`` (or ``0..N-1``) in chunks.

    The last batch may be short. ``x`` is stacked (integer inputs become float32, floating
    inputs keep their dtype), or, for a dataset with its own ``collate`` (text), the mapping of
    padded token tensors it returns; ``y`` is int64.
    """
    if batch_size < 1:
        raise InputError("--batch-size", f"is {batch_size}; it must be >= 1")
    order = list(range(len(dataset))) if indices is None else [int(i) for i in indices]  # type: ignore[arg-type]
    collate = _collate_of(dataset)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        if collate is not None:
            inputs, labels = collate([dataset[i] for i in chunk])
            yield inputs, labels.to(torch.int64)
            continue
        if isinstance(dataset, TensorPairDataset):
            where = torch.tensor(chunk, dtype=torch.int64)
            x, y = dataset.x[where], dataset.y[where]
        else:
            items = [dataset[i] for i in chunk]
            x = _stack(dataset, chunk, [torch.as_tensor(item[0]) for item in items])
            y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
        if not x.is_floating_point():
            x = x.float()
        yield x, y.to(torch.int64)


def _stack(
    dataset: Dataset[Any], chunk: Sequence[int], inputs: Sequence[torch.Tensor]
) -> torch.Tensor:
    """The batch of ``inputs`` (samples ``chunk`` of ``dataset``); samples of different shapes
    are an :class:`InputError` naming the first that differs from the batch's first."""
    shape = inputs[0].shape
    for index, item in zip(chunk, inputs, strict=True):
        if item.shape != shape:
            source = getattr(dataset, "source_of", None)
            which = source(index) if source is not None else f"sample {index}"
            first = source(chunk[0]) if source is not None else f"sample {chunk[0]}"
            raise InputError(
                "--data",
                f"{which} has shape {_dims(item.shape)}, {first} {_dims(shape)}; a batch needs "
                "one shape",
                "give images one size with --resize N (and --crop N)"
                if source is not None
                else "make every sample one shape",
            )
    return torch.stack(list(inputs))


def _dims(shape: torch.Size) -> str:
    return "×".join(str(n) for n in shape) or "scalar"


def stratified_split(
    labels: torch.Tensor, fraction: float, seed: int, source: str = "the data"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split sample indices into ``(fit_idx, eval_idx)``, class by class.

    ``fit_idx`` receives ``n_fit = round(fraction · N)`` samples, clamped to ``[1, N - 1]`` so
    both parts are never empty (a tiny fraction still gives one fitting sample). The count is
    shared among classes in proportion to their size by largest remainders: class ``c`` with
    ``n_c`` samples gets ``floor(fraction · n_c)`` plus one for the classes with the largest
    fractional parts (ties to the lower class). A class too small to split (one sample) lands
    wholly on one side. Which samples of a class go to ``fit`` is drawn with ``seed``; the same
    labels and seed give the same split. Both index tensors are int64, ascending, disjoint,
    and together cover ``0..N-1``. ``source`` names the data in the error for fewer than two
    samples.
    """
    if not 0.0 < fraction < 1.0:
        raise InputError("--val-split", f"is {fraction}; it must be strictly between 0 and 1")
    labels = as_labels(torch.as_tensor(labels), "labels")
    n_total = int(labels.shape[0])
    if n_total < 2:
        raise InputError(
            "--val-split",
            f"{source} has {n_total} sample(s); a split needs at least 2, one to fit and one to "
            "evaluate",
            "give more samples, or fit on separate data",
        )
    n_fit = min(max(round(fraction * n_total), 1), n_total - 1)
    classes, counts = torch.unique(labels, return_counts=True)
    quotas = [fraction * int(c) for c in counts]
    take = [int(q) for q in quotas]
    remaining = n_fit - sum(take)
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(quotas[i] - take[i]), i))
    for i in by_remainder:
        if remaining <= 0:
            break
        if take[i] < int(counts[i]):
            take[i] += 1
            remaining -= 1
    generator = torch.Generator().manual_seed(seed)
    fit_parts = []
    for cls, n_take in zip(classes.tolist(), take, strict=True):
        members = (labels == cls).nonzero().flatten()
        order = torch.randperm(len(members), generator=generator)
        fit_parts.append(members[order[:n_take]])
    fit_mask = torch.zeros(n_total, dtype=torch.bool)
    fit_mask[torch.cat(fit_parts)] = True
    return fit_mask.nonzero().flatten(), (~fit_mask).nonzero().flatten()
