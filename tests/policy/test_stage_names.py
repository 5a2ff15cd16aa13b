"""The stages a policy may gate are the stages a calibration run has."""

from __future__ import annotations

from curvcal.calibration import analysis
from curvcal.policy import parse


def test_the_policy_knows_every_stage_of_a_run_in_its_order() -> None:
    # the policy layer spells them out (it reads no calibration module); a map added to the
    # registry without a policy stage, or the other way round, fails here
    assert parse.STAGES == analysis.STAGES
    assert parse.STAGES[0] == parse.UNCALIBRATED
