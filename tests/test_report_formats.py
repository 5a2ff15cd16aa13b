"""The verdict renderers on hand-made verdicts: border cases a real run seldom produces (a
metric missing from the report, a value of 1e-05, characters XML cannot hold, every bound
passing), read back by the parsers their consumers use."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from curvcal.policy.evaluate import Verdict, VerdictRow
from curvcal.results import FileInfo, Report


def _row(metric: str, value: float | None, passed: bool, **extra: object) -> VerdictRow:
    fields: dict[str, object] = {
        "bound": "max", "limit": 0.05, "interval": None, "baseline": None, "change": None,
        "reason": "" if passed else "above max",
    }  # fmt: skip
    fields.update(extra)
    return VerdictRow(metric=metric, value=value, passed=passed, **fields)  # type: ignore[arg-type]


def _report(*rows: VerdictRow, name: str = "new.json") -> Report:
    verdict = Verdict(passed=all(r.passed for r in rows), rows=rows)
    return Report(
        command="compare",
        results=verdict,
        status="pass" if verdict.passed else "fail",
        inputs={"new": FileInfo(name, 1, "a" * 64), "old": FileInfo("old.json", 1, "b" * 64)},
    )


def test_a_missing_metric_fails_in_junit_and_is_left_out_of_the_model_card() -> None:
    from curvcal.report.judged import judged_run
    from curvcal.report.junit import junit_xml
    from curvcal.report.model_card import model_index

    report = _report(_row("ece", None, False, reason="not in the report"), _row("nll", 1e-05, True))
    judged = judged_run(report)
    assert judged is not None
    suite = ET.fromstring(junit_xml(judged)).find("testsuite")
    assert suite is not None
    (failure,) = suite.iter("failure")
    assert failure.get("message") == "ece = -, bound <= 0.05: not in the report"
    (result,) = model_index(report, judged)[0]["results"]
    assert result["metrics"] == [{"name": "nll", "type": "nll", "value": 1e-05}]


def test_model_card_numbers_are_floats_to_a_yaml_1_1_reader() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with huggingface_hub (hf extra)")
    from curvcal.report.judged import judged_run
    from curvcal.report.model_card import model_card_yaml

    report = _report(_row("nll", 1e-05, True), _row("lambda_max", 3.0, True, limit=5.0))
    judged = judged_run(report)
    assert judged is not None
    text = model_card_yaml(report, judged)
    assert "value: 1.0e-05\n" in text  # "1e-05" would be a string to PyYAML
    loaded = yaml.safe_load(text.strip().strip("-"))
    values = [m["value"] for m in loaded["model-index"][0]["results"][0]["metrics"]]
    assert values == [1e-05, 3.0] and all(type(v) is float for v in values)


def test_no_metric_with_a_value_gives_an_empty_list_not_a_null() -> None:
    from curvcal.report.judged import judged_run
    from curvcal.report.model_card import model_card_yaml

    report = _report(_row("ece", None, False, reason="value is not finite"))
    judged = judged_run(report)
    assert judged is not None
    assert "        metrics: []\n" in model_card_yaml(report, judged)


def test_characters_xml_cannot_hold_are_replaced_not_written() -> None:
    from curvcal.report.judged import judged_run
    from curvcal.report.junit import junit_xml

    judged = judged_run(_report(_row("ece", 0.1, False), name="bad\x01name\x1b.json"))
    assert judged is not None
    root = ET.fromstring(junit_xml(judged))  # parses: no raw control character
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["new"] == "bad\ufffdname\ufffd.json"


def test_all_passing_and_no_borderline_gives_no_workflow_command() -> None:
    from curvcal.report.github import workflow_commands
    from curvcal.report.judged import judged_run

    inside = _row("ece", 0.01, True, interval=(0.0, 0.04))  # whole interval below the bound
    edge = _row("nll", 0.01, True, interval=(0.0, 0.05))  # reaches the bound: borderline
    judged = judged_run(_report(inside))
    assert judged is not None and workflow_commands(judged) == []
    assert not inside.borderline and edge.borderline
    judged = judged_run(_report(inside, edge))
    assert judged is not None
    (line,) = workflow_commands(judged)
    assert line.startswith("::warning title=curvcal compare borderline%3A nll <= 0.05 (new.json)::")


def test_a_change_bound_is_never_borderline() -> None:
    row = _row("ece", 0.06, True, bound="max_increase", interval=(0.0, 0.1), baseline=0.05,
               change=0.01)  # fmt: skip
    assert not row.borderline
