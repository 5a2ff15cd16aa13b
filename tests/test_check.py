"""Policies (parsing, line numbers of faults) and verdicts (every bound type and its border)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.policy.baseline import load_report, metric_paths, metric_values
from curvcal.policy.evaluate import MetricValue, evaluate
from curvcal.policy.parse import METRICS, Rule, find_pyproject_policy, load_policy

GOOD = """\
# release gate
[settings]
arch = "curvcal:DigitsCNN"
data = "digits:test"
seed = 0
bins = 15
val_split = 0.2
trace = true

[settings.arch_kwargs]
width = 8

[ece]
max = 0.05

[ts.ece]
max = 0.02

[focal_ts.nll]
max_increase = 0.01

[lambda_max]
min = 0
max_rel_increase = 0.1

[trace]
max = 100.0
"""


def write(tmp_path: Path, text: str, name: str = "policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_policy_settings_and_rules(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    assert policy.settings["arch"] == "curvcal:DigitsCNN"
    assert policy.settings["arch_kwargs"] == {"width": 8}
    assert policy.settings["trace"] is True
    by_key = {rule.key: rule for rule in policy.rules}
    assert set(by_key) == {"ece", "ts.ece", "focal_ts.nll", "lambda_max", "trace"}
    assert by_key["ece"] == Rule(metric="ece", max=0.05, stage="uncalibrated")
    assert by_key["ts.ece"] == Rule(metric="ece", max=0.02, stage="ts")
    assert by_key["focal_ts.nll"].max_increase == 0.01
    assert by_key["lambda_max"] == Rule(metric="lambda_max", min=0.0, max_rel_increase=0.1)
    assert by_key["lambda_max"].stage is None
    assert policy.metric_keys == frozenset(by_key)


def test_explicit_uncalibrated_stage_and_dotted_keys(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, "uncalibrated.ece.max = 0.1\nts.brier = {max = 0.3}\n"))
    assert {rule.key for rule in policy.rules} == {"ece", "ts.brier"}


def test_pyproject_tool_table(tmp_path: Path) -> None:
    text = '[project]\nname = "x"\n\n[tool.curvcal.settings]\nseed = 3\n\n[tool.curvcal.accuracy]\nmin = 0.9\n'
    path = write(tmp_path, text, "pyproject.toml")
    policy = load_policy(path)
    assert policy.settings == {"seed": 3}
    assert policy.rules == (Rule(metric="accuracy", min=0.9, stage="uncalibrated"),)
    assert find_pyproject_policy(tmp_path) == path


def test_pyproject_without_tool_table(tmp_path: Path) -> None:
    path = write(tmp_path, '[project]\nname = "x"\n', "pyproject.toml")
    assert find_pyproject_policy(tmp_path) is None
    with pytest.raises(InputError, match=r"no \[tool.curvcal\] table"):
        load_policy(path)


def test_pyproject_fault_names_line_under_tool_table(tmp_path: Path) -> None:
    text = '[project]\nname = "x"\n\n[tool.curvcal.ece]\nmax = 0.1\nmaxx = 0.2\n'
    with pytest.raises(InputError) as info:
        load_policy(write(tmp_path, text, "pyproject.toml"))
    assert info.value.what.endswith("pyproject.toml:6")


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("[ece]\nmax = 0.1\n\n[eec]\nmax = 0.1\n", 4, "unknown metric or table 'eec'"),
        ("[ece]\nmax = 0.1\nmaximum = 0.2\n", 3, "unknown bound 'maximum'"),
        ('[ece]\nmax = "low"\n', 2, "must be a number"),
        ("[ece]\nmax = true\n", 2, "must be a number"),
        ("[ece]\nmax = nan\n", 2, "must be finite"),
        ("[lambda_max]\nmax = 10\nmin = 20\n", 3, "min 20 is above max 10"),
        ("[nll]\n\nmax_increase = -0.1\n", 3, "max_increase -0.1 is negative"),
        ("[trace]\nmax_rel_increase = -1\n", 2, "max_rel_increase -1 is negative"),
        ("[ece]\nmax = -0.01\n", 2, "below 0, the least ece can be"),
        ("[accuracy]\nmin = 1.5\n", 2, "above 1, the most accuracy can be"),
        ("[ece]\nmax = 0.1\n[ts.lambda_max]\nmax = 1\n", 3, "takes no stage"),
        ("[ts.eec]\nmax = 1\n", 1, "unknown metric 'eec'"),
        ("[ece]\n", 1, "sets no bound"),
        ("ece = 0.1\n", 1, "must be a table of bounds"),
        ("ts = 1\n", 1, "must be a table of metrics"),
        ("seed = 1\n[ece]\nmax = 0.1\n", 1, "evaluation setting, not a metric"),
        ("[settings]\nseed = 1\nsede = 2\n[ece]\nmax = 0.1\n", 3, "unknown setting 'sede'"),
        ("[settings]\nbins = 0\n[ece]\nmax = 0.1\n", 2, "'bins' must be a whole number >= 1"),
        ("[settings]\nval_split = 1.0\n[ece]\nmax = 0.1\n", 2, "'val_split' must be a number"),
        ("[settings]\ndata = 3\n[ece]\nmax = 0.1\n", 2, "'data' must be a string"),
        ("[ece]\nmax = 0.1\n[uncalibrated.ece]\nmax = 0.2\n", 3, "gated twice"),
        ("[ece]\nmax = 0.1\n[ece]\nmax = 0.2\n", 3, "not valid TOML"),
        ("[ece]\nmax = = 0.1\n", 2, "not valid TOML"),
        ("ts.ece = {max = 0.1, mux = 1}\n", 1, "unknown bound 'mux'"),
    ],
)
def test_malformed_policy_names_file_and_line(
    tmp_path: Path, text: str, line: int, why: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_policy(path)
    assert info.value.what == f"{path}:{line}"
    assert why in info.value.why


def test_setting_named_like_a_metric_outside_settings(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_policy(write(tmp_path, "trace = true\n\n[ece]\nmax = 0.1\n"))
    assert "must be a table of bounds" in info.value.why
    assert info.value.hint == "evaluation settings go under [settings]"


def test_policy_without_rules_and_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[settings]\nseed = 1\n")
    with pytest.raises(InputError, match="gates no metric"):
        load_policy(path)
    with pytest.raises(InputError, match="no such policy file"):
        load_policy(tmp_path / "absent.toml")


def test_every_metric_accepted(tmp_path: Path) -> None:
    text = "".join(f"[{name}]\nmax_increase = 1\n" for name in METRICS)
    assert len(load_policy(write(tmp_path, text)).rules) == len(METRICS)


# ---------------------------------------------------------------------------------------------
# evaluate


def value(number: float | None, interval: tuple[float, float] | None = None) -> MetricValue:
    return MetricValue(number, interval)


def test_max_and_min_pass_at_the_bound_and_fail_beyond() -> None:
    rules = [Rule("ece", max=0.05, stage="uncalibrated"), Rule("accuracy", min=0.9)]
    at_bound = evaluate(rules, {"ece": value(0.05), "accuracy": value(0.9)}, None)
    assert at_bound.passed
    assert [row.passed for row in at_bound.rows] == [True, True]
    beyond = evaluate(rules, {"ece": value(0.0501), "accuracy": value(0.8999)}, None)
    assert not beyond.passed
    assert [(row.metric, row.reason) for row in beyond.failed_rows] == [
        ("ece", "above max"),
        ("accuracy", "below min"),
    ]


def test_max_increase_against_baseline() -> None:
    rules = [Rule("nll", max_increase=0.25)]
    base = {"nll": value(1.0)}
    ok = evaluate(rules, {"nll": value(1.25)}, base)  # exactly at the bound (exact in binary)
    assert ok.passed and ok.rows[0].change == 0.25 and ok.rows[0].baseline == 1.0
    bad = evaluate(rules, {"nll": value(1.5)}, base)
    assert not bad.passed
    assert bad.rows[0].change == 0.5 and bad.rows[0].reason == "increase too large"
    better = evaluate(rules, {"nll": value(0.5)}, base)
    assert better.passed and better.rows[0].change == -0.5


def test_max_rel_increase_uses_absolute_baseline() -> None:
    rules = [Rule("trace", max_rel_increase=0.5)]
    row = evaluate(rules, {"trace": value(3.0)}, {"trace": value(2.0)}).rows[0]
    assert row.change == 0.5 and row.passed
    # negative baseline: from -2 to -1 is an increase of 50 % of |-2|
    row = evaluate(rules, {"trace": value(-1.0)}, {"trace": value(-2.0)}).rows[0]
    assert row.change == 0.5 and row.passed
    row = evaluate(rules, {"trace": value(-0.5)}, {"trace": value(-2.0)}).rows[0]
    assert row.change == 0.75 and not row.passed


def test_relative_increase_from_zero_baseline() -> None:
    rules = [Rule("lambda_max", max_rel_increase=0.1)]
    zero = {"lambda_max": value(0.0)}
    same = evaluate(rules, {"lambda_max": value(0.0)}, zero).rows[0]
    assert same.passed and same.change == 0.0
    up = evaluate(rules, {"lambda_max": value(1e-9)}, zero).rows[0]
    assert not up.passed and up.change == math.inf
    down = evaluate(rules, {"lambda_max": value(-1.0)}, zero).rows[0]
    assert down.passed and down.change == -math.inf


def test_change_bound_without_baseline_fails() -> None:
    rules = [Rule("ece", max_increase=0.01, stage="uncalibrated")]
    for baseline in (None, {}, {"ece": value(None)}, {"ece": value(math.nan)}):
        row = evaluate(rules, {"ece": value(0.01)}, baseline).rows[0]
        assert not row.passed and row.reason == "no baseline"


def test_missing_or_nonfinite_value_fails() -> None:
    rules = [Rule("ece", max=1.0, stage="uncalibrated")]
    assert evaluate(rules, {}, None).rows[0].reason == "not in the report"
    for bad in (None, math.nan, math.inf, -math.inf):
        verdict = evaluate(rules, {"ece": value(bad)}, None)
        assert not verdict.passed and verdict.rows[0].reason == "value is not finite"


def test_stage_qualified_metrics_are_separate() -> None:
    rules = [Rule("ece", max=0.05, stage="uncalibrated"), Rule("ece", max=0.02, stage="ts")]
    verdict = evaluate(rules, {"ece": value(0.04), "ts.ece": value(0.03)}, None)
    assert [(row.metric, row.passed) for row in verdict.rows] == [("ece", True), ("ts.ece", False)]


def test_one_row_per_bound_and_interval_carried() -> None:
    rules = [Rule("trace", max=10.0, max_increase=1.0)]
    verdict = evaluate(rules, {"trace": value(9.0, (8.0, 10.5))}, {"trace": value(8.5)})
    assert [(row.bound, row.passed) for row in verdict.rows] == [
        ("max", True),
        ("max_increase", True),
    ]
    assert verdict.rows[0].interval == (8.0, 10.5)  # judged on the estimate, not the interval
    assert [row.bound_text for row in verdict.rows] == ["<= 10", "change <= +1"]


# ---------------------------------------------------------------------------------------------
# metric_values and load_report


def test_metric_values_from_result_paths() -> None:
    document = {
        "command": "calibrate",
        "results": {
            "evaluation": {"uncalibrated": {"ece": 0.1}, "ts": {"ece": 0.02, "nll": None}},
            "fits": {"ts": {"temperature": 2.5}},
        },
    }
    values = metric_values(document)
    assert values["ece"] == MetricValue(0.1)
    assert values["ts.ece"] == MetricValue(0.02)
    assert values["ts.nll"] == MetricValue(None)  # present as null: a non-finite number
    assert values["temperature"] == MetricValue(2.5)
    assert "lambda_max" not in values and "focal_ts.ece" not in values


def test_metric_values_trace_estimate_and_interval() -> None:
    document = {"command": "hessian", "results": {"trace": {"estimate": 5.0, "ci95": [4.0, 6.0]}}}
    assert metric_values(document)["trace"] == MetricValue(5.0, (4.0, 6.0))


def test_metric_values_from_a_verdict_document() -> None:
    document = {
        "command": "compare",
        "results": {
            "passed": True,
            "rows": [
                {"metric": "trace", "value": 5.0, "interval": [4.0, 6.0]},
                {"metric": "ts.ece", "value": 0.01, "interval": None},
            ],
        },
    }
    values = metric_values(document)
    assert values == {"trace": MetricValue(5.0, (4.0, 6.0)), "ts.ece": MetricValue(0.01)}


def test_metric_paths_cover_every_key() -> None:
    keys = set(metric_paths())
    for metric in METRICS:
        assert metric in keys
    assert {"ts.ece", "focal_ts.brier"} <= keys


def test_load_report_rejects_bad_files(tmp_path: Path) -> None:
    broken = write(tmp_path, '{"schema": "1.0",\n  "command": }', "broken.json")
    with pytest.raises(InputError) as info:
        load_report(broken)
    assert info.value.what == f"{broken}:2" and "not valid JSON" in info.value.why
    other = write(tmp_path, json.dumps({"name": "x"}), "other.json")
    with pytest.raises(InputError, match="not a curvcal report"):
        load_report(other)
    future = write(
        tmp_path, json.dumps({"schema": "3.0", "command": "x", "results": {}}), "future.json"
    )
    with pytest.raises(InputError, match=r"schema 3\.0"):
        load_report(future)
    with pytest.raises(InputError, match="no such report"):
        load_report(tmp_path / "absent.json")
    for results in (None, [], "rows"):
        hollow = write(
            tmp_path,
            json.dumps({"schema": "1.3", "command": "x", "results": results}),
            "hollow.json",
        )
        with pytest.raises(InputError, match="its results are"):
            load_report(hollow)
    good = write(tmp_path, json.dumps({"schema": "1.3", "command": "x", "results": {}}), "ok.json")
    assert load_report(good)["command"] == "x"


# ---------------------------------------------------------------------------------------------
# decrease bounds


def test_max_decrease_against_baseline() -> None:
    rules = [Rule("accuracy", max_decrease=0.25, stage="uncalibrated")]
    base = {"accuracy": value(0.75)}
    at_bound = evaluate(rules, {"accuracy": value(0.5)}, base).rows[0]
    assert at_bound.passed and at_bound.change == -0.25 and at_bound.baseline == 0.75
    below = evaluate(rules, {"accuracy": value(0.25)}, base).rows[0]
    assert not below.passed and below.change == -0.5 and below.reason == "decrease too large"
    up = evaluate(rules, {"accuracy": value(1.0)}, base).rows[0]
    assert up.passed and up.change == 0.25
    assert at_bound.bound_text == "change >= -0.25"


def test_max_rel_decrease_uses_absolute_baseline_and_zero_baseline() -> None:
    rules = [Rule("trace", max_rel_decrease=0.5)]
    row = evaluate(rules, {"trace": value(1.0)}, {"trace": value(2.0)}).rows[0]
    assert row.change == -0.5 and row.passed and row.bound_text == "change >= -50%"
    row = evaluate(rules, {"trace": value(-3.5)}, {"trace": value(-2.0)}).rows[0]
    assert row.change == -0.75 and not row.passed  # from -2 to -3.5: down 75 % of |-2|
    zero = {"trace": value(0.0)}
    assert evaluate(rules, {"trace": value(0.0)}, zero).rows[0].passed
    down = evaluate(rules, {"trace": value(-1e-9)}, zero).rows[0]
    assert not down.passed and down.change == -math.inf
    assert evaluate(rules, {"trace": value(1.0)}, None).rows[0].reason == "no baseline"


@pytest.mark.parametrize("bound", ["max_decrease", "max_rel_decrease"])
def test_negative_decrease_bound_names_the_line(tmp_path: Path, bound: str) -> None:
    path = write(tmp_path, f"[accuracy]\nmin = 0.5\n{bound} = -0.1\n")
    with pytest.raises(InputError) as info:
        load_policy(path)
    assert info.value.what == f"{path}:3" and f"{bound} -0.1 is negative" in info.value.why


def test_gammas_setting_is_a_list_of_numbers(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, "[settings]\ngammas = [0, 0.5, 2]\n[ece]\nmax = 0.1\n"))
    assert policy.settings["gammas"] == [0, 0.5, 2]
    for bad in ("[]", "[-1]", '["a"]', "1.0", "[nan]"):
        path = write(tmp_path, f"[settings]\nseed = 0\ngammas = {bad}\n[ece]\nmax = 0.1\n")
        with pytest.raises(InputError) as info:
            load_policy(path)
        assert info.value.what == f"{path}:3" and "'gammas' must be a non-empty list" in (
            info.value.why
        )


def test_path_table_has_only_the_real_layouts() -> None:
    paths = metric_paths()
    assert paths["ece"] == (
        "results.evaluation.uncalibrated.ece",
        "results.calibration.evaluation.uncalibrated.ece",
    )
    assert paths["ts.nll"][0] == "results.evaluation.ts.nll"
    assert paths["lambda_max"] == ("results.lambda_max", "results.hessian.lambda_max")
    assert paths["focal_gamma"][0] == "results.fits.focal_ts.gamma"


@pytest.mark.parametrize(
    ("text", "line", "stage"),
    [
        ('[ts.ece]\nmax = 0.1\nrequire_improvement = "ece"\n', 3, "ts"),
        ('[focal_ts.nll]\nrequire_improvement = "nll"\n', 2, "focal_ts"),
        ('[ece]\nmax = 0.1\nrequire_improvement = "ece"\n', 3, None),  # no stage to name
    ],
)
def test_require_improvement_under_a_metric_says_it_belongs_to_the_stage(
    tmp_path: Path, text: str, line: int, stage: str | None
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_policy(path)
    assert info.value.what == f"{path}:{line}"
    assert "unknown bound 'require_improvement'" in info.value.why
    hint = info.value.hint or ""
    assert (
        f"put it under [{stage}]" if stage else "a calibrated stage's table, such as [ts]"
    ) in hint
    # where the hint says, the same key is read
    fixed = write(tmp_path, f'[{stage or "ts"}]\nrequire_improvement = "ece"\n', "fixed.toml")
    assert [rule.require_improvement for rule in load_policy(fixed).rules] == [True]
