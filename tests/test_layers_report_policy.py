"""Import direction of the presentation and policy layers, read from the source (ast), so that a
violation is found without importing anything.

* ``curvcal.report`` is called by the commands only: it imports nothing from the commands, the
  run layer or the CLI, and no module outside ``curvcal.commands`` and ``curvcal.report`` imports
  it;
* kernels, loaders and the policy import neither ``curvcal.report`` nor ``curvcal.commands``;
* ``curvcal.policy`` imports no kernel, no loader and no third-party package (judging a saved
  report needs neither torch nor numpy): only the standard library, ``curvcal.errors``,
  ``curvcal.results``, ``curvcal.paths`` (the input-path check), ``curvcal.jsontext`` (the
  bounded JSON reader, standard library only) and itself;
* no command module imports another command;
* no import cycle passes through ``curvcal.report`` or ``curvcal.policy``.

Every import counts: module level, inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from curvcal.commands import COMMANDS

PACKAGE = Path(__file__).resolve().parents[1] / "curvcal"

RUN_LAYER = ("curvcal.commands", "curvcal.pipeline", "curvcal.cli")
KERNELS_AND_LOADERS = ("curvcal.curvature", "curvcal.calibration", "curvcal.load")
POLICY_MAY_IMPORT = (
    "curvcal.errors",
    "curvcal.results",
    "curvcal.paths",
    "curvcal.jsontext",
    "curvcal.policy",
    # the settings' declarations, from which a policy's keys, defaults and choices derive
    "curvcal.settings",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports (``from a import b`` counts as ``a`` and ``a.b``, since
    ``b`` may be a submodule); relative imports are resolved against ``module``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """curvcal module -> the curvcal modules (that exist) it imports."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        imports = imported_modules(path.read_text(encoding="utf-8"), name, path.stem == "__init__")
        edges[name] = {target for target in imports if target in paths and target != name}
    return edges


def within(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def all_imports(module: str) -> set[str]:
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    return imported_modules(path.read_text(encoding="utf-8"), module, path.stem == "__init__")


EDGES = graph()


def test_the_import_reader_sees_every_kind_of_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import curvcal.errors\n"
        "from . import tables\n"
        "from .plots import require_matplotlib\n"
        "from ..commands.common import start\n"
        "if TYPE_CHECKING:\n"
        "    from curvcal.load.checkpoint import LoadedModel\n"
        "def late():\n"
        "    from curvcal.gate import run_check\n"
    )
    found = imported_modules(source, "curvcal.report.calibration")
    for expected in (
        "curvcal.errors",
        "curvcal.report.tables",
        "curvcal.report.plots",
        "curvcal.commands.common",
        "curvcal.load.checkpoint",
        "curvcal.gate",
    ):
        assert expected in found, expected


def test_the_layers_under_test_exist() -> None:
    assert any(within(m, "curvcal.report") for m in EDGES)
    assert any(within(m, "curvcal.policy") for m in EDGES)
    assert {f"curvcal.commands.{name}" for name in COMMANDS} <= EDGES.keys()


@pytest.mark.parametrize("module", sorted(m for m in EDGES if within(m, "curvcal.report")))
def test_report_imports_no_command_and_no_run_layer(module: str) -> None:
    wrong = sorted(t for t in all_imports(module) if within(t, RUN_LAYER))
    assert not wrong, f"{module} imports {wrong}"


def test_only_commands_import_report() -> None:
    wrong = sorted(
        (source, target)
        for source, targets in EDGES.items()
        if not within(source, ("curvcal.commands", "curvcal.report"))
        for target in targets
        if within(target, "curvcal.report")
    )
    assert not wrong, wrong


@pytest.mark.parametrize(
    "module",
    sorted(m for m in EDGES if within(m, (*KERNELS_AND_LOADERS, "curvcal.policy"))),
)
def test_kernels_loaders_and_policy_import_no_report_and_no_command(module: str) -> None:
    wrong = sorted(
        t for t in all_imports(module) if within(t, ("curvcal.report", "curvcal.commands"))
    )
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in EDGES if within(m, "curvcal.policy")))
def test_policy_imports_only_the_standard_library_errors_and_results(module: str) -> None:
    stdlib = sys.stdlib_module_names | {"__future__"}
    wrong = sorted(
        t
        for t in all_imports(module)
        if not within(t, POLICY_MAY_IMPORT) and t.split(".")[0] not in stdlib
    )
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in EDGES if within(m, "curvcal.settings")))
def test_settings_import_only_the_standard_library_and_leaf_helpers(module: str) -> None:
    """The declarations are a leaf every layer may read: no kernel, loader, pipeline or
    command (and so no torch), whatever imports them."""
    stdlib = sys.stdlib_module_names | {"__future__"}
    allowed = ("curvcal.errors", "curvcal.jsontext", "curvcal.settings", "click")
    wrong = sorted(
        t for t in all_imports(module) if not within(t, allowed) and t.split(".")[0] not in stdlib
    )
    assert not wrong, f"{module} imports {wrong}"


def test_no_command_imports_another_command() -> None:
    commands = {f"curvcal.commands.{name}" for name in COMMANDS}
    wrong = sorted(
        (source, target)
        for source in commands
        for target in EDGES[source]
        if target in commands and target != source
    )
    assert not wrong, wrong


def test_no_import_cycle_passes_through_report_or_policy() -> None:
    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(EDGES.get(node, ()))
        return False

    cycles = sorted(
        (source, target)
        for source, targets in EDGES.items()
        if within(source, ("curvcal.report", "curvcal.policy"))
        for target in targets
        if reaches(target, source)
    )
    assert not cycles, cycles
