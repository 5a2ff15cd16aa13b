"""The central-difference product's rule (curvcal/curvature/step_control.py): three points at a
step set from the measured derivatives, Richardson's five only where the three-point bound
exceeds the stated one. The control's arithmetic by hand; the operator (on an unsharded model,
one process: each rank takes the same rule) against the dense Hessian of torch.func."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature import eigenvalues
from curvcal.curvature.central_difference import CentralDifferenceOperator, eigenvalue_products
from curvcal.curvature.step_control import FIVE_POINT_SAFETY, ROUNDING_MARGIN, StepControl
from curvcal.errors import NumericalError
from curvcal.losses import loss_from_name

from .cases import dense_hessian, make_data, make_mlp, split

# -- the control's arithmetic, worked by hand -------------------------------------------------


def _control() -> StepControl:
    """As the eigenvalue stage runs it: errors in units of b·‖H‖‖v‖."""
    return StepControl(bound=1e-3, default_step=0.1, rounding_unit=1e-6, relative_to_norm=True)


def test_the_first_step_is_the_default_and_the_judgement_is_worked_by_hand() -> None:
    """δ = 0.1, ‖D₃‖/‖v‖ = 2, ‖S‖/N = 0.04 (A = 4): ladder A²/‖Hv̂‖ = 8, truncation 8·0.01 =
    0.08, rounding 1e-6/0.1 = 1e-5, allowed b·‖H‖ = 1e-3·2 = 2e-3: three points not enough."""
    control = _control()
    assert control.step() == 0.1
    judgement = control.judge(0.1, 2.0, 0.04)
    assert judgement.ladder == pytest.approx(8.0)
    assert judgement.truncation == pytest.approx(0.08)
    assert judgement.rounding == pytest.approx(1e-5)
    assert judgement.allowed == pytest.approx(2e-3)
    assert not judgement.three_points_enough
    assert control.needs_richardson(judgement)  # and it is not calibrated yet


def test_the_next_step_minimises_truncation_plus_rounding() -> None:
    """After that judgement: δ = (R / (2·8))^{1/3} = 3.969e-3, where three points predict
    8·δ² + 1e-6/δ = 1.26e-4 + 2.52e-4 = 3.78e-4 ≤ 2e-3."""
    control = _control()
    control.judge(0.1, 2.0, 0.04)
    step = control.step()
    assert step == pytest.approx((1e-6 / 16) ** (1 / 3), rel=1e-12)
    assert step == pytest.approx(3.9685e-3, rel=1e-4)
    retaken = control.expect(8.0, step, 2.0)
    assert retaken.bound == pytest.approx(8 * step**2 + 1e-6 / step, rel=1e-12)
    assert retaken.bound == pytest.approx(3.78e-4, rel=1e-3)
    assert retaken.three_points_enough
    # the least of K δ² + R/δ over a grid of steps is at that δ
    grid = torch.logspace(-4, -1, 30001, dtype=torch.float64)
    assert float(grid[(8 * grid**2 + 1e-6 / grid).argmin()]) == pytest.approx(step, rel=1e-3)


def test_the_step_never_falls_where_rounding_alone_spends_the_bound() -> None:
    """With K_max so large that (R / 2K)^{1/3} is under R / (b‖H‖), the step is R / (b‖H‖):
    1e-6 / (1e-3 · 2) = 5e-4."""
    control = _control()
    control.judge(0.1, 2.0, 100.0)  # A = 1e4: ladder 5e7, best step 2.7e-5
    assert control.step() == pytest.approx(5e-4)


def test_richardson_calibrates_the_ladder_and_the_rounding() -> None:
    """Measured truncation 0.16 against a predicted 0.08 (clear of the rounding 1e-5): c = 2 ×
    2 = 4; a measurement within 4 roundings leaves c. The rounding measured at a short step:
    R ≥ 1.5 × error × step."""
    control = _control()
    judgement = control.judge(0.1, 2.0, 0.04)
    control.measured(0.1, judgement, 3e-5)  # within 4 roundings: not a truncation measure
    assert control.safety == 1.0 and control.calibrated
    control.measured(0.1, judgement, 0.16)
    assert control.safety == pytest.approx(4.0)
    assert control.expect(8.0, 0.1, 2.0).truncation == pytest.approx(0.32)
    control.rounding_measured(1e-3, 4e-3)  # R = 1.5 · 4e-6 = 6e-6
    assert control.rounding_unit == pytest.approx(ROUNDING_MARGIN * 4e-6)
    control.rounding_measured(1e-3, 1e-4)  # a smaller measure never lowers R
    assert control.rounding_unit == pytest.approx(6e-6)


def test_outside_the_eigenvalues_the_bound_is_the_products_own() -> None:
    """A trace's probe: allowed b·‖D₃ v̂‖ (not b·‖H‖), the step stays δ₀ whatever was seen,
    and five points take their own step: a = 8 (the five-point margin) · c·8·(8/2)/5 = 51.2,
    δ = (3R / 8a)^{1/5} = (3e-6 / 409.6)^{1/5} = 0.0236, where they predict a δ⁴ + 1.5 R/δ =
    1.59e-5 + 6.36e-5 = 7.94e-5 ≤ 2e-3; the next probe starts there."""
    control = _control()
    control.judge(0.1, 4.0, 0.01)  # ‖H‖ ≥ 4 seen
    control.relative_to_norm = False
    judgement = control.judge(0.1, 2.0, 0.04)
    assert judgement.allowed == pytest.approx(1e-3 * 2.0)  # not 1e-3 · 4
    assert control.step() == 0.1
    assert FIVE_POINT_SAFETY == 8.0
    assert control.five_point_coefficient(judgement, 2.0) == pytest.approx(51.2)
    assert control.five_point_step(judgement, 2.0) == pytest.approx((3e-6 / 409.6) ** 0.2)
    assert control.five_point_step(judgement, 2.0) == pytest.approx(0.02360, rel=1e-3)
    step = control.five_point_step(judgement, 2.0)
    predicted = control.five_points_taken(judgement, step, 2.0)
    assert predicted == pytest.approx(51.2 * step**4 + 1.5e-6 / step, rel=1e-12)
    assert predicted == pytest.approx(7.94e-5, rel=1e-3)
    assert control.over_bound == 0 and control.step() == step


def test_where_rounding_rules_five_points_take_a_longer_step_within_reach() -> None:
    """A probe of little curvature change (ladder 0.08: A = 0.4 at ‖D₃ v̂‖ = 2) and a large
    rounding R = 1e-2: at δ₀ = 0.1 five points predict 1.5·R/δ₀ = 0.15, over the 2e-3 allowed.
    Their own step: a = 8·0.08·0.04/5 = 5.12e-3, δ = (3R/8a)^{1/5} = 0.940, inside 16 δ₀ = 1.6
    and ℓ/4 = √(2/0.08)/4 = 1.25; its prediction 3.99e-3 + 1.60e-2 = 2.0e-2 is still over:
    counted, its ratio kept. With ℓ = 0.05 (A = 40) the step is ℓ/4."""
    control = StepControl(bound=1e-3, default_step=0.1, rounding_unit=1e-2)
    judgement = control.judge(0.1, 2.0, 0.4 * 0.01)  # A = 0.4
    assert judgement.ladder == pytest.approx(0.08)
    assert control.five_point_bound(judgement, 0.1, 2.0) > judgement.allowed
    step = control.five_point_step(judgement, 2.0)
    assert step == pytest.approx((3e-2 / (8 * 5.12e-3)) ** 0.2, rel=1e-12)
    assert step == pytest.approx(0.9396, rel=1e-3)
    assert step > 2 * control.default_step
    predicted = control.five_points_taken(judgement, step, 2.0)
    assert predicted == pytest.approx(5.12e-3 * step**4 + 1.5e-2 / step, rel=1e-12)
    assert control.over_bound == 1
    assert control.worst_over_bound == pytest.approx(predicted / 2e-3)
    # the same rounding where the derivatives change over a short length: ℓ/4 caps the step
    steep = control.judge(0.1, 2.0, 40.0 * 0.01)  # A = 40: ladder 800, ℓ = 0.05
    assert control.five_point_step(steep, 2.0) == pytest.approx(0.05 / 4)
    # and in the eigenvalue stage the five-point step never passes δ₀
    control.relative_to_norm = True
    assert control.five_point_step(judgement, 2.0) == control.default_step


def test_a_direction_of_no_curvature() -> None:
    """Border cases: nothing changes along v (ladder 0: the step stays the default); the
    curvature changes along v where none is seen (ladder ∞: three points never enough, and the
    next step is not set from it)."""
    control = _control()
    flat = control.judge(0.1, 0.0, 0.0)
    assert flat.ladder == 0.0 and flat.truncation == 0.0 and control.step() == 0.1
    steep = control.judge(0.1, 0.0, 1e-3)
    assert steep.ladder == math.inf and not steep.three_points_enough
    assert control.ladder_max == 0.0 and control.step() == 0.1


# -- the operator against the dense Hessian ----------------------------------------------------


def _softplus_mlp() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 8), nn.Softplus(), nn.Linear(8, 3)).double()


MODELS = {"tanh": make_mlp, "softplus": _softplus_mlp}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request: pytest.FixtureRequest) -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    model = MODELS[request.param]().eval()
    x, y = make_data("mlp")
    return model, x, y, dense_hessian(model, x, y)


def _operator(model: nn.Module, x: Tensor, y: Tensor, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    copied = copy.deepcopy(model).to(dtype)
    batches = split(x.to(dtype), y, 7)  # uneven: 7, 7, …, and the rest
    return CentralDifferenceOperator(copied, batches, loss_from_name("ce", 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_product_is_within_the_stated_bound(case, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    """The products of a Lanczos run (top 3) as the eigenvalue stage takes them, each within
    b'·‖H‖·‖v‖ of the dense Hessian's (b' the stated ``product_error``, max(b, tol/10)), and
    every product of 12 Gaussian vectors and the top three eigenvectors within b·‖Hv‖ (b =
    ``own_error``), a five-point one also within the error predicted as it was taken. Before,
    five points at δ₀ were over b·‖Hv‖ for 2 of these 15 products of the softplus MLP in each
    dtype (up to 1.8×: their rounding), and float64 took three points at (3u)^{1/3}·max(1,
    ‖θ‖)/‖v‖ whatever the curvature along v: 2.6× its bound on the tanh MLP. The eigenvalue
    stage's products cost fewer gradient passes than Richardson's four."""
    model, x, y, dense = case
    operator = _operator(model, x, y, dtype)
    seen: list[tuple[Tensor, Tensor]] = []
    product = operator._product

    def kept(block: Tensor, total: Tensor | None = None) -> Tensor:
        out = product(block, total)
        columns = range(block.shape[1])  # copies: the operator reuses its buffers
        seen.extend((block[:, j].double().clone(), out[:, j].double().clone()) for j in columns)
        return out

    operator._product = kept  # type: ignore[method-assign]
    with eigenvalue_products(operator):  # as the pipeline's eigenvalue stage takes them
        eigenvalues(operator, 3, tol=1e-4, seed=3)
    stage, passes = len(seen), operator.n_data_passes
    generator = torch.Generator().manual_seed(11)
    values, vectors = torch.linalg.eigh(dense)
    probes = [
        torch.randn(dense.shape[0], generator=generator, dtype=torch.float64) for _ in range(12)
    ]
    predicted: list[float | None] = []  # per unit ‖v‖, for each five-point product
    for vector in [*probes, *vectors[:, -3:].t()]:
        before = operator.rule_counts.get("5-point", 0)
        operator.matvec(vector.to(dtype))
        five = operator.rule_counts.get("5-point", 0) > before
        predicted.append(operator.last_five_point_bound if five else None)
    norm = float(values.abs().max())
    b, own_b = operator.product_error, operator.own_error
    # the eigenvalue stage's within b·‖H‖‖v‖, the others within b·‖Hv‖ (their own norm)
    over = [
        float((got - dense @ v).norm()) / (b * norm * float(v.norm())) for v, got in seen[:stage]
    ]
    errors = [float((got - dense @ v).norm()) / float(v.norm()) for v, got in seen[stage:]]
    own = [
        error / (own_b * float((dense @ v).norm() / v.norm()))
        for error, (v, _) in zip(errors, seen[stage:], strict=True)
    ]
    assert max(over) <= 1.0, sorted(over)[-3:]
    assert max(own) <= 1.0, sorted(own)[-3:]
    assert any(p is not None for p in predicted)  # five points were taken and judged
    for error, bound in zip(errors, predicted, strict=True):
        assert bound is None or error <= bound, (error, bound)
    assert passes / stage < 3.0  # every pass of the eigenvalue stage, the start included
    assert operator.rule_counts.get("3-point", 0) > stage / 2
    assert operator.rules_taken()["products_over_bound"] == operator.control.over_bound


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-8)])
def test_the_eigenvalues_equal_the_dense_ones_within_the_stated_bound(case, dtype, tol) -> None:  # type: ignore[no-untyped-def]
    """λ1..3 by Lanczos over the central-difference products against the dense Hessian's
    eigenvalues: within max(tol, b') · |λmax| (b' the products' stated bound; the settings'
    tol is the default 1e-4)."""
    model, x, y, dense = case
    operator = _operator(model, x, y, dtype)
    with eigenvalue_products(operator):
        spectrum = eigenvalues(operator, 3, tol=tol, seed=3)
    exact = torch.linalg.eigvalsh(dense).flip(0)[:3]
    allowed = max(tol, operator.product_error) * float(exact[0])
    for got, want in zip(spectrum.eigenvalues, exact.tolist(), strict=True):
        assert abs(got - want) <= allowed, (got, want, allowed)


def test_the_error_estimate_names_the_rule_and_its_passes(case) -> None:  # type: ignore[no-untyped-def]
    """``error_estimate`` takes the product as the operator does and states the rule, its
    passes, the step and the bound predicted before it; the true error along the top
    eigenvector is within the measured bound's reach (≤ 2×)."""
    model, x, y, dense = case
    operator = _operator(model, x, y, torch.float32)
    eigenvalues(operator, 1, tol=1e-4, seed=3)
    top = torch.linalg.eigh(dense).eigenvectors[:, -1]
    estimate = operator.error_estimate(vector=top.float())
    assert estimate.stencil in {"3-point", "5-point", "3-point, step retaken"}
    assert estimate.passes in {2, 4, 6}
    assert estimate.step_length is not None and estimate.step_length > 0
    got = operator.matvec(top.float()).double()
    actual = float((got - dense @ top).norm() / (dense @ top).norm())
    assert actual <= 2 * estimate.bound, (actual, estimate)
    described = estimate.as_dict()
    assert described["gradient_passes"] == estimate.passes
    assert described["relative_error_bound"] == estimate.bound
    costs = operator.rules_taken()
    assert costs["start_passes"] == 3  # G(θ) and the rounding probe's pair, once
    assert 2.0 <= costs["passes_per_product"] <= 6.0  # type: ignore[operator]


def test_a_zero_vector_gives_a_zero_product_and_the_parameters_are_restored(case) -> None:  # type: ignore[no-untyped-def]
    """Border case: H·0 = 0 exactly; every parameter bit for bit as it was after products."""
    model, x, y, _ = case
    operator = _operator(model, x, y, torch.float32)
    before = {k: v.clone() for k, v in operator.model.state_dict().items()}
    zero = operator.matvec(torch.zeros(operator.shape[0]))
    assert bool((zero == 0).all())
    operator.matvec(torch.randn(operator.shape[0], generator=torch.Generator().manual_seed(0)))
    after = operator.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_vector_with_nan_is_refused_before_any_pass(case) -> None:  # type: ignore[no-untyped-def]
    """Bad input: a non-finite vector raises NumericalError (exit 3 at the CLI) without a
    gradient pass, and leaves the rule uncalibrated."""
    model, x, y, _ = case
    operator = _operator(model, x, y, torch.float32)
    vector = torch.ones(operator.shape[0])
    vector[3] = float("nan")
    with pytest.raises(NumericalError):
        operator.matvec(vector)
    assert operator.n_data_passes == 0 and not operator.control.calibrated


def test_the_run_table_gives_the_passes_beside_the_errors() -> None:
    """The hessian run table's row for a sharded model's products, from the report's fields;
    none for a model whose products are exact."""
    from curvcal.report.hessian import _central_difference_rows

    product = {
        "passes_per_product": 2.3456,
        "start_passes": 3,
        "relative_error_bound": 1.234e-5,
        "top_eigenvector": {"relative_error_bound": 6.5e-6},
    }
    assert _central_difference_rows(product) == [
        (
            "central-difference products",
            "2.35 gradient passes a product (+3 once); relative error 1.2e-05 on a Gaussian "
            "vector, 6.5e-06 along the top eigenvector",
        )
    ]
    assert _central_difference_rows(None) == []
    over = {**product, "products_over_bound": 2, "worst_predicted_over_bound": 1.234}
    assert _central_difference_rows(over)[0][1].endswith(
        "; 2 products predicted over the stated bound, up to 1.2×"
    )
    assert _central_difference_rows({**product, "products_over_bound": 0}) == (
        _central_difference_rows(product)
    )
