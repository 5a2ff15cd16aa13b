"""The progress plan follows the run: a stage that ended counts the products it made, and the
typical part (the eigenvalue stages, done first) is what is still open of them; the stage
running ends where its plan does (what comes after is of stages not yet begun)."""

from __future__ import annotations

from curvcal.curvature.forecast import StagePlan, planned_by_stage
from curvcal.settings.hessian import HessianSettings


def test_an_ended_stage_replaces_its_plan_by_what_it_made() -> None:
    settings = HessianSettings(top_k=1, smallest=True, trace_method="hutchinson", probes=20)
    plan = planned_by_stage(settings, n_params=10_000)
    assert plan == {"eigenvalues": 14, "smallest": 14, "trace": 20}
    stages = StagePlan(plan, "lanczos")
    assert stages.total() == 48 and stages.typical() == (28, True, 14)
    for done in range(1, 6):
        stages.seen("eigenvalues", done)
    stages.seen("eigenvalues", 6)  # the stage's end: its residual check
    stages.seen("smallest", 7)  # λ1 took 6 products, not 14
    assert stages.made == {"eigenvalues": 6}
    assert stages.total() == 6 + 14 + 20 and stages.typical() == (6 + 14, True, 6 + 14)
    stages.seen("smallest", 25)  # λmin needs more than typical: the plan is outgrown
    stages.seen("trace", 26)
    assert stages.made == {"eigenvalues": 6, "smallest": 19}
    assert stages.total() == 6 + 19 + 20 and stages.typical() == (0, True, 45)


def test_power_iteration_has_no_bound_and_the_gauss_newton_trace_is_the_trace() -> None:
    settings = HessianSettings(top_k=3, method="power", trace_method="gauss-newton")
    plan = planned_by_stage(settings, n_params=500)
    stages = StagePlan(plan, "power")
    assert plan == {"eigenvalues": 60} and stages.typical() == (60, False, 60)
    stages.seen("eigenvalues", 400)
    stages.seen("Gauss–Newton trace, batch 1", 400)  # no product: only batches
    assert stages.made == {"eigenvalues": 400}
    assert stages.total() == 400 and stages.typical() == (0, True, 400)
