"""Paired intervals of a map's improvement over uncalibrated: in ``calibrate``'s analysis for
every method when bootstrap resamples are asked for, read from a report, and judged by a
policy's ``require_improvement`` (both ways), end to end through ``check``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.metrics import TopLabel
from curvcal.calibration.ranking import RANK_SCORES, rank_stages
from curvcal.errors import InputError
from curvcal.pipeline.check import run_check
from curvcal.policy.baseline import improvements, metric_values
from curvcal.policy.evaluate import MetricValue, evaluate
from curvcal.policy.parse import IMPROVEMENT_SCORES, Rule, load_policy
from curvcal.results import to_jsonable
from curvcal.settings.calibration import CalibrationSettings


def _top(confidence: list[float], correct: list[float], nll: list[float]) -> TopLabel:
    as64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return TopLabel(as64(confidence), as64(correct), as64(nll), as64([0.0] * len(nll)))


def _hand_worked_report() -> dict:
    """Two rows, one bin, three named resamples (2, 0), (0, 2), (1, 1).

    uncalibrated: nll (1, 3), confidence 0.9, correct (1, 0): NLL 2, ECE 0.4.
    ts:           nll (0.5, 2.48), confidence 0.6, correct (1, 0): NLL 1.49, ECE 0.1.
    Improvement uncalibrated − ts:
      NLL: per-row (0.5, 0.52), mean 0.51, s = 0.02/√2; the t interval
          0.51 ± t_{0.975, 1}·s/√2 = 0.51 ± 12.7062·0.01 = (0.38294, 0.63706), wholly above 0:
          significant.
      ECE: point 0.3; one bin, ĥ = mean(correct − c) = −0.4 and −0.1; the resamples' ĥ* are
          (0.1, −0.9, −0.4) and (0.4, −0.6, −0.1), D*_u + D*_ts = (1, 1, 0), 95 % quantile
          (linear) 1; the calibrated null draws' 97.5 % quantiles are 0.4 (c = 0.9: values
          0.1, 0.4, 0.9 with probabilities 0.81, 0.18, 0.01) and 0.6 (c = 0.6: 0.4, 0.1, 0.6
          with 0.36, 0.48, 0.16), sum 1. Interval 0.3 ± 1 = (−0.7, 1.3): not significant.
    """
    tops = {
        "uncalibrated": _top([0.9, 0.9], [1, 0], [1.0, 3.0]),
        "ts": _top([0.6, 0.6], [1, 0], [0.5, 2.48]),
    }
    ranking = rank_stages(tops, n_bins=1, resamples=torch.tensor([[2.0, 0], [0, 2], [1, 1]]))
    return {"command": "calibrate", "results": to_jsonable({"ranking": ranking})}


def test_the_policy_scores_are_the_ranked_scores() -> None:
    assert IMPROVEMENT_SCORES == RANK_SCORES


def test_hand_worked_improvements_from_a_report() -> None:
    found = improvements(_hand_worked_report())
    assert set(found) == {"ts.nll.improvement", "ts.ece.improvement"}
    nll, ece = found["ts.nll.improvement"], found["ts.ece.improvement"]
    assert nll.value == pytest.approx(0.51, abs=1e-12)
    half = 12.706204736174698 * 0.01  # t_{0.975, 1} · s/√N
    assert nll.interval == pytest.approx((0.51 - half, 0.51 + half), abs=1e-9)
    assert ece.value == pytest.approx(0.3, abs=1e-15)
    assert ece.interval == pytest.approx((-0.7, 1.3), abs=1e-12)
    # metric_values reads them beside the other metrics
    assert metric_values(_hand_worked_report())["ts.ece.improvement"] == ece


def test_require_improvement_both_ways_on_the_hand_worked_case() -> None:
    values = improvements(_hand_worked_report())
    rules = [
        Rule("nll", stage="ts", require_improvement=True),
        Rule("ece", stage="ts", require_improvement=True),
    ]
    verdict = evaluate(rules, values, None)
    nll_row, ece_row = verdict.rows
    assert (nll_row.metric, nll_row.passed, nll_row.reason) == ("ts.nll.improvement", True, "")
    assert (ece_row.metric, ece_row.passed) == ("ts.ece.improvement", False)
    assert ece_row.reason == "improvement not significant" and not verdict.passed
    assert evaluate(rules[:1], values, None).passed


@pytest.mark.parametrize(
    ("measured", "reason"),
    [
        (None, "not in the report"),
        (MetricValue(0.2, None), "no paired interval (set bootstrap)"),
        (MetricValue(0.2, (0.0, 0.4)), "improvement not significant"),  # touching 0
        (MetricValue(-0.2, (-0.4, -0.1)), "improvement not significant"),  # worse
    ],
)
def test_what_is_no_significant_improvement(measured: MetricValue | None, reason: str) -> None:
    values = {} if measured is None else {"ts.ece.improvement": measured}
    (row,) = evaluate([Rule("ece", stage="ts", require_improvement=True)], values, None).rows
    assert (row.passed, row.reason) == (False, reason)


def _policy(tmp_path: Path, text: str):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return load_policy(path)


def test_policy_parsing_merges_with_the_stage_bounds(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        '[ts]\nrequire_improvement = ["ece", "nll"]\n[ts.ece]\nmax = 0.1\n',
    )
    by_key = {rule.key: rule for rule in policy.rules}
    assert by_key["ts.ece"] == Rule("ece", max=0.1, stage="ts", require_improvement=True)
    assert by_key["ts.nll"] == Rule("nll", stage="ts", require_improvement=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[uncalibrated]\nrequire_improvement = "ece"\n', "cannot improve on itself"),
        ('[ts]\nrequire_improvement = "mce"\n', "must be one of nll, ece"),
        ("[ts]\nrequire_improvement = []\n", "must be one of nll, ece"),
        ("[ts]\nrequire_improvement = true\n", "must be one of nll, ece"),
    ],
)
def test_bad_require_improvement_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        _policy(tmp_path, text)
    assert info.value.what.endswith("gate.toml:2")


def test_every_method_ranks_with_paired_intervals_when_bootstrapping() -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (200,), generator=generator)
    logits = 4.0 * torch.randn(200, 3, generator=generator)  # overconfident
    logits[torch.arange(200), labels] += 2.0
    common = (logits[:100], labels[:100], logits[100:], labels[100:], "logits")
    ranked = analyse_calibration(
        *common, CalibrationSettings(method="ts", bootstrap=50, seed=1), "fit-data"
    )
    assert ranked.ranking is not None and ranked.ranking.n_bootstrap == 50
    assert {stage.stage for stage in ranked.ranking.stages} == {"uncalibrated", "ts"}
    ts = next(stage for stage in ranked.ranking.stages if stage.stage == "ts")
    assert ts.vs_uncalibrated is not None
    assert ts.vs_uncalibrated["ece"].value == pytest.approx(
        ranked.evaluation.ts.ece - ranked.evaluation.uncalibrated.ece, abs=1e-12
    )
    plain = analyse_calibration(*common, CalibrationSettings(method="ts"), "fit-data")
    assert plain.ranking is None and "ranking" not in plain.to_dict()


def _check_text(extra: str) -> str:
    return (
        '[settings]\ndata = "curvcal:digits"\ndevice = "cpu"\nmax_samples = 120\n'
        f'val_split = 0.5\nseed = 1\n{extra}[ts]\nrequire_improvement = "nll"\n'
    )


def test_check_without_bootstrap_refuses_require_improvement(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="bootstrap is 0") as info:
        run_check(_policy(tmp_path, _check_text("")), demo_checkpoint())
    assert "gate.toml" in info.value.what


def test_check_judges_the_interval_calibrate_reports(tmp_path: Path) -> None:
    result = run_check(_policy(tmp_path, _check_text("bootstrap = 40\n")), demo_checkpoint())
    assert result.calibration is not None and result.calibration.ranking is not None
    ts = next(s for s in result.calibration.ranking.stages if s.stage == "ts")
    assert ts.vs_uncalibrated is not None
    against = ts.vs_uncalibrated["nll"]
    assert against.interval is not None
    (row,) = result.verdict.rows
    assert row.metric == "ts.nll.improvement"
    assert row.value == pytest.approx(-against.value, abs=1e-15)
    assert row.interval == pytest.approx((-against.interval[1], -against.interval[0]))
    assert row.passed == (against.interval[1] < 0.0) == result.passed
