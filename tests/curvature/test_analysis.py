"""analyse_batches: one operator, every measurement, each equal to the separate kernels and to
the dense float64 Hessian."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

import curvcal
from curvcal.curvature import analysis as analysis_module
from curvcal.curvature import central_difference
from curvcal.curvature.analysis import (
    HessianSettings,
    analyse_batches,
    analyse_hessian_with_messages,
)
from curvcal.curvature.memory import lanczos_basis
from curvcal.curvature.plan import selected_parameter_count
from curvcal.curvature.results import ConvergenceWarning
from curvcal.curvature.trace import draw_probes
from curvcal.errors import InputError, NumericalError, SettingsError, as_option, wording
from curvcal.results import to_jsonable

from .cases import record_max_basis, split

MLPCase = tuple[nn.Module, Tensor, Tensor, Tensor]


class CountingSource:
    """A batch source (a callable returning fresh iterators) that counts how often it is read."""

    def __init__(self, batches: list[tuple[Tensor, Tensor]]) -> None:
        self.batches = batches
        self.reads = 0

    def __call__(self) -> Iterator[tuple[Tensor, Tensor]]:
        self.reads += 1
        return iter(self.batches)


def test_every_stage_equals_its_kernel_and_the_dense_hessian(mlp_case: MLPCase) -> None:
    model, x, y, hessian = mlp_case
    batches = split(x, y, 20)
    settings = HessianSettings(
        top_k=3,
        smallest=True,
        tol=1e-8,
        probes=40,
        density=True,
        density_runs=2,
        density_steps=6,
        per_layer=True,
        seed=5,
    )
    result = analyse_batches(model, batches, settings)
    exact = torch.linalg.eigvalsh(hessian)

    spectrum = curvcal.hessian_eigenvalues(model, batches, 3, tol=1e-8, seed=5)
    assert result.spectrum == spectrum
    assert result.lambda_max == pytest.approx(float(exact[-1]), rel=1e-8)
    assert result.spectrum.eigenvalues == pytest.approx(exact[-3:].flip(0).tolist(), rel=1e-8)
    assert result.lambda_min == pytest.approx(float(exact[0]), rel=1e-6)
    smallest = curvcal.hessian_eigenvalues(
        model, batches, 1, which="smallest", method="lanczos", tol=1e-8, seed=5
    )
    assert result.smallest == smallest

    # tanh: auto takes the split trace, the Gauss–Newton part exact and Hutch++ on the rest
    assert result.trace == curvcal.hessian_trace(
        model, batches, 40, trace_method="gauss-newton+hutchpp", seed=5
    )
    assert result.trace is not None
    assert result.trace.ci95[0] <= float(torch.trace(hessian)) <= result.trace.ci95[1]
    assert result.density == curvcal.hessian_density(model, batches, runs=2, steps=6, seed=5)
    assert result.layers == curvcal.hessian_layers(model, batches, tol=1e-8, probes=40, seed=5)

    assert result.operator["n_params"] == hessian.shape[0] == 75
    assert result.operator["n_samples"] == x.shape[0]
    with torch.no_grad():
        expected_loss = float(nn.functional.cross_entropy(model(x), y))
    assert result.operator["mean_loss"] == pytest.approx(expected_loss, rel=1e-12)
    # auto on the CPU: double backward for single vectors and probe blocks alike
    assert result.operator["engine"] == "autograd" and result.operator["engine_fallback"] is None
    assert result.spectrum.engine == "autograd" and result.trace.engine == "autograd"
    assert set(result.timings) == {
        "setup",
        "loss",
        "eigenvalues",
        "smallest",
        "trace",
        "density",
        "layers",
    }
    assert result.converged and result.unconverged == []


def test_one_operator_serves_every_stage(mlp_case: MLPCase, monkeypatch) -> None:
    model, x, y, _ = mlp_case
    built = []
    original = central_difference.HessianOperator  # what build_operator builds unsharded

    def counting_operator(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(central_difference, "HessianOperator", counting_operator)
    source = CountingSource(split(x, y, 20))
    settings = HessianSettings(
        top_k=1,
        method="power",
        probes=20,
        probe_batch=8,
        per_layer=True,
        keep_graphs="never",  # count the passes of products that rebuild their graphs
        trace_method="hutchpp",
    )
    result = analyse_batches(model, source, settings)

    assert len(built) == 1
    assert source.reads == 1  # counted and cached once, never re-read
    assert result.trace is not None and result.layers is not None
    # Products: power iteration spends one vector per pass; 20 Hutchinson probes take
    # ceil(20 / 8) = 3 passes, for the whole Hessian and for each block (48 and 27 parameters,
    # more than 20, so estimated rather than exact); the mean loss one pass.
    assert [r.trace.method for r in result.layers] == ["hutchinson", "hutchinson"]
    power_matvecs = result.spectrum.matvecs + sum(r.lambda_max.matvecs for r in result.layers)
    assert result.operator["n_matvecs"] == power_matvecs + 3 * 20
    assert result.operator["n_data_passes"] == 1 + power_matvecs + 3 * 3


def test_sharded_sums_give_the_same_numbers(mlp_case: MLPCase) -> None:
    """all_reduce carries N and every product: two identical 'ranks' (a doubling sum) must give
    the Hessian of the same mean loss."""
    model, x, y, _ = mlp_case
    settings = HessianSettings(top_k=2, probes=10, tol=1e-8)
    single = analyse_batches(model, split(x, y, 20), settings)
    doubled = analyse_batches(
        model, split(x, y, 20), settings, all_reduce=lambda tensor: 2 * tensor
    )
    assert doubled.operator["n_samples"] == 2 * x.shape[0]
    assert doubled.spectrum.eigenvalues == pytest.approx(single.spectrum.eigenvalues, rel=1e-12)
    assert doubled.trace is not None and single.trace is not None
    # tanh: the split trace, whose exact part and products are both summed across ranks
    assert doubled.trace.method == single.trace.method == "gauss-newton+hutchpp"
    assert doubled.trace.estimate == pytest.approx(single.trace.estimate, rel=1e-12)
    assert doubled.operator["mean_loss"] == pytest.approx(single.operator["mean_loss"], rel=1e-12)


def test_json_exposes_lambda_max_and_trace_at_the_top(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    result = analyse_batches(model, [(x, y)], HessianSettings(top_k=2, probes=10))
    document = to_jsonable(result)
    assert document["lambda_max"] == result.lambda_max
    assert set(document["trace"]) >= {"estimate", "standard_error", "ci95"}
    assert document["eigenvalues"] == list(result.spectrum.eigenvalues)
    assert document["converged"] is True
    assert document["lambda_min"] is None and document["density"] is None


def test_no_trace_and_full_spectrum(mlp_case: MLPCase) -> None:
    """Border: top_k = P (every eigenvalue) is allowed; trace off leaves None."""
    model, x, y, _ = mlp_case
    params = ("2.bias",)  # the 3 output biases: a 3×3 block
    names = [n for n, _ in model.named_parameters()]
    offset = sum(p.numel() for n, p in model.named_parameters() if names.index(n) < 3)
    block = mlp_case[3][offset : offset + 3, offset : offset + 3]
    # the block is singular (softmax: the all-ones direction), and a zero eigenvalue's relative
    # residual is floored at √ε·‖H‖, so ask for 1e-7 and check the values to 1e-12 below
    result = analyse_batches(
        model, [(x, y)], HessianSettings(top_k=3, trace=False, params=params, tol=1e-7)
    )
    assert selected_parameter_count(model, params) == 3
    assert result.trace is None
    assert result.spectrum.eigenvalues == pytest.approx(
        torch.linalg.eigvalsh(block).flip(0).tolist(), abs=1e-12
    )


def test_unconverged_estimates_are_listed_and_warned(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    settings = HessianSettings(method="power", max_iter=1, trace=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = analyse_batches(model, [(x, y)], settings)
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert not result.converged
    assert result.unconverged[0].startswith("eigenvalue 1")


def test_with_messages_returns_convergence_warnings_as_text(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    settings = HessianSettings(method="power", max_iter=1, trace=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, messages = analyse_hessian_with_messages(model, [(x, y)], settings)
    assert not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert len(messages) == 1 and messages[0].startswith("power: eigenvalues did not meet tol")
    assert not result.converged
    converged, none = analyse_hessian_with_messages(model, [(x, y)], HessianSettings(trace=False))
    assert converged.converged and none == []


def test_impossible_settings_are_refused_before_any_product(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    source = CountingSource([(x, y)])
    with pytest.raises(InputError, match="top_k: asked for 76 eigenvalues"):
        analyse_batches(model, source, HessianSettings(top_k=76))
    assert source.reads == 1  # counted once, no product
    for bad, field in (
        ({"top_k": 0}, "--top-k"),
        ({"probes": 1}, "--probes"),
        ({"trace_method": "hutchpp", "probes": 3}, "--probes"),
        ({"trace_method": "hutchpp", "trace_rtol": 0.1}, "--trace-rtol"),
        ({"trace_rtol": -1.0}, "--trace-rtol"),
        ({"tol": math.nan}, "--tol"),
        ({"gamma": 1.0}, "--gamma"),
        ({"loss": "focal", "gamma": -1.0}, "--gamma"),
        ({"hvp": "jax"}, "--hvp"),
        ({"method": "arnoldi"}, "--method"),
        ({"max_iter": 0}, "--max-iter"),
    ):
        with wording(as_option), pytest.raises(InputError, match=f"^{field}:"):
            HessianSettings(**bad)  # type: ignore[arg-type]
        with pytest.raises(SettingsError, match=f"^{field[2:].replace('-', '_')}:"):
            HessianSettings(**bad)  # type: ignore[arg-type]


def test_non_finite_loss_stops_before_any_product(mlp_case: MLPCase) -> None:
    _, x, y, _ = mlp_case
    broken = nn.Sequential(nn.Linear(5, 3)).double()
    with torch.no_grad():
        broken[0].weight[0, 0] = math.inf
    with pytest.raises(NumericalError, match="loss: the mean ce loss over the 50 samples is nan"):
        analyse_batches(broken, [(x, y)], HessianSettings())


def test_focal_criterion_reaches_the_operator(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    settings = HessianSettings(loss="focal", gamma=2.0, trace=False)
    result = analyse_batches(model, [(x, y)], settings)
    with torch.no_grad():
        log_p = torch.log_softmax(model(x), dim=1).gather(1, y[:, None]).squeeze(1)
    expected = float((-((1 - log_p.exp()) ** 2) * log_p).mean())
    assert result.operator["loss"] == "focal" and result.operator["gamma"] == 2.0
    assert result.operator["mean_loss"] == pytest.approx(expected, rel=1e-12)


def test_a_hutchpp_sketch_over_the_budget_holds_what_fits(mlp_case: MLPCase) -> None:
    """75 parameters, 100 products: the Hutch++ sketch would hold 33 × 75 float64 values
    (19,800 bytes); under a budget of 12,000 bytes it holds 20 columns (12,000 bytes) and the
    other 60 products are deflated Hutchinson probes; the note says so at once, and the interval
    covers the dense Hessian's trace."""
    model, x, y, hessian = mlp_case
    notes: list[str] = []
    settings = HessianSettings(probes=100, memory_budget="12000", trace_method="hutchpp")
    result = analyse_batches(model, [(x, y)], settings, on_note=notes.append)
    trace = result.trace
    assert trace is not None and trace.method == "hutchpp"
    assert (trace.sketch_bytes, trace.n_probes, trace.matvecs) == (12_000, 60, 100)
    assert trace.ci95[0] <= float(torch.trace(hessian)) <= trace.ci95[1]
    (note,) = [n for n in notes if "sketch" in n]
    for part in ("would hold 33 × 75 values", "19.3 KiB in float64", "holds 20 columns"):
        assert part in note
    assert "11.7 KiB" in note and "memory_budget" in note


