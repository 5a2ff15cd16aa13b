"""Eigenvalues against dense truth (torch.linalg.eigvalsh) in float64."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature import krylov as krylov_module
from curvcal.curvature.eigen import eigenvalues, lanczos, power_iteration
from curvcal.curvature.krylov import KrylovBasis
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.operators import DenseOperator, matvec_into
from curvcal.curvature.results import ConvergenceWarning
from curvcal.errors import InputError

from .cases import spectrum_matrix, split

ALGO_BATCH = 20  # 50 samples as 20 + 20 + 10: uneven, and few passes per product


@pytest.mark.parametrize("case", ["mlp_case", "cnn_case"])
def test_lanczos_top3_of_hessian_to_1e_8(case: str, request: pytest.FixtureRequest) -> None:
    model, x, y, hessian = request.getfixturevalue(case)
    exact = torch.linalg.eigvalsh(hessian)
    spectrum = eigenvalues(HessianOperator(model, split(x, y, ALGO_BATCH)), 3, tol=1e-8)
    assert spectrum.method == "lanczos" and spectrum.converged
    assert torch.allclose(
        torch.tensor(spectrum.eigenvalues, dtype=torch.float64),
        exact.flip(0)[:3],
        rtol=0,
        atol=1e-8,
    )
    assert all(r.residual <= 1e-8 for r in spectrum.values)
    smallest = lanczos(
        HessianOperator(model, split(x, y, ALGO_BATCH)), 2, which="smallest", tol=1e-8
    )
    assert torch.allclose(
        torch.tensor(smallest.eigenvalues, dtype=torch.float64), exact[:2], rtol=0, atol=1e-8
    )


def test_power_lambda_max_of_hessian_to_1e_8(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    exact = torch.linalg.eigvalsh(hessian)
    assert exact[-1] > abs(exact[0])  # dominant and positive: no shift
    spectrum = power_iteration(HessianOperator(model, split(x, y, ALGO_BATCH)), tol=1e-6)
    result = spectrum.values[0]
    assert spectrum.converged and spectrum.shift is None
    assert abs(result.value - float(exact[-1])) < 1e-8
    assert result.iterations == result.matvecs == spectrum.matvecs
    assert result.residual <= 1e-6 and result.relative_change <= 1e-6


def test_power_top3_by_deflation_to_1e_8() -> None:
    matrix = spectrum_matrix(torch.tensor([5.0, 3.0, 1.5, -0.5, 0.4, 0.1, 0.0]))
    spectrum = power_iteration(matrix, 3, tol=1e-7)
    assert spectrum.converged and spectrum.shift is None
    assert torch.allclose(
        torch.tensor(spectrum.eigenvalues, dtype=torch.float64),
        torch.tensor([5.0, 3.0, 1.5], dtype=torch.float64),
        atol=1e-8,
    )
    assert spectrum.matvecs == sum(r.matvecs for r in spectrum.values)


def test_power_stop_rule_is_residual_based() -> None:
    matrix = spectrum_matrix(torch.tensor([4.0, 3.0, 1.0, 0.5, 0.1]))
    spectrum = power_iteration(matrix, tol=1e-4)
    result = spectrum.values[0]
    assert result.converged and result.residual <= 1e-4 and result.relative_change <= 1e-4
    vector_check = power_iteration(matrix, tol=1e-10, max_iter=500).values[0]
    assert abs(vector_check.value - 4.0) < 1e-12
    # the residual bound gives |λ − 4| ≲ residual²·|λ|/gap: tol 1e-4 is well within 1e-6
    assert abs(result.value - 4.0) < 1e-6


def test_negative_dominant_eigenvalue_gives_the_largest_algebraic() -> None:
    matrix = spectrum_matrix(torch.tensor([-10.0, -4.0, -1.0, 0.5, 2.0, 3.0]))
    spectrum = power_iteration(matrix, tol=1e-10)
    assert spectrum.converged
    assert abs(spectrum.values[0].value - 3.0) < 1e-9
    assert spectrum.shift is not None and abs(spectrum.shift + 10.0) < 1e-9
    assert spectrum.dominant is not None and abs(spectrum.dominant[0].value + 10.0) < 1e-9
    top2 = power_iteration(matrix, 2, tol=1e-10, max_iter=5000)
    assert torch.allclose(
        torch.tensor(top2.eigenvalues, dtype=torch.float64),
        torch.tensor([3.0, 2.0], dtype=torch.float64),
        atol=1e-9,
    )
    mixed = spectrum_matrix(torch.tensor([6.0, -4.0, 2.0, 1.0, 0.5]))
    top3 = power_iteration(mixed, 3, tol=1e-10, max_iter=5000)  # 6 found, then −4 forces a shift
    assert torch.allclose(
        torch.tensor(top3.eigenvalues, dtype=torch.float64),
        torch.tensor([6.0, 2.0, 1.0], dtype=torch.float64),
        atol=1e-9,
    )
    assert top3.shift is not None and abs(top3.shift + 4.0) < 1e-9
    lanczos_top = lanczos(matrix, 2, tol=1e-10)
    assert lanczos_top.shift is None and abs(lanczos_top.values[0].value - 3.0) < 1e-9


def test_negative_definite_matrix() -> None:
    matrix = spectrum_matrix(torch.tensor([-5.0, -3.0, -2.0, -1.0]))
    largest = power_iteration(matrix, tol=1e-10)
    assert abs(largest.values[0].value + 1.0) < 1e-9 and largest.shift is not None
    smallest = power_iteration(matrix, which="smallest", tol=1e-10)
    assert abs(smallest.values[0].value + 5.0) < 1e-9 and smallest.shift is None


def test_smallest_by_power_shifts_when_dominant_is_positive() -> None:
    matrix = spectrum_matrix(torch.tensor([-2.0, 0.5, 1.0, 6.0]))
    spectrum = power_iteration(matrix, which="smallest", tol=1e-10)
    assert abs(spectrum.values[0].value + 2.0) < 1e-9
    assert spectrum.shift is not None and abs(spectrum.shift - 6.0) < 1e-9


def test_lanczos_runs_until_ritz_residuals_meet_tolerance() -> None:
    """A clustered top of the spectrum needs many steps; Lanczos must not stop early."""
    values = torch.cat([torch.tensor([10.0, 9.99, 9.98]), torch.linspace(0.0, 9.9, 197)])
    matrix = spectrum_matrix(values, seed=4)
    spectrum = lanczos(matrix, 3, tol=1e-9)
    assert spectrum.converged and spectrum.values[0].iterations > 20
    assert torch.allclose(
        torch.tensor(spectrum.eigenvalues, dtype=torch.float64),
        torch.tensor([10.0, 9.99, 9.98], dtype=torch.float64),
        atol=1e-8,
    )


def test_more_values_than_the_default_steps_are_found() -> None:
    """k above the default 300 steps (but below P): the default steps grow to 2k, so the run
    finds all k values instead of failing to index a basis of 300."""
    values = torch.linspace(1.0, 400.0, 400, dtype=torch.float64)
    matrix = spectrum_matrix(values, seed=5)
    spectrum = lanczos(matrix, 320, tol=1e-8)
    assert spectrum.converged and len(spectrum.eigenvalues) == 320
    assert torch.allclose(
        torch.tensor(spectrum.eigenvalues, dtype=torch.float64),
        values.flip(0)[:320],
        atol=1e-6,
    )


def test_non_convergence_is_a_warning_not_an_error() -> None:
    matrix = spectrum_matrix(torch.linspace(1.0, 2.0, 40))
    with pytest.warns(ConvergenceWarning):
        spectrum = power_iteration(matrix, tol=1e-12, max_iter=3)
    assert not spectrum.converged and spectrum.values[0].iterations == 3
    with pytest.warns(ConvergenceWarning):
        assert not lanczos(matrix, 2, tol=1e-12, max_iter=3).converged


def test_repeated_and_zero_eigenvalues() -> None:
    identity = 2 * torch.eye(6, dtype=torch.float64)
    assert lanczos(identity, 3).eigenvalues == pytest.approx((2.0, 2.0, 2.0), abs=1e-12)
    zero = torch.zeros(5, 5, dtype=torch.float64)
    for method in ("power", "lanczos"):
        spectrum = eigenvalues(zero, 2, method=method)
        assert spectrum.converged and spectrum.eigenvalues == (0.0, 0.0)
    rank_two = spectrum_matrix(torch.tensor([3.0, 1.0, 0.0, 0.0]))
    # a zero eigenvalue's relative residual is floored at about √ε·‖A‖ (≈ 1e-8 here): ask 1e-7
    spectrum = lanczos(rank_two, 3, tol=1e-7)
    assert spectrum.converged and spectrum.eigenvalues == pytest.approx((3.0, 1.0, 0.0), abs=1e-10)


def test_one_by_one_operator() -> None:
    for method in ("power", "lanczos"):
        spectrum = eigenvalues(torch.tensor([[-3.0]], dtype=torch.float64), 1, method=method)
        assert spectrum.converged and spectrum.eigenvalues == (-3.0,)


def test_same_seed_same_result_and_on_step() -> None:
    matrix = spectrum_matrix(torch.linspace(-1.0, 5.0, 30))
    steps: list[int] = []
    first = lanczos(matrix, 2, seed=7, on_step=steps.append)
    assert first == lanczos(matrix, 2, seed=7)
    assert steps == list(range(1, first.values[0].iterations + 1))


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"k": 7}, "k"),
        ({"k": 0}, "k"),
        ({"tol": 0.0}, "tol"),
        ({"tol": -1e-3}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"method": "arnoldi"}, "method"),
        ({"which": "middle"}, "which"),
        ({"max_iter": 0}, "max_iter"),
    ],
)
def test_bad_requests_are_refused(options: dict[str, object], what: str) -> None:
    options = {"k": 1, **options}
    with pytest.raises(InputError) as error:
        eigenvalues(torch.eye(6, dtype=torch.float64), **options)  # type: ignore[arg-type]
    assert error.value.what == what


def test_non_square_operator_is_refused() -> None:
    with pytest.raises(InputError, match="square"):
        eigenvalues(torch.ones(3, 4))


class NoisyOperator(DenseOperator):
    """A dense symmetric matrix whose products carry seeded rounding-like noise: A v + e with
    ‖e‖ = noise·‖v‖ in a random direction, fresh for every product (as float32 rounding is)."""

    def __init__(self, matrix: Tensor, noise: float, seed: int = 0) -> None:
        super().__init__(matrix)
        self.noise = noise
        self.generator = torch.Generator().manual_seed(seed)

    def matmat(self, vectors: Tensor) -> Tensor:
        self.n_matvecs += int(vectors.shape[1])
        error = torch.randn(vectors.shape, generator=self.generator, dtype=torch.float64)
        error = error / error.norm(dim=0) * vectors.norm(dim=0) * self.noise
        return self.matrix @ vectors + error


def _gapped(seed: int = 3) -> Tensor:
    """λ1 = 10, λ2 = 9, then 198 values in [0, 8.5]: Lanczos needs about 20 steps for 1e-6."""
    return spectrum_matrix(
        torch.cat([torch.tensor([10.0, 9.0]), torch.linspace(0.0, 8.5, 198)]), seed=seed
    )


def test_lanczos_keeps_iterating_when_the_true_residual_fails_its_check() -> None:
    """Noise ν = 0.6·tol·‖A‖ per product: when the estimate first passes, the measured residual
    (≈ estimate ⊕ √2·ν) is above tol; the run must go on, not stop unconverged."""
    tol = 1e-6
    operator = NoisyOperator(_gapped(), noise=0.6 * tol * 10.0, seed=0)
    spectrum = lanczos(operator, 1, tol=tol)
    result = spectrum.values[0]
    assert spectrum.converged and spectrum.stopped_by == "tol"
    assert result.residual <= tol
    # two verification products: the first check failed and iteration continued
    assert spectrum.matvecs == result.iterations + 2 == operator.n_matvecs
    assert abs(result.value - 10.0) <= 1e-6 * 10.0


def test_lanczos_names_the_precision_floor() -> None:
    tol = 1e-6
    operator = NoisyOperator(_gapped(), noise=2 * tol * 10.0, seed=1)
    with pytest.warns(ConvergenceWarning, match="float64 precision floor"):
        spectrum = lanczos(operator, 1, tol=tol)
    assert not spectrum.converged and spectrum.stopped_by == "precision"
    assert "max_iter" not in spectrum.limit
    # it stopped soon after the check, not at the step budget
    assert spectrum.values[0].iterations < 40
    assert abs(spectrum.values[0].value - 10.0) <= 1e-5 * 10.0


def test_lanczos_budget_stop_names_max_iter() -> None:
    with pytest.warns(ConvergenceWarning, match=r"stopped by max_iter: all 5 steps"):
        spectrum = lanczos(_gapped(), 1, tol=1e-10, max_iter=5)
    assert spectrum.stopped_by == "max_iter" and not spectrum.converged
    assert spectrum.values[0].iterations == 5 and spectrum.matvecs == 6
    with pytest.warns(ConvergenceWarning, match="stopped by max_iter"):
        power = power_iteration(_gapped(), tol=1e-10, max_iter=5)
    assert power.stopped_by == "max_iter"


def test_lanczos_products_budget_counts_the_verification() -> None:
    with pytest.warns(ConvergenceWarning, match=r"max_matvecs: the budget of 9 products"):
        spectrum = lanczos(_gapped(), 2, tol=1e-10, max_matvecs=9)
    assert spectrum.stopped_by == "max_matvecs" and spectrum.matvecs <= 9
    assert spectrum.values[0].iterations == 7
    with pytest.raises(InputError) as error:
        lanczos(_gapped(), 2, max_matvecs=3)
    assert error.value.what == "max_matvecs"


@pytest.mark.parametrize("max_basis", [None, 6])
def test_lanczos_float32_products_reach_1e_6(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor], max_basis: int | None
) -> None:
    """Products in float32, basis and Rayleigh–Ritz in float64: λ1 to 1e-6, residual ≤ 1e-6,
    also when a basis of 6 vectors restarts."""
    model, x, y, hessian = mlp_case
    exact = float(torch.linalg.eigvalsh(hessian)[-1])
    operator = HessianOperator(copy.deepcopy(model).float(), split(x.float(), y, ALGO_BATCH))
    spectrum = lanczos(operator, 1, tol=1e-6, max_basis=max_basis)
    result = spectrum.values[0]
    assert spectrum.converged and spectrum.stopped_by == "tol" and result.residual <= 1e-6
    assert max_basis is None or result.iterations > max_basis
    assert abs(result.value - exact) <= 1e-6 * abs(exact)


def test_lanczos_k_equal_to_the_dimension_is_exact() -> None:
    values = torch.tensor([4.0, -3.0, 2.0, 1.0, -0.5])
    spectrum = lanczos(spectrum_matrix(values), 5, tol=1e-8)
    assert spectrum.converged and spectrum.values[0].iterations == 5
    assert spectrum.eigenvalues == pytest.approx((4.0, 2.0, 1.0, -0.5, -3.0), abs=1e-12)
    assert all(r.relative_change == 0.0 for r in spectrum.values)


def test_lanczos_negative_dominant_and_zero_operator() -> None:
    matrix = spectrum_matrix(torch.tensor([-10.0, -4.0, -1.0, 0.5, 2.0, 3.0]))
    largest = lanczos(matrix, 1, tol=1e-10)
    smallest = lanczos(matrix, 1, which="smallest", tol=1e-10)
    assert largest.values[0].value == pytest.approx(3.0, abs=1e-9)
    assert smallest.values[0].value == pytest.approx(-10.0, abs=1e-9)
    zero = lanczos(torch.zeros(4, 4, dtype=torch.float32), 2)
    assert zero.converged and zero.eigenvalues == (0.0, 0.0)


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_unconverged_warning_names_the_step_limit_that_stopped_it(method: str) -> None:
    # A spread spectrum and two steps: the run can only stop at its step limit, and the message
    # says so with the limit's value (it used to say "raise max_iter" whatever the cause).
    matrix = torch.diag(torch.linspace(1.0, 2.0, 60, dtype=torch.float64))
    stop = r"stopped by max_iter: all 2 (steps|iterations) allowed.*\(raise max_iter\)"
    with pytest.warns(ConvergenceWarning, match=stop):
        spectrum = eigenvalues(matrix, 1, method=method, tol=1e-12, max_iter=2)
    assert not spectrum.converged and spectrum.stopped_by == "max_iter"


@pytest.mark.parametrize("separation", [1e-2, 1e-3])
@pytest.mark.parametrize("tol", [1e-4, 1e-6])
def test_lanczos_is_not_fooled_by_a_cluster_at_the_top(separation: float, tol: float) -> None:
    """λ1 = 10 and λ2 = 10(1 − separation) above a bulk in [0, 5]: until the Krylov space
    resolves the pair, the Ritz value mixes both while the next Ritz value sits in the bulk. A
    stop that trusted that apparent gap (an r²/gap bound) declared λ1 converged 0.02–0.9%
    off at tol 1e-4; the residual rule keeps going until the value itself is within tol."""
    values = torch.cat(
        [torch.tensor([10.0, 10.0 * (1 - separation)]), torch.linspace(0.0, 5.0, 298)]
    )
    matrix = spectrum_matrix(values, seed=5)
    for seed in range(3):
        spectrum = lanczos(matrix, 1, tol=tol, seed=seed)
        assert spectrum.converged
        assert abs(spectrum.values[0].value - 10.0) <= tol * 10.0


class _Echo:
    """The float32 identity, handing back its own input, with ``matvec_into`` when ``into`` is
    set: Lanczos reuses one float32 buffer for its products' inputs."""

    def __init__(self, size: int, into: bool) -> None:
        self.size = size
        self.calls = {"matmat": 0, "matvec_into": 0}
        if into:
            self.matvec_into = self._into

    shape = property(lambda self: (self.size, self.size))
    dtype = property(lambda self: torch.float32)
    device = property(lambda self: torch.device("cpu"))

    def matmat(self, vectors: Tensor) -> Tensor:
        self.calls["matmat"] += 1
        return vectors

    def matvec(self, vector: Tensor) -> Tensor:
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)

    def _into(self, vector: Tensor, out: Tensor) -> Tensor:
        self.calls["matvec_into"] += 1
        return out.copy_(vector)


