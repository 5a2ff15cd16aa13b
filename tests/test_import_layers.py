"""The package's layers, read from the source (ast): kernels import no loader, command, report or
policy module; curvature imports no calibration or loader; results import no solver; no cycles.

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

PACKAGE = Path(curvcal.__file__).resolve().parent
KERNELS = ("curvcal.curvature", "curvcal.calibration", "curvcal.losses")
ABOVE_KERNELS = (
    "curvcal.load",
    "curvcal.commands",
    "curvcal.report",
    "curvcal.gate",
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
    assert imports_of("curvcal.losses") <= {"curvcal.errors"}
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
