"""Kernels name a setting by its field; the command line words it as the option.

A calibration or curvature kernel is reached from Python (``curvcal.fit_map``, the API) as well
as from the command line, so its errors name settings through ``setting_name``: Python sees the
field (``histogram_bins``), the command line the option (``--histogram-bins``). An option
written into a kernel would tell a Python caller to pass ``--histogram-bins``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import curvcal
from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.binary import fit_binary
from curvcal.calibration.binning import fit_histogram
from curvcal.calibration.laplace import resolve_structure
from curvcal.errors import InputError, as_option, wording
from curvcal.settings.calibration import CalibrationSettings

KERNELS = Path(curvcal.__file__).parent
#: the packages whose modules are kernels, reached from Python and from the command line
KERNEL_PACKAGES = ("calibration", "curvature")
#: the one kernel module that speaks to the command line alone: the slow-run note names the
#: options to type (``--no-trace`` has no field wording), and only a command run prints it
COMMAND_LINE_ADVICE = {"curvature/forecast.py"}


#: an option written in a string: ``--x`` at its start or after a space or a bracket
OPTION = re.compile(r"(?:^|[\s(])--[a-z]")


def _option_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string in ``path`` that writes an option (``--x``), docstrings
    left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if id(node) not in docstrings and OPTION.search(text):
                found.append((node.lineno, text))
    return found


def test_no_kernel_writes_an_option_into_its_messages() -> None:
    written = [
        f"{path.relative_to(KERNELS)}:{line}: {text!r}"
        for package in KERNEL_PACKAGES
        for path in sorted((KERNELS / package).rglob("*.py"))
        if str(path.relative_to(KERNELS)) not in COMMAND_LINE_ADVICE
        for line, text in _option_literals(path)
    ]
    assert written == []


def test_the_scan_finds_an_option_written_into_a_kernel(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""--doc."""\n\ndef f():\n    raise ValueError("--method", f"--bins {1}", "use --x", "a--b")\n'
    )
    assert sorted(text for _, text in _option_literals(module)) == [
        "--bins ",
        "--method",
        "use --x",
    ]


def _logits(k: int = 3, n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    rng = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=rng), torch.randint(0, k, (n,), generator=rng)


def _histogram_with_too_many_bins() -> None:
    z, y = _logits()
    fit_histogram(z, y, n_bins=41)


def _binary_map_on_three_classes() -> None:
    z, y = _logits()
    fit_binary(z, y, "platt")


def _unknown_structure() -> None:
    resolve_structure("diagonal", 10)


def _method_none_with_a_fit_split() -> None:
    z, y = _logits()
    analyse_calibration(z, y, z, y, "logits", CalibrationSettings("none"))


def _fit_map_with_zero_bins() -> None:
    z, y = _logits()
    curvcal.fit_map("histogram", z, y, histogram_bins=0)


CASES: list[tuple[Callable[[], Any], str]] = [
    (_histogram_with_too_many_bins, "histogram_bins"),
    (_binary_map_on_three_classes, "method platt"),
    (_unknown_structure, "laplace_structure"),
    (_method_none_with_a_fit_split, "method none"),
    (_fit_map_with_zero_bins, "histogram_bins"),
]


@pytest.mark.parametrize(("call", "field"), CASES, ids=[call.__name__ for call, _ in CASES])
def test_python_hears_the_field_and_the_command_line_the_option(
    call: Callable[[], Any], field: str
) -> None:
    with pytest.raises(InputError) as python:
        call()
    assert python.value.message.startswith(f"{field}: ")
    assert "--" not in python.value.message
    with wording(as_option), pytest.raises(InputError) as command_line:
        call()
    name, _, value = field.partition(" ")
    option = as_option(name) + (f" {value}" if value else "")
    assert command_line.value.message.startswith(f"{option}: ")
