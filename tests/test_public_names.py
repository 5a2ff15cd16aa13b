"""``curvcal/__init__.py`` names its public API three times, each for its own reader: the lazy
table ``__getattr__`` imports from on first use (no torch at ``import curvcal``), the literal
``__all__`` a type checker reads (the package is typed), and the imports under
``TYPE_CHECKING`` that give each name its type. A test holds the three equal, so a name added
to one and not the others is refused here rather than missing for one reader."""

from __future__ import annotations

import ast
from pathlib import Path

import curvcal


def _typed_names() -> set[str]:
    """The names the ``if TYPE_CHECKING:`` block of the package's ``__init__`` imports."""
    tree = ast.parse(Path(curvcal.__file__).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("curvcal"):
                    names |= {alias.name for alias in child.names}
    return names


def test_the_lazy_table_all_and_the_typed_imports_name_the_same_api() -> None:
    lazy = set(curvcal._EXPORTS)
    assert lazy == set(curvcal.__all__) - {"__version__"}
    assert lazy == _typed_names()


def test_the_check_sees_a_name_typed_but_not_exported() -> None:
    """The reader finds the typed names (a planted gap would show as a difference)."""
    typed = _typed_names()
    assert {"hessian_trace", "fit_map", "HessianSettings"} <= typed
    assert "__version__" not in typed
