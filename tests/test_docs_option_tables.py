"""The guides' option tables cover every option of their settings class, and name no option the
command does not have: a field added to the settings and forgotten in the guide fails here."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import Settings, cli_fields, option_name
from curvcal.settings.hessian import HessianSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"


def table_options(path: Path) -> set[str]:
    """The options named in the first cell of each row of ``path``'s option tables."""
    found: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `--"):
            found.update(re.findall(r"--[a-z][a-z0-9-]*", line.split(" | ")[0]))
    return found


def command_options(module: str, name: str) -> set[str]:
    import importlib

    command: click.Command = getattr(importlib.import_module(module), name)
    return {
        option
        for parameter in command.params
        for option in (*parameter.opts, *parameter.secondary_opts)
        if option.startswith("--")
    }


@pytest.mark.parametrize(
    ("cls", "guide", "module", "command"),
    [
        (HessianSettings, "guide/hessian.md", "curvcal.commands.hessian", "hessian"),
        (CalibrationSettings, "guide/calibration.md", "curvcal.commands.calibrate", "calibrate"),
    ],
)
def test_every_option_of_the_settings_is_in_its_guide_table(
    cls: type[Settings], guide: str, module: str, command: str
) -> None:
    documented = table_options(DOCS / guide)
    missing = [option_name(f.name) for f, _spec in cli_fields(cls)]
    missing = [option for option in missing if option not in documented]
    assert missing == [], f"{guide} has no row for {', '.join(missing)}"
    unknown = documented - command_options(module, command)
    assert unknown == set(), f"{guide} names options curvcal {command} does not have: {unknown}"


def test_a_field_missing_from_a_table_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("| option | meaning |\n| --- | --- |\n| `--top-k K` | how many |\n")
    assert table_options(page) == {"--top-k"}
