"""The public convenience functions: curvcal.hessian_* build the operator and report the engine."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import curvcal
from curvcal.curvature.results import DensityResult
from curvcal.errors import InputError

from .cases import record_max_basis, split


def test_eigenvalues_trace_density_layers_on_a_batchnorm_cnn(
    cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = cnn_case
    flags = [m.training for m in model.modules()]
    buffers = [b.clone() for b in model.buffers()]
    batches = split(x, y, 20)
    exact = torch.linalg.eigvalsh(hessian)

    spectrum = curvcal.hessian_eigenvalues(model, batches, k=2, tol=1e-8, hvp="func")
    assert spectrum.engine == "func" and spectrum.method == "lanczos"
    assert spectrum.eigenvalues == pytest.approx((float(exact[-1]), float(exact[-2])), abs=1e-8)

    trace = curvcal.hessian_trace(
        model, batches, 32, trace_method="hutchpp", hvp="autograd", probe_batch=16
    )
    # Hutch++: 32 products = a sketch of 10, 10 more for it, 12 remainder probes
    assert trace.engine == "autograd" and trace.method == "hutchpp"
    assert (trace.matvecs, trace.n_probes) == (32, 12)
    assert trace.ci95[0] <= float(torch.trace(hessian)) <= trace.ci95[1]

    density = curvcal.hessian_density(model, batches, runs=1, steps=4)
    assert density.engine == "autograd" and density.runs == 1  # the auto choice

    layers = curvcal.hessian_layers(model, batches, params=["head.*"], probes=200)
    assert [r.module for r in layers] == ["head"]
    assert layers[0].trace.estimate == pytest.approx(
        float(torch.trace(hessian[36:, 36:])), abs=1e-10
    )

    assert [m.training for m in model.modules()] == flags
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers, strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_bad_input_is_reported_before_any_work(
    cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, _ = cnn_case
    with pytest.raises(InputError, match="k"):
        curvcal.hessian_eigenvalues(model, [(x, y)], k=10_000)
    with pytest.raises(InputError, match=r"^probes: must be a positive integer"):
        curvcal.hessian_trace(model, [(x, y)], 0)


def test_hessian_eigenvalues_bounds_the_basis_by_the_budget_or_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API bounds Lanczos' basis as ``curvcal hessian`` does (what the operator's budget
    holds, at least 2k + 6), or by ``max_basis``; the values stay those of the dense matrix."""
    from curvcal.curvature import api as api_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x, y = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    bounds = record_max_basis(monkeypatch, api_module)
    tight = curvcal.hessian_eigenvalues(model, [(x, y)], 2, tol=1e-9, memory_budget="6000")
    asked = curvcal.hessian_eigenvalues(model, [(x, y)], 2, tol=1e-9, max_basis=4)
    free = curvcal.hessian_eigenvalues(model, [(x, y)], 2, tol=1e-9)
    assert bounds == [10, 4, 83]  # 6,000 bytes hold 9 vectors of 83: the floor 2·2 + 6 wins
    assert tight.eigenvalues == pytest.approx(free.eigenvalues, abs=1e-9)
    assert asked.eigenvalues == pytest.approx(free.eigenvalues, abs=1e-9)
    assert asked.values[0].iterations > 4


def test_the_api_density_keeps_its_basis_as_the_command_does() -> None:
    """20 steps of 83 values need 13,280 bytes: a 6,000-byte budget runs the three-term
    recurrence, ``max_basis=20`` or the default budget keeps the basis; the first quadrature
    moments agree (both equal vᵀHv of the same probes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x, y = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    tight = curvcal.hessian_density(model, [(x, y)], runs=1, steps=20, memory_budget="6000")
    asked = curvcal.hessian_density(
        model, [(x, y)], runs=1, steps=20, memory_budget="6000", max_basis=20
    )
    free = curvcal.hessian_density(model, [(x, y)], runs=1, steps=20)
    assert (tight.reorthogonalised, asked.reorthogonalised, free.reorthogonalised) == (
        False,
        True,
        True,
    )

    def first(result: DensityResult) -> float:
        return sum(w * t for t, w in zip(result.nodes[0], result.weights[0], strict=True))

    assert first(tight) == pytest.approx(first(free), abs=1e-12)
    for bad in (0, -2, True, 2.5):
        with pytest.raises(InputError) as error:
            curvcal.hessian_density(model, [(x, y)], runs=1, steps=4, max_basis=bad)
        assert error.value.what == "max_basis"


def test_the_api_names_each_setting_as_the_settings_do_and_takes_the_former_names() -> None:
    """``probes``, ``trace_method``, ``probe_dist`` and ``hvp`` are the names of the settings,
    the command line and the JSON record; the former ``n_probes``, ``method``,
    ``distribution`` and ``engine`` give the same numbers, with a deprecation warning."""
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x = torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y = torch.arange(12) % 3
    new = curvcal.hessian_trace(
        model, (x, y), probes=12, trace_method="hutchinson", probe_dist="gaussian", hvp="autograd"
    )
    with pytest.warns(DeprecationWarning) as caught:
        old = curvcal.hessian_trace(
            model,
            (x, y),
            n_probes=12,
            method="hutchinson",
            distribution="gaussian",
            engine="autograd",
        )
    said = " ".join(str(warning.message) for warning in caught)
    for former, field in (("n_probes", "probes"), ("method", "trace_method"), ("engine", "hvp")):
        assert f"'{former}' is now called '{field}'" in said
    assert old.estimate == new.estimate and old.n_probes == new.n_probes == 12
    with pytest.raises(InputError, match="given twice"):
        curvcal.hessian_trace(model, (x, y), probes=20, n_probes=12)
    layers = curvcal.hessian_layers(model, (x, y), probes=6, probe_dist="gaussian")
    with pytest.warns(DeprecationWarning) as caught:
        before = curvcal.hessian_layers(model, (x, y), n_probes=6, distribution="gaussian")
    assert len(caught) == 2 and "'distribution' is now called 'probe_dist'" in str(
        caught[1].message
    )
    assert [layer.trace.estimate for layer in before] == [layer.trace.estimate for layer in layers]
