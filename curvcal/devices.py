"""A device named by the user, as torch's device: one rule for ``--device`` (and a policy's
``device``) and the ``device`` keyword of the Python functions.

torch parses any device type it was built for (``mps``, ``xpu``, ``meta``...) and says nothing
until a tensor is moved, where it fails in its own words (``Torch not compiled with CUDA
enabled``); curvcal computes on the CPU or a CUDA device, and says so first, naming the option.
"""

from __future__ import annotations

import re

import torch

from curvcal.errors import InputError

#: how a device is spelled: ``auto`` (CUDA when present, else the CPU), ``cpu``, ``cuda``, ``cuda:N``
DEVICE_SPELLINGS = "auto, cpu, cuda or cuda:N"


def device_named(
    spec: str | torch.device, option: str, cpu_hint: str, any_cuda: bool = False
) -> torch.device:
    """The device ``spec`` names: ``auto`` is ``cuda`` when CUDA is available, else ``cpu``;
    ``cuda`` is the current CUDA device, or, with ``any_cuda``, ``cuda`` with no index (whichever
    CUDA device the model is on). :class:`InputError` naming ``option`` for anything else,
    for CUDA on a machine without it (``cpu_hint`` says how to ask for the CPU) and for a CUDA
    index past the devices present."""
    if isinstance(spec, torch.device):
        text = str(spec)
    elif isinstance(spec, str):
        text = spec.strip().lower()
    else:
        raise InputError(option, f"{spec!r} is not a device", f"use {DEVICE_SPELLINGS}")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise InputError(option, f"{spec!r} is not a device", f"use {DEVICE_SPELLINGS}")
    if not torch.cuda.is_available():
        raise InputError(option, f"{spec} requested but CUDA is not available", cpu_hint)
    if match.group(1) is None and any_cuda:
        return torch.device("cuda")
    index = int(match.group(1)) if match.group(1) else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InputError(option, f"{spec}: only {torch.cuda.device_count()} CUDA device(s) present")
    return torch.device("cuda", index)
