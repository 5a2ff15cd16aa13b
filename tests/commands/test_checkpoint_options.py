"""The shared checkpoint options turn into one CheckpointSettings."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from curvcal.commands.checkpoint_options import checkpoint_options
from curvcal.settings.checkpoint import CheckpointSettings

seen: list[CheckpointSettings] = []


@click.command()
@click.argument("ckpt")
@checkpoint_options
def probe(ckpt: str, checkpoint_options: CheckpointSettings) -> None:
    """Record what the command received."""
    seen.append(checkpoint_options)


def _invoke(*args: str) -> Any:
    seen.clear()
    return CliRunner().invoke(probe, ["x.pt", *args])


def test_defaults() -> None:
    result = _invoke()
    assert result.exit_code == 0, result.output
    assert seen == [CheckpointSettings()]


def test_all_options_collected() -> None:
    result = _invoke(
        "--arch", "tv:resnet18",
        "--arch-kwargs", '{"width": 4, "name": "a"}',
        "-k", "width=16",
        "-k", "act=relu",
        "--arch-kwarg", "flags=[1, 2]",
        "--num-classes", "7",
        "--state-dict-key", "model",
        "--trust-checkpoint",
        "--allow-global", "a.B",
        "--allow-global", "c.D",
        "--device", "cpu",
        "--dtype", "float64",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert seen == [
        CheckpointSettings(
            arch="tv:resnet18",
            arch_kwargs={"width": 4, "name": "a"},
            arch_kwarg={"width": 16, "act": "relu", "flags": [1, 2]},
            num_classes=7,
            state_dict_key="model",
            trust_checkpoint=True,
            allow_global=("a.B", "c.D"),
            device="cpu",
            dtype="float64",
        )
    ]
    # -k pairs override keys of --arch-kwargs
    assert seen[0].keywords == {"width": 16, "name": "a", "act": "relu", "flags": [1, 2]}


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--arch-kwargs", "{width: 4}"), "--arch-kwargs"),
        (("--arch-kwargs", "[1, 2]"), "--arch-kwargs"),
        (("-k", "width"), "--arch-kwarg"),
        (("--num-classes", "0"), "--num-classes"),
        (("--dtype", "int8"), "--dtype"),
    ],
)
def test_bad_values_name_the_option(args: tuple[str, ...], option: str) -> None:
    result = _invoke(*args)
    assert result.exit_code == 2
    assert option in result.output
    assert seen == []
