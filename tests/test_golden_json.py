"""The JSON of ``curvcal hessian`` and ``curvcal study`` equals the golden files written before a
refactor (tests/golden/; rewrite them with ``python tests/golden/regenerate.py`` after a
deliberate change of the numbers).

Strings, integers, booleans and nulls must be identical. Floats agree to a relative tolerance:
1e-9 for float64 runs, 1e-5 for float32 runs, because a refactor may legitimately change the
order of a sum (FLSD-53's Hessian used to be two group operators added with weights N_g/N, it is
now one sum over the batches), which moves a float32 result by a few units in the last place and
iterative solvers amplify that a little. Numbers near zero (residuals at the solver tolerance,
density tails) get an absolute floor of the same size times 1e-1 in float32, 1e-3 in float64.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"


def _regenerate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGENERATE = _regenerate()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("golden")
    REGENERATE.build_workspace(folder)
    return folder


def _differences(got: Any, want: Any, rtol: float, atol: float, where: str = "") -> list[str]:
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [
                f"{where}: keys {sorted(got) if isinstance(got, dict) else got!r} != {sorted(want)}"
            ]
        return [d for k in want for d in _differences(got[k], want[k], rtol, atol, f"{where}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r} != {want!r}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in _differences(g, w, rtol, atol, f"{where}[{i}]")
        ]
    if isinstance(want, float) and isinstance(got, float):
        if math.isnan(want) and math.isnan(got):
            return []
        if got == want or abs(got - want) <= rtol * max(abs(got), abs(want)) + atol:
            return []
        return [f"{where}: {got!r} != {want!r} (rtol {rtol})"]
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r} != {want!r}"]
    return []


@pytest.mark.parametrize("name", sorted(REGENERATE.CASES))
def test_json_matches_golden(name: str, workspace: Path) -> None:
    _args, rtol = REGENERATE.CASES[name]
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = REGENERATE.produce(name, workspace)
    atol = rtol * (1e-1 if rtol > 1e-7 else 1e-3)
    differences = _differences(got, want, rtol, atol)
    assert not differences, "\n".join(differences[:20])


def test_comparison_notices_a_change() -> None:
    """The comparison itself fails on a changed float, string, int or key."""
    base = {"a": 1.0, "b": "x", "c": [1, 2], "d": {"e": None}}
    assert _differences(base, base, 1e-9, 0.0) == []
    assert _differences({**base, "a": 1.0 + 1e-6}, base, 1e-9, 0.0)
    assert _differences({**base, "b": "y"}, base, 1e-9, 0.0)
    assert _differences({**base, "c": [1, 3]}, base, 1e-9, 0.0)
    assert _differences({**base, "d": {}}, base, 1e-9, 0.0)
    assert _differences({**base, "c": [1.0, 2]}, base, 1e-9, 0.0)  # an int became a float
