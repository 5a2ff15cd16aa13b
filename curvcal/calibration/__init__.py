"""Calibration kernels: metrics, binning, smooth ECE, focal map, temperature scaling.

Pure functions of tensors (no file I/O, no printing, no global RNG); results are the frozen
dataclasses of :mod:`curvcal.calibration.results`.
"""

from curvcal.calibration.focal import focal_calibration_map, focal_loss
from curvcal.calibration.inference import predict
from curvcal.calibration.inputs import InputNames
from curvcal.calibration.metrics import (
    accuracy,
    adaptive_calibration_error,
    aurc,
    brier_score,
    calibration_metrics,
    classwise_calibration_error,
    excess_aurc,
    expected_calibration_error,
    ks_calibration_error,
    kuiper_statistic,
    maximum_calibration_error,
    maximum_mean_calibration_error,
    mean_confidence,
    negative_log_likelihood,
    positive_class_calibration_error,
    reliability_bins,
    risk_coverage,
    rms_calibration_error,
)
from curvcal.calibration.results import (
    CalibrationMetrics,
    Calibrator,
    FocalProfilePoint,
    FocalTemperatureFit,
    ReliabilityBin,
    SmoothECE,
    TemperatureFit,
)
from curvcal.calibration.scaling import (
    apply_calibrator,
    apply_focal_temperature,
    apply_temperature,
    fit_focal_temperature,
    fit_temperature,
)
from curvcal.calibration.selective import RiskCoverage
from curvcal.calibration.smooth import smooth_ece, smooth_ece_at

__all__ = [
    "CalibrationMetrics",
    "Calibrator",
    "FocalProfilePoint",
    "FocalTemperatureFit",
    "InputNames",
    "ReliabilityBin",
    "RiskCoverage",
    "SmoothECE",
    "TemperatureFit",
    "accuracy",
    "adaptive_calibration_error",
    "apply_calibrator",
    "apply_focal_temperature",
    "apply_temperature",
    "aurc",
    "brier_score",
    "calibration_metrics",
    "classwise_calibration_error",
    "excess_aurc",
    "expected_calibration_error",
    "fit_focal_temperature",
    "fit_temperature",
    "focal_calibration_map",
    "focal_loss",
    "ks_calibration_error",
    "kuiper_statistic",
    "maximum_calibration_error",
    "maximum_mean_calibration_error",
    "mean_confidence",
    "negative_log_likelihood",
    "positive_class_calibration_error",
    "predict",
    "reliability_bins",
    "risk_coverage",
    "rms_calibration_error",
    "smooth_ece",
    "smooth_ece_at",
]
