"""The documentation site: every command docs/*.md shows is run, the site builds in strict mode,
and every command has its page.

Shell blocks are run by README's machinery (:mod:`tests.examples.test_readme`: the same
placeholder tables ``ARGUMENTS``, ``FILES`` and ``REPORTS``), Python blocks are executed in a
folder holding the files they name. A recipe page (``docs/recipes/``) is run as one session
instead: its Python and shell blocks in page order in one folder, with no placeholders, so the
files its Python saves with the real libraries are the ones its commands read. ``mkdocs build --strict`` turns every warning (a broken link,
a docstring mkdocstrings cannot read, a command page whose options cannot be rendered) into a failure.
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
RECIPES = sorted((DOCS / "recipes").glob("*.md"))
BLOCK_PAGES = [page for page in PAGES if page not in RECIPES]
#: pages whose Python blocks build on each other: run in order by their own test
#: (tests/examples/test_python_api_page.py), not one by one here
PYTHON_SESSIONS = [DOCS / "guide" / "python-api.md"]


def _page_blocks() -> list[tuple[Path, int]]:
    return [(page, block) for page in BLOCK_PAGES for block in sorted(readme._blocks(page))]


def test_docs_show_only_commands_the_tests_run() -> None:
    programs = {p for page in PAGES for p, _, _ in readme.all_commands(page)}
    assert programs <= {"curvcal", "pip", "make", "python", "torchrun"}, programs
    assert sum(p == "curvcal" for page in PAGES for p, _, _ in readme.all_commands(page)) >= 40


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
    if any(c.expected_error for _, c, _ in commands):
        readme._bad_policy(tmp_path / "gate.toml")
    readme._run_block(commands, tmp_path, run_cli, monkeypatch, str(page.relative_to(ROOT)))


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize(
    ("page", "code"),
    [
        (page, code)
        for page in BLOCK_PAGES
        if page not in PYTHON_SESSIONS
        for code in _python_blocks(page)
    ],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)
def test_docs_python_block(page: Path, code: str, tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in re.findall(r"\"([\w.-]+\.(?:json|pt|npz|safetensors|toml))\"", code):
        readme._provide(name, tmp_path, run_cli)
    script = tmp_path / "block.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")


def _session(page: Path) -> list[tuple[int, str | list[tuple[str, readme.Command, int]]]]:
    """(line, Python source or shell commands) of every block of ``page``, in page order."""
    text = page.read_text()
    steps: list[tuple[int, str | list[tuple[str, readme.Command, int]]]] = [
        (text.count("\n", 0, found.start()) + 1, found.group(1))
        for found in re.finditer(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    ]
    for commands in readme._blocks(page).values():
        steps.append((commands[0][1].line, commands))
    return sorted(steps, key=lambda step: step[0])


def test_every_recipe_shows_python_then_the_commands_on_its_files() -> None:
    assert {page.stem for page in RECIPES} >= {"torchvision", "timm", "hf-image", "logits"}
    for page in RECIPES:
        steps = _session(page)
        assert isinstance(steps[0][1], str), page  # the files come first, saved by the library
        assert sum(not isinstance(code, str) for _, code in steps) >= 1, page
        assert f"recipes/{page.name}" in (ROOT / "mkdocs.yml").read_text(), page


@pytest.mark.slow
@pytest.mark.parametrize("page", RECIPES, ids=lambda page: page.stem)
def test_recipe(page: Path, tmp_path: Path, run_cli, monkeypatch) -> None:
    """Every block of the page, in order, in one folder: the Python saves a model the way its
    library does, and each command then runs on what it saved (no stand-ins)."""
    monkeypatch.chdir(tmp_path)
    where = str(page.relative_to(ROOT))
    for line, step in _session(page):
        if isinstance(step, str):
            script = tmp_path / f"block{line}.py"
            script.write_text(step)
            runpy.run_path(str(script), run_name="__main__")
            script.unlink()
        else:
            readme._run_block(step, tmp_path, run_cli, monkeypatch, where, arguments={})


def test_the_policy_example_is_read_and_runs(tmp_path: Path, run_cli, monkeypatch) -> None:
    """The CI gate page's policy example is a policy `check` accepts on the bundled model."""
    from curvcal.assets import demo_checkpoint
    from curvcal.policy.parse import load_policy

    (policy,) = readme.toml_blocks(readme.POLICY_PAGE)
    path = tmp_path / "gate.toml"
    path.write_text(policy)
    assert {rule.key for rule in load_policy(path).rules} >= {"ece", "ts.ece", "trace"}
    monkeypatch.chdir(tmp_path)
    result = run_cli("check", demo_checkpoint(), "--policy", path, "--json")
    assert result.code in (0, 1), result.output


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f" {page.relative_to(DOCS).as_posix()}\n" in nav, page


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


def test_the_site_builds_in_strict_mode(docs_site) -> None:
    assert "WARNING" not in docs_site.stderr, docs_site.stderr
    hessian = (docs_site.path / "commands" / "hessian" / "index.html").read_text()
    assert "--top-k" in hessian  # options rendered from the click command
    api = (docs_site.path / "api" / "curvature" / "index.html").read_text()
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