@pytest.mark.parametrize("into", [False, True])
def test_matvec_into_uses_the_operators_own_or_a_copy(into: bool) -> None:
    operator = _Echo(6, into)
    vector = torch.arange(6, dtype=torch.float32)
    out = torch.full((6,), float("nan"), dtype=torch.float64)
    assert matvec_into(operator, vector, out) is out
    assert torch.equal(out, vector.double())
    assert operator.calls == {"matmat": 0 if into else 1, "matvec_into": 1 if into else 0}
    # every eigenvalue is 1, up to the float32 rounding of the vectors
    spectrum = lanczos(operator, k=2)
    assert spectrum.converged
    assert [v.value for v in spectrum.values] == pytest.approx([1.0, 1.0], abs=1e-7)
    assert all(v.residual <= 1e-7 for v in spectrum.values)
    assert operator.calls["matvec_into" if into else "matmat"] >= 2


class _BasisSpy:
    """Records the rows every Lanczos basis allocates (patched over KrylovBasis where
    ``operator_basis`` makes it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from curvcal.curvature import krylov as krylov_module
        from curvcal.curvature.krylov import KrylovBasis

        self.bases: list[KrylovBasis] = []
        spy = self

        class Recorded(KrylovBasis):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)  # type: ignore[arg-type]
                spy.bases.append(self)

        monkeypatch.setattr(krylov_module, "KrylovBasis", Recorded)

    def rows(self) -> list[int]:
        return [sum(block.shape[0] for block in basis._blocks) for basis in self.bases]


@pytest.mark.parametrize("case", ["mlp_case", "cnn_case"])
def test_thick_restarts_find_the_dense_top3_in_a_bounded_basis(
    case: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A basis of 2k + 2 = 8 vectors (restarted on 4 Ritz vectors): the three largest and the
    two smallest eigenvalues of the dense Hessian to 1e-8, in more steps than the basis holds,
    never allocating a ninth row."""
    model, x, y, hessian = request.getfixturevalue(case)
    exact = torch.linalg.eigvalsh(hessian)
    spy = _BasisSpy(monkeypatch)
    operator = HessianOperator(model, split(x, y, ALGO_BATCH))
    spectrum = lanczos(operator, 3, tol=1e-8, max_basis=8)
    smallest = lanczos(operator, 2, which="smallest", tol=1e-8, max_basis=8)
    assert spectrum.converged and smallest.converged
    assert spectrum.values[0].iterations > 8 and smallest.values[0].iterations > 8
    assert spy.rows() == [8, 8]
    found = torch.tensor(spectrum.eigenvalues, dtype=torch.float64)
    assert torch.allclose(found, exact.flip(0)[:3], rtol=0, atol=1e-8)
    low = torch.tensor(smallest.eigenvalues, dtype=torch.float64)
    assert torch.allclose(low, exact[:2], rtol=0, atol=1e-8)
    assert all(r.residual <= 1e-8 for r in (*spectrum.values, *smallest.values))


