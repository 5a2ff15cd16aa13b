"""The --allow-global rule: plain data classes in, anything that can run code out."""

from __future__ import annotations

import enum
import os
import subprocess
from dataclasses import dataclass
from typing import NamedTuple

import pytest

from curvcal.errors import InputError
from curvcal.load.files.allowlist import allowed_class, could_be_allowed


@dataclass
class Config:
    lr: float


class Point(NamedTuple):
    x: float
    y: float


class Colour(enum.Enum):
    RED = 1


class Settings(dict):  # type: ignore[type-arg]
    pass


class Shell(subprocess.Popen):  # type: ignore[type-arg]
    pass


class Meta(type):
    pass


Popen = subprocess.Popen  # a re-export under a harmless-looking module
system = os.system


def helper() -> None:
    return None


@pytest.mark.parametrize("cls", [Config, Point, Colour, Settings])
def test_plain_data_classes_are_admitted(cls: type) -> None:
    assert allowed_class(f"{__name__}.{cls.__qualname__}") is cls
    assert could_be_allowed(f"{__name__}.{cls.__qualname__}")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("builtins.exec", "builtins is a module that can reach"),
        ("builtins.eval", "builtins is a module"),
        ("builtins.getattr", "builtins is a module"),
        ("os.system", "os is a module"),
        ("posix.system", "posix is a module"),
        ("subprocess.Popen", "subprocess is a module"),
        ("functools.partial", "functools is a module"),
        ("operator.methodcaller", "operator is a module"),
        ("types.FunctionType", "types is a module"),
        ("importlib.machinery.SourceFileLoader", "importlib is a module"),
        ("ctypes.CDLL", "ctypes is a module"),
        ("logging.FileHandler", "logging is a module"),
        ("numpy.memmap", "numpy.memmap opens files"),
        (f"{__name__}.Popen", "is subprocess.Popen: subprocess is a module"),
        (f"{__name__}.Shell", "derives from subprocess.Popen"),
        (f"{__name__}.Meta", "derives from builtins.type"),
        (f"{__name__}.system", "is a function, not a class"),
        (f"{__name__}.helper", "is a function, not a class"),
        (f"{__name__}.subprocess", "is a module, not a class"),
    ],
)
def test_anything_that_can_run_code_is_refused(name: str, why: str) -> None:
    with pytest.raises(InputError) as raised:
        allowed_class(name)
    message = raised.value.message
    assert message.startswith(f"--allow-global {name}: ") and why in message
    assert "only --trust-checkpoint runs code from a file" in message
    assert not could_be_allowed(name)


@pytest.mark.parametrize("name", ["Config", "no.such.Module", f"{__name__}.Missing"])
def test_names_that_do_not_import_are_input_errors(name: str) -> None:
    with pytest.raises(InputError, match="--allow-global"):
        allowed_class(name)


def test_a_denied_module_is_never_imported() -> None:
    """The deny-list is checked on the name: importing ``antigravity`` would open a browser."""
    import sys

    sys.modules.pop("antigravity", None)
    with pytest.raises(InputError, match="antigravity is a module"):
        allowed_class("antigravity.Anything")
    assert "antigravity" not in sys.modules


def test_suggestion_is_for_class_like_names_of_import_safe_or_imported_modules() -> None:
    # a module nobody imported may do anything when imported: never suggested
    assert not could_be_allowed("some_unimported_package.TrainConfig")
    assert not could_be_allowed("some_unimported_package.make_payload")
    assert not could_be_allowed("lib2to3.__main__.Anything")  # a program, run at import
    assert could_be_allowed("decimal.Decimal")
    assert not could_be_allowed("torch.nn.modules.linear.Linear")  # whole modules need trust
