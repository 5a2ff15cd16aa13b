"""Files bundled with curvcal: the digits demo checkpoint, its held-out data, its policy and the
JSON Schema of reports.

Both are produced by ``examples/digits/train.py`` (see its docstring for how).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from curvcal.inputs import record


def assets_folder() -> Path:
    """The folder of curvcal's bundled files."""
    return Path(str(files("curvcal") / "assets"))


def _asset(name: str) -> Path:
    """The bundled file ``name``. A run that reads one reads the folder: the whole folder is
    recorded as an input of the run (:func:`curvcal.inputs.record`), so no output (``-o``, a
    plot folder) is written into the installed package."""
    folder = assets_folder()
    record(folder, "curvcal's bundled files")
    return folder / name


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