def test_the_smallest_bound_still_converges_and_a_bound_of_p_changes_nothing() -> None:
    """max_basis = k + 2 (one Ritz vector kept, the latest, one new: restarted every step) still
    reaches 1e-8, in more products; a bound at or above P never restarts, so the run is the
    unbounded one, product for product."""
    values = torch.cat([torch.tensor([6.0, 4.5, -2.0]), torch.linspace(-1.0, 1.0, 37)])
    matrix = spectrum_matrix(values, seed=2)
    free = lanczos(matrix, 1, tol=1e-8)
    tight = lanczos(matrix, 1, tol=1e-8, max_basis=3)
    assert tight.converged and tight.values[0].value == pytest.approx(6.0, abs=1e-8)
    assert tight.matvecs > free.matvecs
    assert lanczos(matrix, 1, tol=1e-8, max_basis=40) == free
    assert lanczos(matrix, 1, tol=1e-8, max_basis=400) == free


@pytest.mark.parametrize("bound", [2, 0, True, 4.0, "8"])
def test_a_basis_bound_below_k_plus_2_is_refused(bound: object) -> None:
    with pytest.raises(InputError) as error:
        lanczos(torch.eye(10, dtype=torch.float64), 1, max_basis=bound)  # type: ignore[arg-type]
    assert error.value.what == "max_basis" and "k + 2 = 3" in str(error.value)