def test_a_split_traces_sketch_is_counted_on_the_products_it_gets() -> None:
    """gauss-newton+hutchpp with --probes 100 and 10 classes: the estimator of R gets 91
    products, a sketch of 30 columns. A budget of 30 columns needs no note; one of 29 bounds it,
    and the note names the default budget and its size."""
    settings = HessianSettings(trace_method="gauss-newton+hutchpp", probes=100)
    check = analysis_module.check_sketch_memory
    column = 1000 * 4
    fits = check(settings, 1000, torch.float32, 30 * column, explicit=False, free=None, products=91)
    assert fits is None
    note = check(settings, 1000, torch.float32, 29 * column, explicit=False, free=None, products=91)
    assert note is not None
    for part in ("sketch of 91 products would hold 30 × 1,000", "holds 29 columns"):
        assert part in note
    assert "the default memory budget of 113 KiB" in note
    given = check(settings, 1000, torch.float32, 29 * column, explicit=True, free=None, products=91)
    assert given is not None and "the memory budget of 113 KiB" in given
    assert "default" not in given


def test_an_xtrace_sketch_over_a_given_budget_is_refused_before_any_product(
    mlp_case: MLPCase,
) -> None:
    """75 parameters, 100 products: the XTrace sketch holds 50 × 75 float64 values (30,000
    bytes), every product in it; a budget of 12,000 bytes lets the passes run but not the
    sketch."""
    model, x, y, _ = mlp_case
    source = CountingSource([(x, y)])
    steps: list[int] = []
    settings = HessianSettings(probes=100, memory_budget="12000", trace_method="xtrace")
    with pytest.raises(InputError) as error:
        analyse_batches(model, source, settings, on_step=lambda _stage, n: steps.append(n))
    assert (source.reads, steps) == (1, [])  # counted once, no product
    message = str(error.value)
    assert error.value.what == "memory_budget"
    for part in ("50 × 75 values", "29.3 KiB in float64", "11.7 KiB", "probes 41 or fewer"):
        assert part in message
    assert "trace_method hutchpp or hutchinson" in message
    # Hutchinson holds no sketch; a sketch within the budget runs
    assert analyse_batches(model, source, HessianSettings(
        probes=100, memory_budget="12000", trace_method="hutchinson"
    )).trace is not None  # fmt: skip
    fits = HessianSettings(
        probes=40, memory_budget="12000", top_k=1, max_iter=2, trace_method="xtrace"
    )
    with pytest.warns(ConvergenceWarning, match="max_iter"):  # 2 steps: only the trace matters
        assert analyse_batches(model, source, fits).trace is not None


