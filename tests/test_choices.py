"""The choices declared once by the settings (torch-free, for ``--help``) are the names the
kernels accept: each kernel keeps its own copy, held equal here."""

from __future__ import annotations

from curvcal.curvature import analysis, batches, eigen, engines, kept, operator, trace
from curvcal.settings import hessian


def test_choices_are_what_the_kernels_check() -> None:
    assert set(hessian.EIGEN_METHODS) == set(eigen.METHODS)
    assert set(hessian.TRACE_METHODS) <= set(analysis.TRACE_METHODS)
    assert set(hessian.PROBE_DISTRIBUTIONS) == set(trace.DISTRIBUTIONS)
    assert hessian.ENGINES == engines.ENGINES
    assert hessian.MODES == engines.MODES
    assert hessian.CACHES == batches.CACHES
    assert hessian.KEEP_GRAPHS == kept.KEEP_GRAPHS
    # --loss own resolves to a recorded loss; the others are the operator's own criteria
    assert set(hessian.LOSSES) - {"own"} <= set(operator.CRITERIA)
