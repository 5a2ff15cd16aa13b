"""``curvcal <command> --help`` imports no torch, for every registered command: help must be
instant, so option choices are torch-free constants and commands load kernels only to run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from curvcal.commands import COMMANDS

PROBE = (
    "import sys\n"
    "from curvcal.cli import main\n"
    "code = main([{command!r}, '--help'])\n"
    "assert code == 0, code\n"
    "heavy = sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules)\n"
    "print('HEAVY', heavy)\n"
)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_imports_no_torch(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(command=command)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: curvcal" in done.stdout
    assert done.stdout.strip().endswith("HEAVY []"), done.stdout[-300:]


def test_the_probe_sees_torch_when_it_is_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import torch, sys; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "True"