def test_xtrace_sketch_memory_warns_over_the_default_budget_and_refuses_over_free_memory() -> None:
    settings = HessianSettings(trace_method="xtrace", probes=100)
    held = 50 * 1000 * 4
    check = analysis_module.check_sketch_memory
    assert check(settings, 1000, torch.float32, held, explicit=True, free=None) is None
    note = check(settings, 1000, torch.float32, held - 1, explicit=False, free=10**9)
    assert note is not None and "default memory budget" in note and "probes" in note
    with pytest.raises(InputError, match="free memory"):
        check(settings, 1000, torch.float32, 10**9, explicit=False, free=held - 1)
    with pytest.raises(InputError, match="fewer parameters"):  # not even the smallest sketch
        check(settings, 1000, torch.float32, 100, explicit=True, free=None)
    no_trace = HessianSettings(trace=False, trace_method="xtrace", probes=100)
    assert check(no_trace, 1000, torch.float32, 1, explicit=True, free=1) is None


def test_hutchpp_sketch_memory_is_bounded_never_refused() -> None:
    """33 columns of 1,000 float32 values: within the budget no note; over it, or over the free
    memory, a note naming the columns that fit (at least one), never a refusal."""
    settings = HessianSettings(trace_method="hutchpp", probes=100)
    held = 33 * 1000 * 4
    check = analysis_module.check_sketch_memory
    assert check(settings, 1000, torch.float32, held, explicit=True, free=None) is None
    note = check(settings, 1000, torch.float32, held - 1, explicit=True, free=None)
    assert note is not None and "holds 32 columns" in note and "the memory budget" in note
    tight = check(settings, 1000, torch.float32, 10**9, explicit=False, free=8_000)
    assert tight is not None and "holds 2 columns" in tight and "the free memory" in tight
    least = check(settings, 1000, torch.float32, 100, explicit=True, free=None)
    assert least is not None and "holds 1 column (" in least


