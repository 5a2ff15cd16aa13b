"""The shared --data options: parsing into DataSettings and option errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from curvcal.commands.data_options import data_options
from curvcal.settings.data import DataSettings

SEEN: dict[str, Any] = {}


def _command(required: bool) -> click.Command:
    @click.command()
    @click.option("--other", default=1, type=int)
    @data_options(required=required)
    def probe(data_options: DataSettings | None, other: int) -> None:
        """A stand-in command."""
        batch_size = data_options.batch_size if data_options is not None else None
        SEEN.update(data_options=data_options, batch_size=batch_size, other=other)

    return probe


def _invoke(required: bool, *args: str) -> click.testing.Result:
    SEEN.clear()
    return CliRunner().invoke(_command(required), list(args))


def test_all_options_reach_dataoptions() -> None:
    result = _invoke(
        True,
        "--data", "tv:cifar10:train", "--data-root", "roots", "--download",
        "--mean", "0.5,0.4,0.3", "--std", "0.2, 0.2, 0.2", "--resize", "36", "--crop", "32",
        "--max-samples", "100", "--subset-seed", "7", "--x-key", "a", "--y-key", "b",
        "--batch-size", "64", "--other", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert SEEN["data_options"] == DataSettings(
        data="tv:cifar10:train",
        data_root=Path("roots"),
        download=True,
        mean=(0.5, 0.4, 0.3),
        std=(0.2, 0.2, 0.2),
        resize=36,
        crop=32,
        max_samples=100,
        subset_seed=7,
        x_key="a",
        y_key="b",
        batch_size=64,
    )
    assert SEEN["batch_size"] == 64 and SEEN["other"] == 3
    assert SEEN["data_options"].trust_checkpoint is False


def test_defaults_and_wraps() -> None:
    assert _invoke(True, "--data", "d.pt").exit_code == 0
    assert SEEN["batch_size"] == 256
    assert SEEN["data_options"] == DataSettings(data="d.pt")
    assert _command(True).help == "A stand-in command."


def test_required_and_optional() -> None:
    result = _invoke(True)
    assert result.exit_code == 2 and "--data" in result.output
    assert _invoke(False).exit_code == 0
    assert SEEN["data_options"] is None
    result = _invoke(False, "--max-samples", "5")
    assert result.exit_code == 2 and "--max-samples given without --data" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mean", "0.5,abc"), "--mean"),
        (("--std", "0.5,0"), "--std"),
        (("--std", "nan"), "--std"),
        (("--mean", ","), "--mean"),
        (("--batch-size", "0"), "--batch-size"),
        (("--max-samples", "0"), "--max-samples"),
    ],
)
def test_bad_values(args: tuple[str, ...], message: str) -> None:
    result = _invoke(True, "--data", "d.pt", *args)
    assert result.exit_code == 2
    assert message in result.output
