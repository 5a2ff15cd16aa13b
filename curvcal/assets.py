"""Files bundled with curvcal: the digits demo checkpoint and its held-out data.

Both are produced by ``examples/digits/train.py`` (see its docstring for how).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _asset(name: str) -> Path:
    return Path(str(files("curvcal") / "assets" / name))


def demo_checkpoint() -> Path:
    """The bundled ``DigitsCNN`` state dict (``.safetensors``, architecture in its metadata)."""
    return _asset("digits_cnn.safetensors")


def demo_data() -> Path:
    """The bundled held-out digits split: ``x`` float32 ``(N, 1, 8, 8)``, ``y`` int64 ``(N,)``."""
    return _asset("digits_test.safetensors")