def _relu_case(classes: int) -> tuple[nn.Module, list[tuple[Tensor, Tensor]], Tensor]:
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, classes)).double()
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(30, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, classes, (30,), generator=generator)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]

    def loss(theta: Tensor) -> Tensor:
        pieces = theta.split([math.prod(s) for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        return nn.functional.cross_entropy(torch.func.functional_call(model, values, (x,)), y)

    return model, split(x, y, 8), torch.func.hessian(loss)(flat)


def test_auto_trace_is_the_exact_gauss_newton_trace_for_a_relu_network() -> None:
    model, batches, hessian = _relu_case(classes=3)
    plans: list[HessianSettings] = []
    steps: list[tuple[str, int]] = []
    settings = HessianSettings(probes=8, per_layer=True)
    result = analyse_batches(
        model,
        batches,
        settings,
        on_plan=plans.append,
        on_step=lambda stage, n: steps.append((stage, n)),
    )
    # no product in the trace: its progress is the batches done, named in the stage
    traced = [step for step in steps if step[0].startswith("Gauss–Newton trace")]
    assert [stage for stage, _ in traced] == [
        f"Gauss–Newton trace, batch {i}" for i in range(1, len(batches) + 1)
    ]
    assert len({n for _, n in traced}) == 1
    assert [plan.trace_method for plan in plans] == ["gauss-newton"]  # before any product
    assert result.trace is not None and result.trace.method == "gauss-newton"
    assert result.trace.estimate == pytest.approx(float(hessian.trace()), rel=1e-12)
    assert "exact, at up to 2 gradient norms per sample" in result.operator["trace_choice"]
    # every module's block gets its exact trace from the same pass: 4·6 + 6 and 6·3 + 3 rows
    assert result.layers is not None and [layer.n_params for layer in result.layers] == [30, 21]
    for layer, (start, stop) in zip(result.layers, ((0, 30), (30, 51)), strict=True):
        assert layer.trace.method == "gauss-newton" and layer.trace.matvecs == 0
        block = hessian[start:stop, start:stop]
        assert layer.trace.estimate == pytest.approx(float(block.trace()), rel=1e-12)


def test_auto_trace_splits_off_the_gauss_newton_part_and_says_why(mlp_case: MLPCase) -> None:
    model, x, y, hessian = mlp_case  # tanh: not linear in the first layer
    result = analyse_batches(model, split(x, y, 20), HessianSettings(probes=12))
    assert result.trace is not None and result.trace.method == "gauss-newton+hutchpp"
    assert result.trace.matvecs == 10  # 12 less the 2 gradient norms per sample of 3 classes
    choice = result.operator["trace_choice"]
    assert choice.startswith("the Gauss–Newton trace is not exact here") and "0.weight" in choice
    assert "Hutch++ estimates the rest with 10 products" in choice
    low, high = result.trace.ci95
    assert low <= float(hessian.trace()) <= high
    assert result.trace.parts is not None and set(result.trace.parts) == {
        "gauss_newton",
        "residual",
    }


def test_auto_trace_falls_back_to_hutchpp_where_the_split_cannot_run(mlp_case: MLPCase) -> None:
    model, x, y, _ = mlp_case
    # 3 classes: 5 probes leave 3 products for the rest, fewer than Hutch++ needs
    result = analyse_batches(model, split(x, y, 20), HessianSettings(probes=5))
    assert result.trace is not None and result.trace.method == "hutchpp"
    assert result.trace.matvecs == 5
    # train mode: BatchNorm-free, but the Gauss–Newton part is not a sum over samples there
    result = analyse_batches(model, split(x, y, 20), HessianSettings(probes=12, mode="train"))
    assert result.trace is not None and result.trace.method == "hutchpp"
    assert "train mode" in result.operator["trace_choice"]

    # ten classes, four products: the Gauss–Newton trace would cost more than asked
    model, batches, _ = _relu_case(classes=10)
    result = analyse_batches(model, batches, HessianSettings(probes=4))
    assert result.trace is not None and result.trace.method == "hutchpp"
    assert (
        "up to 9 gradient norms per sample, more than probes 4" in result.operator["trace_choice"]
    )


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"probes": 5}, "leaving 3 of probes 5"),
        ({"mode": "train"}, "train mode"),
    ],
)
def test_a_split_trace_that_cannot_run_is_refused_before_any_product(
    mlp_case: MLPCase, settings: dict[str, object], why: str
) -> None:
    model, x, y, _ = mlp_case
    source = CountingSource([(x, y)])
    with pytest.raises(InputError, match=rf"^trace_method: the split trace .*{why}"):
        analyse_batches(
            model,
            source,
            HessianSettings(trace_method="gauss-newton+xtrace", **settings),  # type: ignore[arg-type]
        )
    assert source.reads == 1  # counted once, no product