def test_a_bound_of_p_is_accepted_even_below_k_plus_2() -> None:
    """k = P = 3: a basis of 3 vectors spans the space, so max_basis = 3 bounds nothing."""
    matrix = spectrum_matrix(torch.tensor([3.0, 2.0, -1.0]))
    spectrum = lanczos(matrix, 3, tol=1e-10, max_basis=3)
    assert spectrum.converged and spectrum.eigenvalues == pytest.approx((3.0, 2.0, -1.0), abs=1e-12)


class _Diagonal:
    """diag(values) as an operator: products cost nothing, so the vectors can be long."""

    def __init__(self, values: Tensor) -> None:
        self.values = values

    @property
    def shape(self) -> tuple[int, int]:
        return (self.values.numel(), self.values.numel())

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def matmat(self, vectors: Tensor) -> Tensor:
        return self.values[:, None] * vectors

    def matvec(self, vector: Tensor) -> Tensor:
        return self.values * vector


def test_float32_products_keep_a_float32_basis_and_reach_a_1e6_residual(monkeypatch) -> None:
    """Float32 products over 400,000 entries: the basis is stored in float32 (half the memory)
    but every dot is summed in float64, so the measured residual still reaches 1e-6 (float32
    BLAS dots over 10⁷ entries stall Lanczos near 1e-3)."""
    made: list[KrylovBasis] = []

    class Recorded(KrylovBasis):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(krylov_module, "KrylovBasis", Recorded)
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(400_000, generator=generator, dtype=torch.float64)
    values[:2] = torch.tensor([3.0, 2.0], dtype=torch.float64)
    spectrum = lanczos(_Diagonal(values.to(torch.float32)), k=1, tol=1e-6, max_basis=8)
    (basis,) = made
    assert basis.storage == torch.float32 and basis.dtype == torch.float64
    top = spectrum.values[0]
    assert spectrum.converged and spectrum.stopped_by == "tol" and top.residual <= 1e-6
    assert top.value == pytest.approx(3.0, rel=1e-6)
    # float64 products keep a float64 basis
    lanczos(_Diagonal(values[:1000]), k=1, tol=1e-8)
    assert made[-1].storage == torch.float64
