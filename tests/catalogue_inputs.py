"""Inputs many test files build alike: a small digits model whose safetensors metadata names its
architecture, a tensor file of images for it, and digests of what a run was given (to show
nothing was modified)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

ARCH_META = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}


def digests(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file under ``roots`` (files or folders), by path."""
    files = [p for root in roots for p in ([root] if root.is_file() else sorted(root.rglob("*")))]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def digits_model(folder: Path) -> Path:
    """A digits classifier whose safetensors metadata names its architecture."""
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in DigitsCNN(num_classes=3, width=1).state_dict().items()}
    path = folder / "model.safetensors"
    save_file(state, str(path), ARCH_META)
    return path


def digit_images(folder: Path, n_samples: int = 12) -> Path:
    """``n_samples`` 8×8 one-channel images and labels 0, 1, 2 in turn for :func:`digits_model`."""
    generator = torch.Generator().manual_seed(1)
    path = folder / "data.pt"
    x = torch.randn(n_samples, 1, 8, 8, generator=generator)
    torch.save({"x": x, "y": torch.arange(n_samples) % 3}, path)
    return path