def test_gauss_newton_asked_for_where_it_is_not_exact_is_refused_before_any_product(
    mlp_case: MLPCase,
) -> None:
    model, x, y, _ = mlp_case
    source = CountingSource([(x, y)])
    with pytest.raises(InputError, match=r"^trace_method: the Gauss–Newton trace is not exact"):
        analyse_batches(model, source, HessianSettings(trace_method="gauss-newton"))
    assert source.reads == 1  # counted once, no product


@pytest.mark.parametrize(
    ("k", "n_params", "budget", "expected"),
    [
        (1, 1000, None, None),  # no budget: no bound
        (1, 1000, 20 * 8000, 20),  # 20 float64 vectors of 1000 values fit
        (1, 1000, 20 * 8000 - 1, 19),
        (1, 1000, 8000, 8),  # the floor 2k + 6
        (3, 1000, 0, 12),
        (1, 75, 2**28, 75),  # never more than P
        (5, 12, 10**6, 12),
    ],
)
def test_lanczos_basis_is_what_the_budget_holds_within_its_floor_and_p(
    k: int, n_params: int, budget: int | None, expected: int | None
) -> None:
    assert lanczos_basis(k, n_params, budget) == expected
    # a bound asked for wins over the budget's, but never exceeds P
    assert lanczos_basis(k, n_params, budget, asked=4) == min(4, n_params)
    assert lanczos_basis(k, n_params, budget, asked=10**9) == n_params


