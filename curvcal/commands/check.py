"""`curvcal check CKPT --policy FILE`: measure what a policy gates on a checkpoint, and judge it.

A shell over :func:`curvcal.pipeline.check.check_checkpoint`: it gathers the options given on the
command line (they override the policy's ``[settings]``), reads the policy (whose data the run
will read), and hands the verdict to the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from curvcal.commands.common import end_with, finish, output_options, policy_option, start
from curvcal.commands.repeats import Command
from curvcal.report.check import check_tables
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.check import CheckSettings
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import TEXT_FIELDS, DataSettings
from curvcal.settings.fields import click_options
from curvcal.settings.hessian import HessianSettings

#: the data options of ``check`` (the rest of a dataset's settings are the defaults)
_DATA_OPTIONS = (
    "data", "data_root", "max_samples", "mean", "std", "resize", "crop", "x_key", "y_key",
    *TEXT_FIELDS, "batch_size",
)  # fmt: skip
_POLICY = "the policy's"


@click.command(cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@policy_option
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="REPORT.json",
    help="A saved curvcal report (check, hessian, calibrate, ...) for the change bounds.",
)
@click_options(CheckpointSettings, "checkpoint_given", no_defaults=True, fallback=_POLICY)
@click_options(DataSettings, "data_given", only=_DATA_OPTIONS, no_defaults=True, fallback=_POLICY)
@click_options(
    CalibrationSettings,
    "seed_given",
    only=("seed", "bootstrap"),
    no_defaults=True,
    fallback=_POLICY,
    helps={"seed": "Seed of splits, bootstrap and probes."},
)
@click_options(
    HessianSettings,
    "hessian_given",
    only=("params", "memory_budget"),
    no_defaults=True,
    fallback=_POLICY,
)
@click_options(CheckSettings, "check_given", no_defaults=True, fallback=_POLICY)
@click.option("--strict", is_flag=True, help="Exit 3 when a Hessian estimate does not converge.")
@output_options
def check(
    checkpoint: Path,
    policy_path: Path | None,
    baseline: Path | None,
    checkpoint_given: dict[str, Any],
    data_given: dict[str, Any],
    seed_given: dict[str, Any],
    hessian_given: dict[str, Any],
    check_given: dict[str, Any],
    strict: bool,
) -> int:
    """Measure what the policy gates on CHECKPOINT and judge every bound.

    \b
    Settings: an option given here, else the policy's [settings], else the default.
    Exit 0 when every bound holds, 1 when one fails, 2 for bad input, 3 for a
    numerical failure (a gated metric NaN/Inf; an estimate unconverged under --strict).
    """
    from curvcal.commands.clashes import (
        arch_inputs,
        checkpoint_inputs,
        data_inputs,
        tokenizer_inputs,
    )
    from curvcal.pipeline.check import CheckRequest, check_checkpoint
    from curvcal.policy.parse import load_policy, policy_file
    from curvcal.policy.settings import overrides_of, resolve_settings

    policy_path = policy_file(policy_path, Path.cwd())
    policy = load_policy(policy_path)
    trust = bool(checkpoint_given.pop("trust_checkpoint", False))
    allow_globals = tuple(checkpoint_given.pop("allow_global", ()))
    pairs = checkpoint_given.pop("arch_kwarg", None)
    if pairs is not None:  # -k pairs win over --arch-kwargs, as on every command
        checkpoint_given["arch_kwargs"] = {**checkpoint_given.get("arch_kwargs", {}), **pairs}
    overrides = {
        **overrides_of(CheckpointSettings, checkpoint_given),
        **overrides_of(DataSettings, data_given),
        **overrides_of(CalibrationSettings, seed_given),
        **overrides_of(HessianSettings, hessian_given),
        **overrides_of(CheckSettings, check_given),
    }
    settings, _sources = resolve_settings(policy, overrides)
    inputs = [
        *checkpoint_inputs("CHECKPOINT", checkpoint, settings["arch"], settings.get("base_model")),
        ("--policy", policy_path),
    ]
    if baseline is not None:
        inputs.append(("--baseline", baseline))
    _options, reporter = start(
        inputs=[
            *inputs,
            *arch_inputs("arch", settings["arch"]),
            *data_inputs("data", settings["data"], settings["data_root"]),
            *data_inputs("fit_data", settings["fit_data"], settings["data_root"]),
            *tokenizer_inputs("tokenizer", settings["tokenizer"]),
        ]
    )
    request = CheckRequest(
        checkpoint=checkpoint,
        policy=policy,
        overrides=overrides,
        baseline=baseline,
        trust=trust,
        allow_globals=allow_globals,
        strict=strict,
    )
    run = check_checkpoint(request, reporter)
    if not run.result.is_main:  # under torchrun, rank 0 writes the report
        return 0
    code = finish(
        run.report, check_tables(run.result, f"curvcal check: {checkpoint} against {policy_path}")
    )
    return end_with(run.failure, code)
