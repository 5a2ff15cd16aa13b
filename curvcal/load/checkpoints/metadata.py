"""What curvcal reads from a checkpoint's own metadata: the architecture that builds it, that
architecture's keyword arguments and the loss it was trained with.

A safetensors file records them as string metadata (``safetensors.torch.save_file(...,
metadata=...)``); a pickled dict, as scalar entries beside the weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal import jsontext
from curvcal.errors import InputError

if TYPE_CHECKING:
    from curvcal.load.checkpoints.loaded_model import LoadedModel

ARCH_METADATA_KEY = "curvcal.arch"
ARCH_KWARGS_METADATA_KEY = "curvcal.arch_kwargs"
LOSS_METADATA_KEY = "curvcal.loss"
GAMMA_METADATA_KEY = "curvcal.gamma"
_LOSS_NAMES = {
    "ce": "ce",
    "cross_entropy": "ce",
    "cross-entropy": "ce",
    "focal": "focal",
    "flsd53": "flsd53",
}


def recorded_arch_kwargs(path: Path, metadata: Mapping[str, str]) -> dict[str, Any]:
    """The keyword arguments of the recorded architecture: ``curvcal.arch_kwargs``, a JSON
    object; none when it is absent."""
    raw = metadata.get(ARCH_KWARGS_METADATA_KEY)
    if raw is None:
        return {}
    try:
        kwargs = jsontext.loads(raw, f"{path} (its metadata {ARCH_KWARGS_METADATA_KEY})")
    except json.JSONDecodeError as exc:
        raise InputError(
            str(path), f"metadata {ARCH_KWARGS_METADATA_KEY} is not JSON: {exc}"
        ) from exc
    if not isinstance(kwargs, dict):
        raise InputError(str(path), f"metadata {ARCH_KWARGS_METADATA_KEY} is not a JSON object")
    return kwargs


def recorded_loss(loaded: LoadedModel) -> tuple[str, float]:
    """The training loss a checkpoint records in its metadata, as ``(criterion, gamma)``.

    ``curvcal.loss`` is ``ce`` (also ``cross_entropy``), ``focal`` or ``flsd53``;
    ``curvcal.gamma`` is the focal γ (required for ``focal``; absent or 0 for ``ce`` and
    ``flsd53``, whose γ is per sample). :func:`curvcal.losses.loss_from_name` turns the pair into
    a loss. Raises :class:`InputError`, naming the checkpoint, when the metadata is missing or
    unusable.
    """
    where = str(loaded.path)
    hint = "pass --loss ce or --loss focal --gamma G"
    raw = loaded.metadata.get(LOSS_METADATA_KEY)
    if raw is None:
        raise InputError(
            where, f"the checkpoint records no training loss (metadata {LOSS_METADATA_KEY})", hint
        )
    criterion = _LOSS_NAMES.get(raw.strip().lower())
    if criterion is None:
        raise InputError(
            where, f"metadata {LOSS_METADATA_KEY} is {raw!r}, not a loss curvcal knows", hint
        )
    gamma_raw = loaded.metadata.get(GAMMA_METADATA_KEY)
    if gamma_raw is None:
        if criterion == "focal":
            raise InputError(where, f"focal loss recorded without {GAMMA_METADATA_KEY}", hint)
        return criterion, 0.0
    try:
        gamma = float(gamma_raw)
    except ValueError:
        raise InputError(
            where, f"metadata {GAMMA_METADATA_KEY} is {gamma_raw!r}, not a number", hint
        ) from None
    if not math.isfinite(gamma) or gamma < 0:
        raise InputError(where, f"metadata {GAMMA_METADATA_KEY} is {gamma_raw!r}; γ must be ≥ 0")
    if criterion != "focal" and gamma != 0:
        raise InputError(
            where, f"metadata says loss {criterion} with {GAMMA_METADATA_KEY} {gamma_raw!r}", hint
        )
    return criterion, gamma
