"""curvcal: curvature and calibration of trained classifier checkpoints."""

__version__ = "0.1.0.dev0"

__all__ = ["__version__"]
