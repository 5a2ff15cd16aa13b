"""The benchmark scripts, loaded as modules for their smoke tests (they are not a package), and
one part of the GPU run (benchmarks/gpu/run.py) run in its CPU smoke mode."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _gpu_run() -> ModuleType:
    """``benchmarks/gpu/run.py`` as the module ``gpu_run``, loaded once per session."""
    path = BENCHMARKS / "gpu" / "run.py"
    module = sys.modules.get("gpu_run")
    if module is not None and getattr(module, "__file__", None) == str(path):
        return module
    spec = importlib.util.spec_from_file_location("gpu_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_run"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def run_smoke_part(part: str, folder: Path) -> tuple[dict[str, Any], str]:
    """Run the GPU run's ``part`` on the CPU in smoke mode into ``folder``: the part's record
    (its status checked ``ok``) and the markdown table the run wrote."""
    _gpu_run().main(["--smoke", "--device", "cpu", "--parts", part, "--part-budget", "600",
                     "--results-dir", str(folder)])  # fmt: skip
    written = json.loads((folder / "gpu-run-smoke.json").read_text())
    (record,) = written["parts"]
    assert record["status"] == "ok", record
    return record, (folder / "gpu-run-smoke.md").read_text()


@pytest.fixture(scope="session")
def gpu_run() -> ModuleType:
    return _gpu_run()


@pytest.fixture(scope="session")
def smoke_part() -> Callable[[str, Path], tuple[dict[str, Any], str]]:
    return run_smoke_part
