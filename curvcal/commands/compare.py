"""`curvcal compare NEW.json OLD.json`: a policy's verdict from two saved reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from curvcal.commands.common import finish, output_options, policy_option, start
from curvcal.commands.repeats import Command
from curvcal.report.verdict import verdict_table


@click.command(cls=Command)
@click.argument("new", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("old", type=click.Path(dir_okay=False, path_type=Path))
@policy_option
@output_options
def compare(new: Path, old: Path, policy_path: Path | None) -> int:
    """Judge NEW against the policy, with OLD as the baseline, without recomputing.

    \b
    Exit 0 when every bound holds, 1 when one fails, 2 for a bad file or policy.
    """
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.provenance import environment
    from curvcal.policy.baseline import (
        load_report,
        metric_values,
        report_origin,
        setting_differences,
    )
    from curvcal.policy.evaluate import evaluate
    from curvcal.policy.keys import default
    from curvcal.policy.parse import load_policy, policy_file
    from curvcal.results import STATUS_FAIL, STATUS_PASS, Report

    policy_path = policy_file(policy_path, Path.cwd())
    _options, reporter = start(inputs=[("NEW", new), ("OLD", old), ("--policy", policy_path)])
    policy = load_policy(policy_path)
    new_report, old_report = load_report(new), load_report(old)
    judge = policy.settings.get("judge", default("judge"))
    verdict = evaluate(policy.rules, metric_values(new_report), metric_values(old_report), judge)

    warnings = [
        f"the reports were computed with different settings (OLD → NEW): {difference}"
        for difference in setting_differences(new_report, old_report)
    ]
    for warning in warnings:
        reporter.warn(warning)
    report = Report(
        command="compare",
        results=verdict,
        status=STATUS_PASS if verdict.passed else STATUS_FAIL,
        inputs={
            "new": file_info(new),
            "old": {**dataclasses.asdict(file_info(old)), **report_origin(old_report)},
            "policy": file_info(policy_path),
        },
        settings={"compare": {"policy": str(policy_path), "rules": policy.rules, "judge": judge}},
        environment=environment(),
        warnings=warnings,
    )
    return finish(report, [verdict_table(verdict, f"curvcal compare: {new} vs {old}")])
