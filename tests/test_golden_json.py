"""The JSON of ``curvcal hessian`` and ``curvcal study`` equals the golden files written before a
refactor (tests/golden/; rewrite them with ``python tests/golden/regenerate.py`` after a
deliberate change of the numbers).

Fields are compared by class, so that the goldens pass on any CPU (AVX-512, AVX2 or the scalar
path; ``make test`` reruns them under ``ATEN_CPU_CAPABILITY=default``) yet catch a real change:

* strings, booleans, nulls, seeds and counts of fixed work (samples, probes, parameters):
  identical;
* counters of iterative methods (an eigensolver's ``iterations`` and ``matvecs``, the operator's
  ``n_matvecs``, a study's λmax ``matvecs``): identical in float64 runs; in float32 runs within
  :data:`COUNTER_SLACK` + :data:`COUNTER_RTOL` of the golden, because where the stopping test
  fires depends on the last bits of each product, which differ between vector units;
* fields of the memory plan (``lanczos_basis``, ``kept_rows``, ``probe_batch`` under
  ``results``...): masked like timings by regenerate.py;
* floats: to the case's relative tolerance: 1e-9 for float64 runs, 10 × the run's ``--tol``
  (1e-5) for float32 runs, where iterative solvers amplify reduction-order changes a little.
  Numbers near zero (residuals at the solver tolerance, density tails) get an absolute floor of
  the same size times 1e-1 in float32, 1e-3 in float64; an eigenvalue's ``residual`` at least
  :data:`RESIDUAL_FLOOR`.
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
#: Keys that count the steps of an iterative method (a Hutchinson trace's ``matvecs`` is its
#: fixed probe count and is compared exactly: see :func:`_iterative_counter`).
ITERATIVE_COUNTERS = frozenset({"iterations", "matvecs", "n_matvecs"})
COUNTER_SLACK = 2
#: absolute floor of an eigenvalue's ``residual``: Lanczos keeps its basis semi-orthogonal
#: (|q_iᵀq_k| ≤ √ε = 1.5e-8 in float64, partial reorthogonalisation), and the residual a value
#: converged long before the run stops keeps from that, about ω·β/|λ|, moves with rounding
#: (λ1 of hessian_float64: 3.6e-10 with AVX2, 2.6e-10 under ATEN_CPU_CAPABILITY=default)
RESIDUAL_FLOOR = 1e-9
COUNTER_RTOL = 0.2


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("golden")
    REGENERATE.build_workspace(folder)
    return folder


def _iterative_counter(where: str) -> bool:
    """Whether the field at ``where`` counts iterations (not a trace's fixed probe count)."""
    parent, _, key = where.rpartition(".")
    return key in ITERATIVE_COUNTERS and not parent.endswith(".trace")


def _differences(
    got: Any, want: Any, rtol: float, atol: float, where: str = "", counters: bool = True
) -> list[str]:
    """Where ``got`` and ``want`` differ beyond their field's class (see the module docstring);
    ``counters=False`` lets iterative counters move by the float32 slack."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [
                f"{where}: keys {sorted(got) if isinstance(got, dict) else got!r} != {sorted(want)}"
            ]
        return [
            d
            for k in want
            for d in _differences(got[k], want[k], rtol, atol, f"{where}.{k}", counters)
        ]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r} != {want!r}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in _differences(g, w, rtol, atol, f"{where}[{i}]", counters)
        ]
    if isinstance(want, float) and isinstance(got, float):
        if math.isnan(want) and math.isnan(got):
            return []
        if where.rpartition(".")[2] == "residual":
            atol = max(atol, RESIDUAL_FLOOR)
        if got == want or abs(got - want) <= rtol * max(abs(got), abs(want)) + atol:
            return []
        return [f"{where}: {got!r} != {want!r} (rtol {rtol})"]
    if (
        not counters
        and type(want) is int
        and type(got) is int
        and _iterative_counter(where)
        and abs(got - want) <= COUNTER_SLACK + COUNTER_RTOL * want
    ):
        return []
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r} != {want!r}"]
    return []


@pytest.mark.parametrize("name", sorted(REGENERATE.CASES))
def test_json_matches_golden(name: str, workspace: Path) -> None:
    _args, rtol = REGENERATE.CASES[name]
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = REGENERATE.produce(name, workspace)
    atol = rtol * (1e-1 if rtol > 1e-7 else 1e-3)
    exact_counters = name.endswith("float64")
    differences = _differences(got, want, rtol, atol, counters=exact_counters)
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


def test_comparison_classes_counters() -> None:
    """An eigensolver's iteration count may move a little in float32 and not in float64; a
    trace's probe count, a count of fixed work, never."""
    eigen = {"value": {"iterations": 28, "matvecs": 28}, "trace": {"matvecs": 6}}
    moved = {"value": {"iterations": 27, "matvecs": 27}, "trace": {"matvecs": 6}}
    assert _differences(moved, eigen, 1e-5, 0.0, counters=False) == []
    assert _differences(moved, eigen, 1e-5, 0.0, counters=True)
    far = {"value": {"iterations": 40, "matvecs": 28}, "trace": {"matvecs": 6}}
    assert _differences(far, eigen, 1e-5, 0.0, counters=False)
    probes = {"value": {"iterations": 28, "matvecs": 28}, "trace": {"matvecs": 7}}
    assert _differences(probes, eigen, 1e-5, 0.0, counters=False)
