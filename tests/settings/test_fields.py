"""One declaration per setting: the click option, the validation, the report's record and the
defaults all come from the field (curvcal/settings/fields.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest
from click.testing import CliRunner

from curvcal.errors import InputError, SettingsError, as_option, setting_name, wording
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import DataSettings
from curvcal.settings.fields import (
    Settings,
    click_options,
    defaults,
    from_mapping,
    groups,
    option_name,
    record,
    setting,
)
from curvcal.settings.hessian import HessianSettings


@dataclass(frozen=True)
class Toy(Settings):
    """A settings class of every kind of field."""

    GROUP: ClassVar[str] = "toy"

    count: int = setting(3, "How many.", low=1, high=10)
    ratio: float = setting(0.5, "A share.", low=0, high=1, low_open=True)
    word: str = setting("a", "One of a few words.", choices=("a", "b"))
    maybe: int | None = setting(None, "Unset by default.", low=0)
    loud: bool = setting(False, "A switch.", flag=True)
    keep: bool = setting(True, "A switch that is on.", flag=True, negatable=True)
    names: tuple[str, ...] = setting((), "Repeatable.", multiple=True)
    folder: Path | None = setting(None, "A folder.", path="dir")
    hidden: int = setting(7, "Set by the code.", cli=False)
    free: int = setting(0, "Any integer.")
    secret: str = setting("s", "Not recorded.", record=False)

    def lowest(self, name: str) -> float | None:
        return self.count if name == "maybe" else None

    def validate(self) -> None:
        if self.loud and self.word == "b":
            raise SettingsError("loud", f"cannot be combined with {setting_name('word')} b")


def _command(**kwargs: Any) -> click.Command:
    seen: list[Toy] = []

    @click.command()
    @click_options(Toy, "toy", **kwargs)
    def run(toy: Toy) -> None:
        seen.append(toy)

    run.seen = seen  # type: ignore[attr-defined]
    return run


def test_every_field_is_one_option_with_its_default_and_help() -> None:
    command = _command()
    options = {p.name: p for p in command.params}
    assert set(options) == {
        "count", "ratio", "word", "maybe", "loud", "keep", "names", "folder", "secret", "free"
    }  # fmt: skip
    assert options["free"].type is click.INT  # no range shown for an unbounded integer
    assert isinstance(options["count"].type, click.IntRange)
    assert options["count"].opts == ["--count"] and options["count"].default == 3
    assert options["keep"].secondary_opts == ["--no-keep"]
    assert options["names"].multiple
    assert "How many." in (options["count"].help or "")
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 0, result.output
    assert command.seen == [Toy()]  # type: ignore[attr-defined]


def test_typed_options_arrive_as_one_settings_object() -> None:
    command = _command()
    args = ["--count", "4", "--ratio", "1", "--word", "b", "--maybe", "5", "--no-keep",
            "--names", "x", "--names", "y", "--folder", "f"]  # fmt: skip
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    assert command.seen == [  # type: ignore[attr-defined]
        Toy(count=4, ratio=1.0, word="b", maybe=5, keep=False, names=("x", "y"), folder=Path("f"))
    ]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--count", "0"], "--count"),
        (["--count", "11"], "--count"),
        (["--ratio", "0"], "--ratio"),
        (["--word", "c"], "--word"),
    ],
)
def test_the_declared_range_and_choices_are_the_options(args: list[str], text: str) -> None:
    result = CliRunner().invoke(_command(), args)
    assert result.exit_code == 2 and text in result.output


@pytest.mark.parametrize(
    ("values", "what", "why"),
    [
        ({"count": 0}, "--count", "must be an integer ≥ 1 and ≤ 10, got 0"),
        ({"count": True}, "--count", "must be an integer, got True"),
        ({"count": 2.5}, "--count", "must be an integer"),
        ({"ratio": 0.0}, "--ratio", "must be a number > 0 and ≤ 1, got 0.0"),
        ({"ratio": float("nan")}, "--ratio", "must be a finite number"),
        ({"word": "c"}, "--word", "unknown value 'c'"),
        ({"loud": "yes"}, "--loud", "must be true or false"),
        ({"names": "x"}, "--names", "must be a list"),
        ({"folder": 3}, "--folder", "must be a path"),
        ({"maybe": 2}, "--maybe", "must be an integer ≥ 3"),  # a bound that follows --count
        ({"loud": True, "word": "b"}, "--loud", "cannot be combined with --word b"),
    ],
)
def test_values_from_python_or_a_policy_are_checked_like_options(
    values: dict[str, Any], what: str, why: str
) -> None:
    """The error names the field; the command line words it as the option, Python as the
    field (``count``), in the why as in the what."""
    with wording(as_option), pytest.raises(InputError) as caught:
        Toy(**values)
    assert caught.value.what == what
    assert why in caught.value.why
    with pytest.raises(SettingsError) as in_python:
        Toy(**values)
    field = what[2:].replace("-", "_")
    assert in_python.value.what == field and in_python.value.field == field
    assert why.replace("--word", "word") in in_python.value.why


def test_border_values_are_accepted() -> None:
    assert Toy(count=1, ratio=1.0, maybe=None).count == 1
    assert Toy(count=10, maybe=10).maybe == 10
    assert Toy(maybe=3).maybe == 3  # the dependent bound itself


def test_the_record_is_the_fields_by_option_name_as_json() -> None:
    toy = Toy(names=("x",), folder=Path("f"))
    assert record(toy) == {
        "count": 3, "ratio": 0.5, "word": "a", "maybe": None, "loud": False, "keep": True,
        "names": ["x"], "folder": "f", "hidden": 7, "free": 0,
    }  # fmt: skip
    assert groups(toy, DataSettings(data="d.pt")) == {
        "toy": record(toy),
        "data": record(DataSettings(data="d.pt")),
    }


def test_defaults_and_from_mapping() -> None:
    assert defaults(Toy)["count"] == 3 and defaults(Toy)["names"] == ()
    assert from_mapping(Toy, {"count": 5, "unknown": 1}) == Toy(count=5)
    with pytest.raises(InputError, match=r"^count: "):
        from_mapping(Toy, {"count": 50})


def test_only_and_exclude_take_a_part_of_a_class() -> None:
    command = _command(only=("count", "word"))
    assert {p.name for p in command.params} == {"count", "word"}
    result = CliRunner().invoke(command, ["--word", "b"])
    assert result.exit_code == 0, result.output
    assert command.seen == [Toy(word="b")]  # type: ignore[attr-defined]
    assert "count" not in {p.name for p in _command(exclude=("count",)).params}


def test_before_sees_the_typed_values_first() -> None:
    def refuse(values: dict[str, Any]) -> None:
        if values["loud"]:
            raise click.UsageError("--loud is refused here")

    result = CliRunner().invoke(_command(before=refuse), ["--loud", "--word", "b"])
    assert result.exit_code == 2 and "--loud is refused here" in result.output


def test_field_names_are_option_names_in_every_command_class() -> None:
    """Every real settings class: each field's option is --name-with-dashes, and the record has
    exactly the field names (one spelling from the command line to the report)."""
    for cls in (HessianSettings, CheckpointSettings, DataSettings):
        instance = cls()
        for name in record(instance):
            assert option_name(name) == "--" + name.replace("_", "-")
            assert hasattr(instance, name)
