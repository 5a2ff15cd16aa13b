"""The choices declared once by the settings (torch-free, for ``--help``) are the names the
kernels accept: the algorithms' own names are held equal here; the operator's (``--hvp``,
``--mode``, ``--cache``, ``--keep-graphs``, ``--curvature``) are the settings' only, checked
before an operator is built."""

from __future__ import annotations

from curvcal.curvature import eigen, operator, residual, trace
from curvcal.settings import hessian


def test_choices_are_what_the_kernels_check() -> None:
    assert set(hessian.EIGEN_METHODS) == set(eigen.METHODS)
    assert set(trace.METHODS) | set(residual.METHODS) | {"auto", "gauss-newton"} == set(
        hessian.TRACE_METHODS
    )
    assert set(hessian.PROBE_DISTRIBUTIONS) == set(trace.DISTRIBUTIONS)
    # --loss own resolves to a recorded loss; the others are the operator's own criteria
    assert set(hessian.LOSSES) - {"own"} <= set(operator.CRITERIA)
