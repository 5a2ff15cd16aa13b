"""curvcal: curvature and calibration of trained classifier checkpoints."""

__version__ = "0.1.0.dev0"

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
)

__all__ = [
    "CalibrationMetrics",
    "Calibrator",
    "FocalTemperatureFit",
    "ReliabilityBin",
    "TemperatureFit",
    "__version__",
    "apply_calibrator",
    "apply_focal_temperature",
    "apply_temperature",
    "calibration_metrics",
    "fit_focal_temperature",
    "fit_temperature",
    "focal_calibration_map",
    "focal_loss",
]
