"""Files bundled with curvcal: the digits demo checkpoint, its held-out data, its policy and the
JSON Schema of reports.

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


def demo_policy() -> Path:
    """The CI policy ``curvcal demo`` judges the bundled checkpoint with (TOML)."""
    return _asset("demo_policy.toml")


def demo_data() -> Path:
    """The bundled held-out digits split: ``x`` float32 ``(N, 1, 8, 8)``, ``y`` int64 ``(N,)``."""
    return _asset("digits_test.safetensors")


def report_schema() -> Path:
    """The JSON Schema (draft 2020-12) every report ``--json`` and ``-o FILE`` write follows."""
    return _asset("report.schema.json")
