"""curvcal: curvature and calibration of trained classifier checkpoints."""

__version__ = "0.1.0.dev0"


from curvcal.curvature import (
    HessianOperator,
    HessianSettings,
    analyse_hessian,
    hessian_density,
    hessian_eigenvalues,
    hessian_layers,
    hessian_trace,
)

__all__ = [
    "HessianOperator",
    "HessianSettings",
    "__version__",
    "analyse_hessian",
    "hessian_density",
    "hessian_eigenvalues",
    "hessian_layers",
    "hessian_trace",
]
