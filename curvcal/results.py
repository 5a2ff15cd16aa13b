"""Result objects and their JSON form.

Numeric kernels return frozen dataclasses; every command wraps its result in a :class:`Report`,
whose :meth:`Report.to_dict` is the JSON document curvcal writes (``schema`` versioned).
Non-finite floats never reach JSON: they become ``null`` and a note in ``nonfinite`` says where
and what they were.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "2.0"

STATUS_OK = "ok"
STATUS_PASS = "pass"
STATUS_FAIL = "fail"
STATUS_ERROR = "error"
#: Ctrl-C stopped the run; the report holds the stages it finished
STATUS_INTERRUPTED = "interrupted"

CALIBRATION_METRIC_FIELDS = (
    "accuracy",
    "mean_confidence",
    "ece",
    "mce",
    "rms_ce",
    "rms_ce_debiased",
    "adaece",
    "classwise_ece",
    "nll",
    "brier",
    "smooth_ece",
    "ks_ce",
    "kuiper",
    "mmce",
    "aurc",
    "e_aurc",
)
"""Every single-number metric of one set of scores: the ``float`` fields of
:class:`curvcal.calibration.results.CalibrationMetrics`, in their order, but the settings
``smooth_ece_bandwidth`` and ``interval_level``. Declared here, where every layer may read it,
so that the policy's gated metrics, the training measurement's quantities and the streaming
metric's names are drawn from this one list (a new metric is a field there and a name here; a
test holds the two equal)."""


@dataclass(frozen=True)
class FileInfo:
    """An input file as the report records it: path as given, size in bytes, SHA-256 hex digest."""

    path: str
    size_bytes: int
    sha256: str


def to_jsonable(value: Any, nonfinite: list[dict[str, str]] | None = None, where: str = "") -> Any:
    """Convert ``value`` into plain JSON types.

    Dataclasses (their ``to_dict()`` when they define one), mappings, sequences, tensors, NumPy
    values, paths and enums are converted recursively. A NaN or infinite float becomes ``None``;
    when ``nonfinite`` is a list, ``{"path": where, "value": "nan"|"inf"|"-inf"}`` is appended to it.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if nonfinite is not None:
            nonfinite.append({"path": where or "$", "value": repr(value)})
        return None
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, nonfinite, where)
    if isinstance(value, Path):
        return str(value)
    module = type(value).__module__
    if module.startswith("torch"):  # imported lazily: reports need no torch to be read
        import torch

        if isinstance(value, torch.dtype | torch.device):
            return str(value)
        if isinstance(value, torch.Tensor):
            return to_jsonable(value.detach().cpu().tolist(), nonfinite, where)
    if module.startswith("numpy"):
        return to_jsonable(value.tolist(), nonfinite, where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict):
            return to_jsonable(to_dict(), nonfinite, where)
        return {
            f.name: to_jsonable(getattr(value, f.name), nonfinite, _join(where, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, nonfinite, _join(where, str(k))) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v, nonfinite, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"cannot convert {type(value).__name__} at {where or '$'} to JSON")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


@dataclass
class Report:
    """The envelope of every command's output.

    ``status`` is ``ok`` for an analysis, ``pass``/``fail`` for a check, ``error`` for a
    numerical failure that still produced a report, ``interrupted`` for a run stopped by Ctrl-C
    that kept what converged (its document then also has ``"partial": true``). ``inputs`` maps a role (``checkpoint``,
    ``data``, ...) to a :class:`FileInfo` or a description; ``settings`` holds every option that
    shaped the numbers; ``timings`` are wall seconds by stage.
    """

    command: str
    results: Any
    status: str = STATUS_OK
    inputs: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: plain types only, non-finite numbers replaced by ``null``."""
        from curvcal import __version__

        nonfinite: list[dict[str, str]] = []
        body = {
            "schema": SCHEMA_VERSION,
            "curvcal": __version__,
            "command": self.command,
            "status": self.status,
            "inputs": to_jsonable(self.inputs, nonfinite, "inputs"),
            "settings": to_jsonable(self.settings, nonfinite, "settings"),
            "results": to_jsonable(self.results, nonfinite, "results"),
            "timings": to_jsonable(self.timings, nonfinite, "timings"),
            "environment": to_jsonable(self.environment, nonfinite, "environment"),
            "warnings": list(self.warnings),
        }
        body["nonfinite"] = nonfinite
        if self.status == STATUS_INTERRUPTED:  # a reader that knows no status words sees it too
            body["partial"] = True
        return body
