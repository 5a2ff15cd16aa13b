"""``--device`` and ``--dtype`` as torch's device and dtype."""

from __future__ import annotations

import torch

from curvcal.devices import device_named
from curvcal.errors import InputError

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cpu``; ``cuda``; ``cuda:N``
    (:func:`curvcal.devices.device_named`, errors naming ``--device``)."""
    return device_named(spec, "--device", "use --device cpu")


def resolve_dtype(spec: str) -> torch.dtype:
    """``float32``, ``float64``, ``bfloat16`` or ``float16``."""
    try:
        return DTYPES[spec.strip().lower()]
    except KeyError:
        raise InputError(
            "--dtype", f"{spec!r} is not supported", "use float32, float64, bfloat16 or float16"
        ) from None
