"""Where numbers came from: the software and the machine (file digests: :mod:`curvcal.load.digest`)."""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from curvcal import __version__


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Versions and the device the numbers were computed on."""
    env: dict[str, Any] = {
        "curvcal": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(terse=True),
        "command_line": list(sys.argv),
    }
    if device is not None:
        dev = torch.device(device)
        env["device"] = str(dev)
        if dev.type == "cuda" and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(dev)
        else:
            env["device_name"] = platform.processor() or platform.machine()
        env["torch_threads"] = torch.get_num_threads()
    return env
