"""One name per idea: ``analyse_hessian`` is the public function (``curvcal.analyse_hessian``)
and ``Curvature`` the Laplace map's GGN; what had the same names is named for what it is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import curvcal
from curvcal.curvature import analysis
from curvcal.settings.hessian import HessianSettings

PACKAGE = Path(curvcal.__file__).parent


def test_each_of_the_two_names_is_defined_once() -> None:
    names = {"analyse_hessian", "Curvature", "analyse_batches", "HessianMeasurement"}
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(name in text for name in names):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
                found[node.name].append(path.relative_to(PACKAGE).as_posix())
    assert found == {
        "analyse_hessian": ["curvature/api.py"],
        "Curvature": ["calibration/laplace.py"],
        "analyse_batches": ["curvature/analysis.py"],
        "HessianMeasurement": ["pipeline/session.py"],
    }


def test_the_former_name_in_the_analysis_module_still_works_with_a_warning() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    batches = [(torch.randn(10, 3, dtype=torch.float64), torch.arange(10) % 3)]
    settings = HessianSettings(trace=False, tol=1e-10)
    with pytest.warns(DeprecationWarning, match="now analyse_batches"):
        former = analysis.analyse_hessian
    assert former is analysis.analyse_batches
    # the public function and the batches' one measure the same λmax as the dense Hessian
    via_api = curvcal.analyse_hessian(model, batches, settings)
    via_batches = analysis.analyse_batches(model, batches, settings)
    params = [p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in params])

    def loss(vector: torch.Tensor) -> torch.Tensor:
        values, offset = {}, 0
        for name, p in model.named_parameters():
            values[name] = vector[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        logits = torch.func.functional_call(model, values, (batches[0][0],))
        return nn.functional.cross_entropy(logits, batches[0][1])

    dense = torch.func.hessian(loss)(flat)
    exact = float(torch.linalg.eigvalsh(dense)[-1])
    assert via_api.spectrum.eigenvalues[0] == pytest.approx(exact, rel=1e-6)
    assert via_batches.spectrum.eigenvalues[0] == pytest.approx(exact, rel=1e-6)