@pytest.mark.parametrize(
    ("steps", "kept_error", "bare_error"), [(40, 1e-5, 1e-3), (75, 1e-12, 1e-12)]
)
def test_a_small_budget_runs_the_density_without_its_basis(
    mlp_case: MLPCase, steps: int, kept_error: float, bare_error: float
) -> None:
    """``steps`` density steps of 75 values need steps × 600 bytes: a budget of 4,000 runs the
    three-term recurrence, the default budget keeps the basis; the JSON says which ran. Each is
    measured against the smoothed spectral measure of the same probes from the dense Hessian
    (L1 over the grid): at 40 steps the kept basis is within 2.4e-6 and the recurrence, whose
    ghost copies of converged values take nodes, within 9.5e-5; at 75 = P steps both are exact."""
    model, x, y, hessian = mlp_case
    values, vectors = torch.linalg.eigh(hessian)
    common = {
        "top_k": 1,
        "trace": False,
        "density": True,
        "density_runs": 2,
        "density_steps": steps,
    }
    for budget, reorthogonalised, allowed in (
        ("4000", False, bare_error),
        (None, True, kept_error),
    ):
        settings = HessianSettings(**common, memory_budget=budget)
        density = analyse_batches(model, split(x, y, 20), settings).density
        assert density is not None and density.reorthogonalised is reorthogonalised
        assert to_jsonable(density)["reorthogonalised"] is reorthogonalised
        grid = torch.tensor(density.grid, dtype=torch.float64)
        sigma = density.bandwidth
        kernel = torch.exp(-0.5 * ((grid[:, None] - values[None, :]) / sigma) ** 2)
        kernel = kernel / (sigma * math.sqrt(2 * math.pi))
        generator = torch.Generator().manual_seed(0)  # the density's probes (settings.seed)
        exact = torch.zeros_like(grid)
        for _ in range(2):
            probe = draw_probes(75, 1, "rademacher", generator)[:, 0].double() / math.sqrt(75)
            exact += kernel @ (vectors.T @ probe) ** 2 / 2
        found = torch.tensor(density.density, dtype=torch.float64)
        assert float(torch.trapezoid((found - exact).abs(), grid)) < allowed


def test_a_small_budget_bounds_the_basis_and_the_values_stay_exact(
    mlp_case: MLPCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """75 parameters and a budget of 4,000 bytes: 6 vectors would fit, the floor for k = 3 is
    12, so Lanczos restarts within 12 vectors; the top 3 still match the dense Hessian to 1e-8
    and the run records the bound. The default budget (256 MiB) bounds nothing here."""
    model, x, y, hessian = mlp_case
    exact = torch.linalg.eigvalsh(hessian).flip(0)[:3]
    rows = record_max_basis(monkeypatch, analysis_module)
    settings = HessianSettings(top_k=3, tol=1e-8, trace=False, memory_budget="4000")
    result = analyse_batches(model, split(x, y, 20), settings)
    assert rows == [12] and result.operator["lanczos_basis"] == 12
    assert result.spectrum.values[0].iterations > 12
    found = torch.tensor(result.spectrum.eigenvalues, dtype=torch.float64)
    assert torch.allclose(found, exact, rtol=0, atol=1e-8)
    default = analyse_batches(model, split(x, y, 20), HessianSettings(top_k=3, trace=False))
    assert rows[-1] == 75 and default.operator["lanczos_basis"] == 75


def test_the_estimators_take_the_plans_vectors_per_pass(
    mlp_case: MLPCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget that leaves fewer vectors per pass than --probe-batch asks: the trace estimator
    gets the plan's width (its blocks are held that wide), not the request's."""
    model, x, y, _ = mlp_case
    widths: list[int] = []
    original = analysis_module.trace_estimate

    def recording(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        widths.append(kwargs["probe_batch"])  # type: ignore[arg-type]
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(analysis_module, "trace_estimate", recording)
    settings = HessianSettings(
        probes=20, memory_budget="12000", trace_method="hutchinson", probe_batch=8, top_k=1
    )
    result = analyse_batches(model, split(x, y, 20), settings)
    assert result.operator["probe_batch"] < 8
    assert widths == [result.operator["probe_batch"]]
