"""Image preprocessing: resize, center-crop, to ``[0, 1]``, and per-channel normalisation
``x' = (x - mean) / std`` with the preset of :data:`NORMALISATION_PRESETS`, the model's own
mean/std, or ``--mean``/``--std``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from curvcal.errors import InputError
from curvcal.settings.data import DataSettings

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


def normalisation(
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
class ImageTransform:
    """An image pipeline, its step names, the normalisation record, and what curvcal chose on
    its own (sentences) with the warnings it raises."""

    transform: Any
    names: tuple[str, ...]
    normalisation: dict[str, Any] | None
    chosen: tuple[str, ...]
    warnings: tuple[str, ...]

    def provenance(self) -> dict[str, Any]:
        """What a :class:`~curvcal.load.datasets.loaded_data.LoadedData` records of this pipeline."""
        return {
            "normalisation": self.normalisation,
            "transforms": self.names,
            "chosen": self.chosen,
            "warnings": self.warnings,
        }


def image_transform(
    options: DataSettings,
    preset: str | None,
    channels: int | None,
    model: Mapping[str, Any] | None,
    image_size: tuple[int, int] | None = None,
    *,
    preset_assumed: bool = False,
) -> ImageTransform:
    """The transform of ``tv:``/``folder:`` images: resize and center-crop (given, or the
    model config's eval transform when neither is given), to ``[0, 1]``, normalise.

    ``image_size`` (height, width) is the images' own size where known: a model config whose
    input size differs from it is a warning (the images are rescaled to what the config says,
    which may not be what the model was trained on). ``preset_assumed``: the preset is a
    convention, not the dataset's own statistics (``folder:`` images of unknown origin), so
    normalising with it when neither the model nor ``--mean``/``--std`` say otherwise is a
    warning as well as a choice recorded."""
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
    norm = normalisation(options, preset, channels, model)
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
            note = (
                f"normalisation mean {_numbers(mean)}, std {_numbers(std)} (from {origin}; "
                "--mean/--std choose them)"
            )
            chosen.append(note)
            from_model = model is not None and "mean" in model and "std" in model
            if preset_assumed and not from_model:
                warnings.append(
                    f"--data {options.spec}: curvcal chose {note}: an assumption, as neither "
                    "the images nor the model record how they were normalised"
                )
    return ImageTransform(
        transforms.Compose(steps), tuple(names), description, tuple(chosen), tuple(warnings)
    )


def reject_image_transforms(options: DataSettings, kind: str) -> None:
    """``--resize``/``--crop`` given for data that is not images (``kind``) is an error."""
    if options.resize is not None or options.crop is not None:
        raise InputError(
            "--resize/--crop", f"apply to tv: and folder: datasets only, not to {kind}"
        )


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}×{size[1]}"


def _numbers(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)
