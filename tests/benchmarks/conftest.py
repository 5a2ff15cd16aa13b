"""The benchmark scripts, loaded as modules for their smoke tests (they are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as the module ``NAME``, loaded once per session."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(
        BENCHMARKS / f"{name}.py"
    ):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_bench() -> Callable[[str], ModuleType]:
    return _load
