"""Curvature of a classifier's loss: the Hessian as a linear operator and the algorithms on it.

``HessianOperator`` (operator.py) is the Hessian of the mean loss over a dataset, built with
``build_operator`` (central_difference.py, which gives a model sharded with ``fully_shard`` its
central-difference operator) from a model, a loss of :mod:`curvcal.losses`, batches (batches.py) and
the ``HessianSettings`` themselves (checked by options.py), its products computed by the kernels beside it and checked
for NaN/Inf, the batches at fault named (guard.py); ``eigenvalues`` (eigen.py), ``trace_estimate`` (trace.py) and
``spectral_density`` (density.py) accept it or any operator with ``shape``, ``dtype``,
``device`` and ``matmat`` — or a dense symmetric tensor. The Python API (api.py:
``hessian_operator``, ``hessian_eigenvalues``, ``hessian_trace``, ``hessian_density``,
``hessian_layers``, ``analyse_hessian``) builds the operator from a model, its data and any
loss, or takes one built before; ``scipy_operator`` (linear_operator.py) hands it to scipy.
"""

from curvcal.curvature.api import (
    analyse_hessian,
    hessian_density,
    hessian_eigenvalues,
    hessian_layers,
    hessian_operator,
    hessian_trace,
)
from curvcal.curvature.central_difference import build_operator
from curvcal.curvature.density import spectral_density
from curvcal.curvature.eigen import eigenvalues, lanczos, power_iteration
from curvcal.curvature.engines import double_backward_hvp
from curvcal.curvature.layers import layer_curvature
from curvcal.curvature.linear_operator import scipy_operator
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.operators import DenseOperator, LinearOperator, as_operator
from curvcal.curvature.options import OperatorOptions
from curvcal.curvature.penalty import hutchinson_trace_penalty
from curvcal.curvature.results import (
    ConvergenceWarning,
    DensityResult,
    EigenResult,
    EigenSpectrum,
    HessianAnalysis,
    LayerCurvature,
    TraceMethodWarning,
    TraceResult,
)
from curvcal.curvature.trace import (
    exact_trace,
    hutchinson_trace,
    hutchpp_trace,
    trace_estimate,
    xtrace,
)
from curvcal.settings.hessian import HessianSettings

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
    "OperatorOptions",
    "TraceMethodWarning",
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
    "hessian_operator",
    "hessian_trace",
    "hutchinson_trace",
    "hutchinson_trace_penalty",
    "hutchpp_trace",
    "lanczos",
    "layer_curvature",
    "power_iteration",
    "scipy_operator",
    "spectral_density",
    "trace_estimate",
    "xtrace",
]
