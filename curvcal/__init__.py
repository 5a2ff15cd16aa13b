"""curvcal: curvature and calibration of trained classifier checkpoints.

The public API is imported on first use (PEP 562), so ``import curvcal`` and ``curvcal --help``
do not pay for torch until a function is actually needed.
"""

from __future__ import annotations

import importlib
import sys

if sys.argv[:1] == ["-m"]:  # `python -m curvcal` is locating this package: take Ctrl-C now
    from curvcal import interrupt

    interrupt.install()

TYPE_CHECKING = False  # typing is not imported at run time: the fewer steps before the above
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0.dev0"

_EXPORTS: dict[str, str] = {
    # curvature
    "HessianOperator": "curvcal.curvature",
    "HessianSettings": "curvcal.settings.hessian",
    "analyse_hessian": "curvcal.curvature",
    "hessian_density": "curvcal.curvature",
    "hessian_eigenvalues": "curvcal.curvature",
    "hessian_layers": "curvcal.curvature",
    "hessian_operator": "curvcal.curvature",
    "hessian_trace": "curvcal.curvature",
    "hutchinson_trace_penalty": "curvcal.curvature",
    "scipy_operator": "curvcal.curvature",
    # calibration
    "CalibrationMetrics": "curvcal.calibration",
    "Calibrator": "curvcal.calibration",
    "FocalTemperatureFit": "curvcal.calibration",
    "ReliabilityBin": "curvcal.calibration",
    "TemperatureFit": "curvcal.calibration",
    "apply_calibrator": "curvcal.calibration",
    "apply_focal_temperature": "curvcal.calibration",
    "apply_temperature": "curvcal.calibration",
    "calibration_metrics": "curvcal.calibration",
    "FittedMap": "curvcal.pipeline.fitted_map",
    "fit_map": "curvcal.pipeline.fitted_map",
    "load_map": "curvcal.pipeline.fitted_map",
    "fit_focal_temperature": "curvcal.calibration",
    "fit_temperature": "curvcal.calibration",
    "focal_calibration_map": "curvcal.calibration",
    "focal_loss": "curvcal.calibration",
    "predict": "curvcal.calibration",
}

__all__ = [
    "CalibrationMetrics",
    "Calibrator",
    "FittedMap",
    "FocalTemperatureFit",
    "HessianOperator",
    "HessianSettings",
    "ReliabilityBin",
    "TemperatureFit",
    "__version__",
    "analyse_hessian",
    "apply_calibrator",
    "apply_focal_temperature",
    "apply_temperature",
    "calibration_metrics",
    "fit_focal_temperature",
    "fit_map",
    "fit_temperature",
    "focal_calibration_map",
    "focal_loss",
    "hessian_density",
    "hessian_eigenvalues",
    "hessian_layers",
    "hessian_operator",
    "hessian_trace",
    "hutchinson_trace_penalty",
    "load_map",
    "predict",
    "scipy_operator",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'curvcal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from curvcal.calibration import (
        CalibrationMetrics,
        Calibrator,
        FocalTemperatureFit,
        ReliabilityBin,
        TemperatureFit,
        apply_calibrator,
        apply_focal_temperature,
        apply_temperature,
        calibration_metrics,
        fit_focal_temperature,
        fit_temperature,
        focal_calibration_map,
        focal_loss,
        predict,
    )
    from curvcal.curvature import (
        HessianOperator,
        HessianSettings,
        analyse_hessian,
        hessian_density,
        hessian_eigenvalues,
        hessian_layers,
        hessian_operator,
        hessian_trace,
        hutchinson_trace_penalty,
        scipy_operator,
    )
    from curvcal.pipeline.fitted_map import FittedMap, fit_map, load_map
