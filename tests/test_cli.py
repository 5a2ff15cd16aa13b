"""The CLI shell: exit codes, one-line errors, output options, JSON validity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from curvcal import __version__


def test_version_flag(run_cli) -> None:
    result = run_cli("--version")
    assert result.code == 0
    assert __version__ in result.output


def test_unknown_command_is_usage_error_one_line(run_cli) -> None:
    result = run_cli("no-such-command")
    assert result.code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("curvcal: error: ")
    assert "Traceback" not in result.stderr


def test_json_on_command_and_on_group_give_only_json(run_cli) -> None:
    for args in (("version", "--json"), ("--json", "version")):
        result = run_cli(*args)
        assert result.code == 0, result.output
        document = json.loads(result.stdout)
        assert document["schema"] == "2.0"
        assert document["curvcal"] == __version__
        assert document["status"] == "ok"
        assert document["environment"]["torch"]


def test_output_file_written_and_not_overwritten_without_force(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert run_cli("version", "-o", str(out)).code == 0
    first = out.read_text()
    assert json.loads(first)["command"] == "version"
    result = run_cli("version", "-o", str(out))
    assert result.code == 2
    assert "already exists" in result.stderr and str(out) in result.stderr
    assert out.read_text() == first
    assert run_cli("version", "-o", str(out), "--force").code == 0


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("version", "--json", "--format", "table"), ("--json", "--format table")),
        (("--format", "markdown", "version", "--json"), ("--format markdown", "--json")),
        (("-o", "{a}", "version", "-o", "{b}"), ("-o {a}", "-o {b}")),
    ],
)
def test_two_different_formats_or_outputs_are_refused(
    run_cli, tmp_path: Path, args: tuple[str, ...], named: tuple[str, str]
) -> None:
    """Output options may be given on the group or the command, but two different values used
    to leave the last one winning unnoticed (one requested file was never written)."""
    paths = {"a": str(tmp_path / "a.json"), "b": str(tmp_path / "b.json")}
    result = run_cli(*(arg.format(**paths) for arg in args))
    assert result.code == 2 and "disagree" in result.stderr
    for name in named:
        assert name.format(**paths) in result.stderr
    assert not list(tmp_path.iterdir())
    same = run_cli("--json", "version", "--format", "json")
    assert same.code == 0 and json.loads(same.stdout)["command"] == "version"


def test_output_to_a_dash_is_refused_not_a_file_named_dash(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("version", "-o", "-")
    assert result.code == 2 and "--json" in result.stderr
    assert not (tmp_path / "-").exists()


def test_output_into_missing_directory_is_input_error(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "report.json"
    result = run_cli("version", "--output", str(out))
    assert result.code == 2
    assert "does not exist" in result.stderr
    assert not out.exists()


def test_markdown_format(run_cli) -> None:
    result = run_cli("version", "--format", "markdown")
    assert result.code == 0
    assert "| item | value |" in result.stdout


def test_python_dash_m_entry_point() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "curvcal", "--version"], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0
    assert __version__ in completed.stdout


def test_help_does_not_import_torch() -> None:
    """`curvcal --help` stays fast: the CLI shell, commands and public API import torch lazily."""
    code = "import sys, curvcal.cli, curvcal; curvcal.__all__; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.stdout.strip() == "False", completed.stderr


def test_public_api_exports_resolve() -> None:
    import curvcal

    for name in curvcal.__all__:
        assert getattr(curvcal, name) is not None


def test_every_registered_command_loads_and_help_lists_them(run_cli) -> None:
    from curvcal.commands import COMMANDS, load_command

    result = run_cli("--help")
    assert result.code == 0
    for name in COMMANDS:
        assert load_command(name).name == name
        assert name in result.stdout


def test_top_level_help_imports_no_command() -> None:
    code = (
        "import sys; from curvcal.cli import main; main(['--help']); "
        "print([m for m in sys.modules if m.startswith(('torch', 'curvcal.commands.'))"
        " and m not in ('curvcal.commands.common', 'curvcal.commands.repeats',"
        " 'curvcal.commands.clashes')])"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.stdout.strip().endswith("[]"), completed.stdout + completed.stderr
