"""curvcal: curvature and calibration of trained classifier checkpoints."""

__version__ = "0.1.0.dev0"


from curvcal.curvature import (
    HessianOperator,
    hessian_density,
    hessian_eigenvalues,
    hessian_layers,
    hessian_trace,
)

__all__ = [
    "HessianOperator",
    "__version__",
    "hessian_density",
    "hessian_eigenvalues",
    "hessian_layers",
    "hessian_trace",
]
