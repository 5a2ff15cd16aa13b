"""``--device`` and ``--dtype`` as torch's device and dtype."""

from __future__ import annotations

import re

import torch

from curvcal.errors import InputError

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cpu``; ``cuda``; ``cuda:N``."""
    text = spec.strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise InputError("--device", f"{spec!r} is not a device", "use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise InputError(
            "--device", f"{spec} requested but CUDA is not available", "use --device cpu"
        )
    index = int(match.group(1)) if match.group(1) else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InputError(
            "--device", f"{spec}: only {torch.cuda.device_count()} CUDA device(s) present"
        )
    return torch.device("cuda", index)


def resolve_dtype(spec: str) -> torch.dtype:
    """``float32``, ``float64``, ``bfloat16`` or ``float16``."""
    try:
        return DTYPES[spec.strip().lower()]
    except KeyError:
        raise InputError(
            "--dtype", f"{spec!r} is not supported", "use float32, float64, bfloat16 or float16"
        ) from None
