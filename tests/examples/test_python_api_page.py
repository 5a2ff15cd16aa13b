"""docs/guide/python-api.md runs: its Python blocks, in page order, in one namespace (the first
builds the stand-in model and DataLoader the others use), and the figures they print are those of
the dense float64 Hessian of that model and of the calibration metrics of its logits."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

import curvcal
from curvcal.curvature.results import TraceMethodWarning

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "python-api.md"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


def _dense_hessian(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇² of the mean cross-entropy of a float64 copy of ``model`` over (x, y)."""
    import copy

    reference = copy.deepcopy(model).double().eval()
    names = [name for name, _ in reference.named_parameters()]
    shapes = [p.shape for _, p in reference.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        logits = torch.func.functional_call(reference, values, (x.double(),))
        return torch.nn.functional.cross_entropy(logits, y)

    return torch.func.hessian(loss)(flat)


def test_the_three_line_blocks_are_three_lines() -> None:
    blocks = python_blocks(PAGE)
    three = [b for b in blocks if b.startswith("import curvcal\n")]
    assert len(three) == 3
    assert all(len(b.strip().splitlines()) == 3 for b in three)
    assert any("hessian_eigenvalues(model, loader)" in b for b in three)
    assert any("hessian_trace(model, loader)" in b for b in three)
    assert any("predict(model, loader)" in b for b in three)


def test_the_python_api_page_runs_and_its_figures_are_right(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceMethodWarning)
        for block in python_blocks(PAGE):
            exec(compile(block, str(PAGE), "exec"), namespace)
    assert capsys.readouterr().out.count("\n") >= 7
    model, loader = namespace["model"], namespace["loader"]
    assert isinstance(model, torch.nn.Module)
    x, y = loader.dataset.tensors  # type: ignore[attr-defined]
    dense = _dense_hessian(model, x, y)
    exact = torch.linalg.eigvalsh(dense)
    spectrum, analysis = namespace["spectrum"], namespace["analysis"]
    assert spectrum.eigenvalues[0] == pytest.approx(float(exact[-1]), rel=1e-3)  # type: ignore[attr-defined]
    assert namespace["lambda_max"] == pytest.approx(float(exact[-1]), rel=1e-3)
    assert (
        analysis.spectrum.eigenvalues
        == pytest.approx(  # type: ignore[attr-defined]
            tuple(float(v) for v in exact.flip(0)[:3]), rel=1e-3
        )
    )
    assert analysis.trace.method == "gauss-newton"  # type: ignore[attr-defined]
    assert analysis.trace.estimate == pytest.approx(float(torch.trace(dense)), rel=1e-4)  # type: ignore[attr-defined]
    top2 = sorted(namespace["top2"], reverse=True)  # type: ignore[call-overload]
    assert top2 == pytest.approx([float(exact[-1]), float(exact[-2])], rel=1e-3)
    model.eval()
    with torch.no_grad():
        ece = curvcal.calibration_metrics(model(x), y).ece
    assert namespace["labels"].tolist() == y.tolist()  # type: ignore[attr-defined]
    assert curvcal.calibration_metrics(namespace["logits"], y).ece == pytest.approx(ece)
    # temperature scaling: the NLL minimiser over T found independently (scipy's bounded
    # search on the same float64 NLL), the true temperature of the page's labels within its
    # sampling error, and softmax(z / T) applied to the held-out rows
    from scipy.optimize import minimize_scalar

    scores, truth = namespace["scores"], namespace["truth"]
    fit_z, fit_y = scores[:1000].double(), truth[:1000]  # type: ignore[index]

    def nll(log_t: float) -> float:
        logp = torch.log_softmax(fit_z / float(torch.exp(torch.tensor(log_t))), dim=1)
        return float(-logp[torch.arange(len(fit_y)), fit_y].mean())

    best = minimize_scalar(nll, bounds=(-2.0, 3.0), method="bounded", options={"xatol": 1e-10})
    ts = namespace["ts"]
    assert ts.fit.temperature == pytest.approx(float(torch.exp(torch.tensor(best.x))), rel=1e-5)  # type: ignore[attr-defined]
    assert not ts.fit.at_bracket_end and abs(ts.fit.temperature - 2.5) < 0.25  # type: ignore[attr-defined]
    expected = torch.softmax(scores[1000:].double() / ts.fit.temperature, dim=1)  # type: ignore[attr-defined, index]
    assert torch.allclose(namespace["scaled"], expected, rtol=0, atol=1e-12)  # type: ignore[arg-type]
    # the page's own loss: auto is not asked for, so nothing warned
    assert not [w for w in caught if issubclass(w.category, TraceMethodWarning)]
