"""The torch-free option choices (curvcal/choices.py) are the names the kernels accept."""

from __future__ import annotations

from curvcal import choices
from curvcal.curvature import analysis, batches, eigen, engines, operator, trace
from curvcal.policy import settings as policy_settings


def test_choices_are_what_the_kernels_check() -> None:
    assert set(choices.EIGEN_METHODS) == set(eigen.METHODS)
    assert set(choices.TRACE_METHODS) <= set(analysis.TRACE_METHODS)
    assert policy_settings.TRACE_METHODS == choices.TRACE_METHODS
    assert set(choices.PROBE_DISTRIBUTIONS) == set(trace.DISTRIBUTIONS)
    assert choices.ENGINES == engines.ENGINES
    assert choices.MODES == engines.MODES
    assert choices.CACHES == batches.CACHES
    # --loss own resolves to a recorded loss; ce and focal are the operator's own criteria
    assert set(choices.HESSIAN_LOSSES) - {"own"} <= set(operator.CRITERIA)
