"""The package's layers, read from the source (ast): kernels import no loader, command, report or
policy module; curvature imports no calibration or loader; results import no solver; loaders
import no kernel; commands import no torch at module level and no other command; the pipeline
imports no report or command; no cycles, in a kernel package or in the whole package.

Kernels are curvcal/curvature, curvcal/calibration and curvcal/losses.py; loaders are
curvcal/load. Every ``import``/``from ... import`` counts, at any depth (a function-level import
is still a dependency), except under ``if TYPE_CHECKING:``. Package ``__init__`` modules are
re-export facades and are left out of the cycle search.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import curvcal
from curvcal.commands import COMMANDS

PACKAGE = Path(curvcal.__file__).resolve().parent
KERNELS = ("curvcal.curvature", "curvcal.calibration", "curvcal.losses")
ABOVE_KERNELS = (
    "curvcal.load",
    "curvcal.commands",
    "curvcal.report",
    "curvcal.pipeline",
    "curvcal.policy",
    "curvcal.cli",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str) -> str:
    """The curvcal module ``name`` refers to (a module, else its package)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> set[str]:
    """The curvcal modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    found: set[str] = set()
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("curvcal"):
                    found.add(_resolve(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("curvcal"):
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if candidate in MODULES else _resolve(base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    found.discard(module)
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _kernel_modules() -> list[str]:
    return [m for m in MODULES if _within(m, KERNELS)]


@pytest.mark.parametrize("module", _kernel_modules())
def test_kernels_import_nothing_above_them(module: str) -> None:
    wrong = sorted(m for m in imports_of(module) if _within(m, ABOVE_KERNELS))
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", [m for m in MODULES if _within(m, ("curvcal.curvature",))])
def test_curvature_imports_no_calibration_and_no_loader(module: str) -> None:
    wrong = sorted(
        m for m in imports_of(module) if _within(m, ("curvcal.calibration", "curvcal.load"))
    )
    assert not wrong, f"{module} imports {wrong}"


def test_losses_import_only_errors_and_results_import_no_solver() -> None:
    # and the torch-free declaration of the focal parameter's rule (settings.calibration)
    assert imports_of("curvcal.losses") <= {"curvcal.errors", "curvcal.settings.calibration"}
    assert "curvcal.calibration.scaling" not in imports_of("curvcal.calibration.results")


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the directed ``graph`` (as a closed path), or ``None``."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def search(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = search(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in graph:
        if start not in state:
            found = search(start)
            if found:
                return found
    return None


def _cycle(modules: list[str]) -> list[str] | None:
    return _find_cycle({m: sorted(imports_of(m) & set(modules)) for m in modules})


@pytest.mark.parametrize("package", ["curvcal.curvature", "curvcal.calibration"])
def test_no_import_cycle_within(package: str) -> None:
    modules = [m for m in MODULES if m.startswith(package + ".")]
    assert len(modules) > 3
    cycle = _cycle(modules)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checks_see_a_cycle_and_a_lazy_import() -> None:
    """The reader counts a function-level import, and the search finds a planted cycle."""
    assert "curvcal.calibration.maps" in imports_of("curvcal.calibration.results")
    assert "curvcal.calibration.metrics" in imports_of("curvcal.calibration.scaling")
    assert _find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert _find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]


LOADERS = ("curvcal.load",)
KERNELS_AND_STUDY = (*KERNELS, "curvcal.study")


@pytest.mark.parametrize("module", [m for m in MODULES if _within(m, LOADERS)])
def test_loaders_import_no_kernel(module: str) -> None:
    wrong = sorted(m for m in imports_of(module) if _within(m, KERNELS_AND_STUDY))
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", [m for m in MODULES if _within(m, ("curvcal.pipeline",))])
def test_pipeline_imports_no_report_and_no_command(module: str) -> None:
    wrong = sorted(
        m
        for m in imports_of(module)
        if _within(m, ("curvcal.report", "curvcal.commands", "curvcal.cli"))
    )
    assert not wrong, f"{module} imports {wrong}"


def _module_level_imports(module: str) -> set[str]:
    """Every module (curvcal or third-party) ``module`` imports when it is loaded: statements
    outside functions and not under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    return found


COMMAND_MODULES = [m for m in MODULES if _within(m, ("curvcal.commands",))]
#: what a command must not load to show its help: torch and the numeric stack, and the
#: optional extras (hf, timm, tables), which only the loaders import, when needed
HEAVY = ("torch", "numpy", "scipy", "transformers", "timm", "pyarrow")


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_commands_import_no_torch_at_load_and_no_other_command(module: str) -> None:
    loaded = _module_level_imports(module)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"{module} imports {heavy} when loaded"
    # whatever a command loads at module level must itself load no torch (transitively)
    kernels = sorted(m for m in loaded if _within(m, (*KERNELS_AND_STUDY, *LOADERS)))
    assert not kernels, f"{module} loads {kernels}"
    registered = {module_name for module_name, _attr, _help in COMMANDS.values()}
    if module in registered:
        others = sorted(m for m in imports_of(module) if m in registered)
        assert not others, f"{module} imports the command modules {others}"


def test_no_import_cycle_in_the_package() -> None:
    """Package ``__init__`` facades included: a cycle through one is a cycle too."""
    modules = list(MODULES)
    cycle = _cycle(modules)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_module_level_reader_skips_functions_and_type_checking() -> None:
    assert "torch" not in _module_level_imports("curvcal.commands.hessian")
    assert "torch" in _module_level_imports("curvcal.curvature.engines")
    assert "curvcal.pipeline.hessian" in imports_of("curvcal.commands.hessian")
