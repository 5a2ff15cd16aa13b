"""Curvature of a classifier's loss: the Hessian as a linear operator and the algorithms on it.

``HessianOperator`` (operator.py) is the Hessian of the mean loss over a dataset, built with
``build_operator`` from a model, a loss of :mod:`curvcal.losses`, batches (batches.py) and
``OperatorOptions``, its products computed by the engines of engines.py and wrapped in the NaN
guard (guard.py); ``eigenvalues`` (eigen.py), ``trace_estimate`` (trace.py) and
``spectral_density`` (density.py) accept it or any operator with ``shape``, ``dtype``,
``device`` and ``matmat`` — or a dense symmetric tensor.
"""

from curvcal.curvature.analysis import HessianSettings, analyse_hessian
from curvcal.curvature.api import (
    hessian_density,
    hessian_eigenvalues,
    hessian_layers,
    hessian_trace,
)
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import eigenvalues, lanczos, power_iteration
from curvcal.curvature.engines import double_backward_hvp
from curvcal.curvature.guard import NaNGuard
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.operator import HessianOperator, OperatorOptions, build_operator
from curvcal.curvature.operators import DenseOperator, LinearOperator, as_operator
from curvcal.curvature.penalty import hutchinson_trace_penalty
from curvcal.curvature.results import (
    ConvergenceWarning,
    DensityResult,
    EigenResult,
    EigenSpectrum,
    HessianAnalysis,
    LayerCurvature,
    TraceResult,
)
from curvcal.curvature.trace import (
    exact_trace,
    hutchinson_trace,
    hutchpp_trace,
    trace_estimate,
    xtrace,
)

__all__ = [
    "ConvergenceWarning",
    "DenseOperator",
    "DensityResult",
    "EigenResult",
    "EigenSpectrum",
    "HessianAnalysis",
    "HessianOperator",
    "HessianSettings",
    "LayerCurvature",
    "LinearOperator",
    "NaNGuard",
    "OperatorOptions",
    "TraceResult",
    "analyse_hessian",
    "as_operator",
    "build_operator",
    "double_backward_hvp",
    "eigenvalues",
    "exact_trace",
    "hessian_density",
    "hessian_eigenvalues",
    "hessian_layers",
    "hessian_trace",
    "hutchinson_trace",
    "hutchinson_trace_penalty",
    "hutchpp_trace",
    "lanczos",
    "layer_curvature",
    "power_iteration",
    "spectral_density",
    "trace_estimate",
    "xtrace",
]
