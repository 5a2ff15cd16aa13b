"""The documentation site: every command docs/*.md shows is run, the site builds in strict mode,
and every command has its page.

Shell blocks are run by README's machinery (:mod:`tests.examples.test_readme`: the same
placeholder tables ``ARGUMENTS``, ``FILES`` and ``REPORTS``), Python blocks are executed in a
folder holding the files they name. ``mkdocs build --strict`` turns every warning (a broken link,
a docstring mkdocstrings cannot read, a command mkdocs-click cannot render) into a failure.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import test_readme as readme

from curvcal.commands import COMMANDS

ROOT = readme.ROOT
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _page_blocks() -> list[tuple[Path, int]]:
    return [(page, block) for page in PAGES for block in sorted(readme._blocks(page))]


def test_docs_show_only_commands_the_tests_run() -> None:
    programs = {p for page in PAGES for p, _, _ in readme.all_commands(page)}
    assert programs <= {"curvcal", "pip", "make"}, programs
    assert sum(p == "curvcal" for page in PAGES for p, _, _ in readme.all_commands(page)) >= 9


def test_pip_lines_name_files_and_extras_that_exist() -> None:
    """`pip install` is not run (no network in tests): its constraints file and extras exist."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    for page in PAGES:
        for program, command, _ in readme.all_commands(page):
            if program != "pip":
                continue
            argv = command.argv
            assert argv[:1] == ["install"], argv
            if "-c" in argv:
                assert (ROOT / argv[argv.index("-c") + 1]).is_file(), argv
            for extra in re.findall(r"\[([a-z,]+)\]", " ".join(argv)):
                for name in extra.split(","):
                    assert re.search(rf"^{name} = \[", pyproject, re.MULTILINE), name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "block"), _page_blocks(), ids=lambda v: v.name if isinstance(v, Path) else str(v)
)
def test_docs_block(page: Path, block: int, tmp_path: Path, run_cli, monkeypatch) -> None:
    commands = readme._blocks(page)[block]
    readme._run_block(commands, tmp_path, run_cli, monkeypatch, str(page.relative_to(ROOT)))


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize(
    ("page", "code"),
    [(page, code) for page in PAGES for code in _python_blocks(page)],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)
def test_docs_python_block(page: Path, code: str, tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in re.findall(r"\"([\w.-]+\.(?:json|pt|npz|safetensors|toml))\"", code):
        readme._provide(name, tmp_path, run_cli)
    script = tmp_path / "block.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")


def test_every_command_has_a_page_rendered_from_its_click_object() -> None:
    for name in COMMANDS:
        text = (DOCS / "commands" / f"{name}.md").read_text()
        assert f":module: curvcal.commands.{name}\n" in text, name
        assert f":command: {name}\n" in text, name
        assert f"commands/{name}.md" in (ROOT / "mkdocs.yml").read_text(), name


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs comes with the docs extra (make test installs it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    hessian = (tmp_path / "site" / "commands" / "hessian" / "index.html").read_text()
    assert "--top-k" in hessian  # options rendered from the click command
    api = (tmp_path / "site" / "api" / "curvature" / "index.html").read_text()
    assert "hessian_eigenvalues" in api  # the API reference from the docstrings


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The strict build is a real check: a page linking to a missing page fails it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[missing](nowhere.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: x\ndocs_dir: docs\n")
    result = _build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "nowhere.md" in result.stderr
