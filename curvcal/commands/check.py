"""`curvcal check CKPT --policy FILE`: measure what a policy gates on a checkpoint, and judge it.

A shell over :func:`curvcal.pipeline.check.check_checkpoint`: it gathers the options given on the
command line (they override the policy's ``[settings]``), reads the policy (whose data the run
will read), and hands the verdict to the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from curvcal import choices
from curvcal.commands.checkpoint_options import checkpoint_options
from curvcal.commands.common import finish, output_options, start, typed_options
from curvcal.commands.data_options import text_options
from curvcal.commands.repeats import Command
from curvcal.report.check import check_tables

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings

# Command-line parameter -> the policy setting it overrides.
_OVERRIDES = {
    "arch": "arch",
    "arch_kwargs": "arch_kwargs",
    "arch_kwarg": "arch_kwargs",
    "num_classes": "num_classes",
    "state_dict_key": "state_dict_key",
    "device": "device",
    "dtype": "dtype",
    "data": "data",
    "data_root": "data_root",
    "max_samples": "max_samples",
    "text_key": "text_key",
    "label_key": "label_key",
    "text_pair_key": "text_pair_key",
    "tokenizer": "tokenizer",
    "max_length": "max_length",
    "batch_size": "batch_size",
    "seed": "seed",
}


@click.command(cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Policy TOML file [default: [tool.curvcal] in ./pyproject.toml].",
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="REPORT.json",
    help="A saved curvcal report (check, hessian, calibrate, ...) for the change bounds.",
)
@checkpoint_options
@click.option("--data", metavar="SPEC", help="Dataset (overrides the policy's data).")
@click.option(
    "--data-root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of torchvision datasets.",
)
@click.option("--max-samples", type=click.IntRange(min=1), help="Use a random subset.")
@text_options
@click.option("--batch-size", type=click.IntRange(min=1), help="Samples per batch [default: 256].")
@click.option(
    "--seed",
    type=click.IntRange(0, choices.MAX_SEED),
    help="Seed of splits and probes [default: 0].",
)
@click.option("--strict", is_flag=True, help="Exit 3 when a Hessian estimate does not converge.")
@output_options
def check(
    checkpoint: Path,
    policy_path: Path | None,
    baseline: Path | None,
    checkpoint_options: CheckpointSettings,
    data: str | None,
    data_root: Path | None,
    max_samples: int | None,
    text_key: str | None,
    label_key: str | None,
    text_pair_key: str | None,
    tokenizer: Path | None,
    max_length: int | None,
    batch_size: int | None,
    seed: int | None,
    strict: bool,
) -> int:
    """Measure what the policy gates on CHECKPOINT and judge every bound.

    \b
    Settings: an option given here, else the policy's [settings], else the default.
    Exit 0 when every bound holds, 1 when one fails, 2 for bad input, 3 for a
    numerical failure (a gated metric NaN/Inf; an estimate unconverged under --strict).
    """
    from curvcal.errors import InputError
    from curvcal.outputs import arch_inputs, checkpoint_inputs, data_inputs, tokenizer_inputs
    from curvcal.pipeline.check import CheckRequest, check_checkpoint
    from curvcal.policy.parse import find_pyproject_policy, load_policy
    from curvcal.policy.settings import resolve_settings

    if policy_path is None:
        policy_path = find_pyproject_policy(Path.cwd())
        if policy_path is None:
            raise InputError(
                "--policy",
                "no policy given and ./pyproject.toml has no [tool.curvcal] table",
                "pass --policy FILE",
            )
    policy = load_policy(policy_path)
    given = {
        "data": data,
        "data_root": str(data_root) if data_root is not None else None,
        "max_samples": max_samples,
        "text_key": text_key,
        "label_key": label_key,
        "text_pair_key": text_pair_key,
        "tokenizer": str(tokenizer) if tokenizer is not None else None,
        "max_length": max_length,
        "batch_size": batch_size,
        "seed": seed,
        "arch": checkpoint_options.arch,
        "arch_kwargs": dict(checkpoint_options.keywords),
        "num_classes": checkpoint_options.num_classes,
        "state_dict_key": checkpoint_options.state_dict_key,
        "device": checkpoint_options.device,
        "dtype": checkpoint_options.dtype,
    }
    overrides = _given_on_command_line(given)
    settings, _sources = resolve_settings(policy, overrides)
    inputs = [
        *checkpoint_inputs("CHECKPOINT", checkpoint, settings["arch"]),
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
        trust=checkpoint_options.trust_checkpoint,
        allow_globals=checkpoint_options.allow_global,
        strict=strict,
    )
    run = check_checkpoint(request, reporter)
    code = finish(
        run.report, check_tables(run.result, f"curvcal check: {checkpoint} against {policy_path}")
    )
    if run.failure is not None:
        raise run.failure
    return code


def _given_on_command_line(values: dict[str, Any]) -> dict[str, Any]:
    """The settings whose options were typed on the command line (not left at a default)."""
    return {_OVERRIDES[name]: values[_OVERRIDES[name]] for name in typed_options(_OVERRIDES)}
