"""curvcal inside a training loop: a streaming calibration metric, one measurement of chosen
curvature and calibration quantities of a model on a held-out loader, and the callbacks that
take it every N steps or epochs in a PyTorch Lightning or Hugging Face ``Trainer``.

``from curvcal.training import measure`` gives the function (its module is
:mod:`curvcal.training.measurement`, named apart so that importing it cannot put the module in
the function's place). The names are imported on first use, so ``import curvcal.training`` imports neither Lightning
nor transformers; :class:`CurvatureCallback` needs the ``lightning`` extra and
:class:`CurvatureTrainerCallback` the ``hf`` extra, and say so when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "StreamingCalibration": "curvcal.training.streaming",
    "QUANTITIES": "curvcal.training.measurement",
    "measure": "curvcal.training.measurement",
    "CurvatureCallback": "curvcal.training.lightning",
    "CurvatureTrainerCallback": "curvcal.training.hf",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'curvcal.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return __all__
