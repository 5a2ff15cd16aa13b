"""Shared test fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    """Keep tests single-threaded: the CI machine has two cores."""
    torch.set_num_threads(1)


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def run_cli() -> Callable[..., CliResult]:
    """Run ``curvcal.cli.main`` in-process with captured streams (the real exit-code mapping)."""
    from click.testing import CliRunner

    from curvcal.cli import main

    def invoke(*args: str, input: str | None = None) -> CliResult:
        runner = CliRunner()
        with runner.isolation(input=input) as streams:
            code = main([str(a) for a in args])
        stdout, stderr = streams[0], streams[1]
        return CliResult(code, stdout.getvalue().decode(), stderr.getvalue().decode())

    return invoke


@pytest.fixture(scope="session")
def digits_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 3-class digits checkpoint whose metadata names its architecture and 30 images for it
    (labels 0, 1, 2 in turn), written once per session: tests read them and write elsewhere."""
    from catalogue_inputs import digit_images, digits_model

    folder = tmp_path_factory.mktemp("digits")
    return digits_model(folder), digit_images(folder, 30)


@dataclass(frozen=True)
class DocsSite:
    path: Path
    stderr: str


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> DocsSite:
    """The documentation site, built once per session with ``mkdocs build --strict`` (the
    build takes tens of seconds: the tests that read the site share it)."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    build = ["mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)]
    result = subprocess.run(
        [sys.executable, "-m", *build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return DocsSite(site, result.stderr)
