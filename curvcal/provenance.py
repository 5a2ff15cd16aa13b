"""Where numbers came from: file digests, the software and the machine."""

from __future__ import annotations

import hashlib
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from curvcal import __version__
from curvcal.results import FileInfo

_CHUNK = 1 << 20


def file_info(path: str | Path) -> FileInfo:
    """Size and SHA-256 of a file (read in 1 MiB chunks; never modified). A model folder
    (``config.json`` and weights): total size of the files its loader reads, digest of each
    one's relative name, a NUL byte and its contents, in load order. Other directories: size 0,
    digest of the sorted relative names and sizes of the files beneath."""
    p = Path(path)
    digest = hashlib.sha256()
    from curvcal.load.hf import folder_files

    model_files = folder_files(p)
    if model_files:  # a model folder: its config and weights are what identify the model
        for child in model_files:
            digest.update(f"{child.relative_to(p)}\0".encode())
            with child.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
        size = sum(child.stat().st_size for child in model_files)
        return FileInfo(path=str(path), size_bytes=size, sha256=digest.hexdigest())
    if p.is_dir():
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(f"{child.relative_to(p)}\0{child.stat().st_size}\n".encode())
        return FileInfo(path=str(path), size_bytes=0, sha256=digest.hexdigest())
    with p.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return FileInfo(path=str(path), size_bytes=p.stat().st_size, sha256=digest.hexdigest())


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
