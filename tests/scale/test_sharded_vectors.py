"""Vectors held a slice per rank (:mod:`curvcal.curvature.vectors`): the space's sums against the
whole vectors' numpy reference, the eigenvalue, trace and density kernels on W simulated ranks
(threads) against the whole-vector run, and (slow) W gloo ranks sharing a sharded model against
one process's exact figures and the whole-vector sharded path."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.curvature import (
    eigenvalues,
    hutchinson_trace,
    hutchpp_trace,
    power_iteration,
    spectral_density,
    xtrace,
)
from curvcal.curvature.vectors import SlicedSpace, VectorSpace

from .launch import worker_results
from .ranks_in_threads import SlicedDense, ThreadRanks, global_indices, local_ranges

#: "parameters" of uneven first dimensions: 3 ranks leave one an empty shard of the (2, 5) one
SHAPES = [(7, 3), (5,), (4, 2, 2), (2, 5), (9,)]
P = sum(math.prod(s) for s in SHAPES)  # 61


def _matrix(seed: int = 0) -> torch.Tensor:
    """A symmetric float64 matrix with a decaying spectrum (a few large eigenvalues, the rest
    small and of both signs), like a Hessian."""
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(P, P, generator=generator, dtype=torch.float64))
    values = torch.cat(
        [
            torch.tensor([9.0, 6.5, 4.0, 2.5], dtype=torch.float64),
            torch.linspace(-0.4, 0.8, P - 4, dtype=torch.float64),
        ]
    )
    return (q * values) @ q.t()


def _on_ranks(world: int, job):  # type: ignore[no-untyped-def]
    """``job(operator)`` with each of ``world`` simulated ranks' sliced view of the matrix."""
    matrix = _matrix()
    ranks = ThreadRanks(world)
    return ranks.run(lambda rank: job(SlicedDense(matrix, SHAPES, ranks, rank)))


# -- the space's sums, against numpy on the whole vectors -------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_sliced_sums_equal_the_whole_vectors(world: int) -> None:
    """dot, norm, column norms and a k × m projection summed over the ranks equal numpy's on
    the whole vectors; drawing the same probes gives each rank its rows of the whole draw
    (Rademacher) whatever W."""
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(P, generator=generator, dtype=torch.float64)
    b = torch.randn(P, generator=generator, dtype=torch.float64)
    block = torch.randn(P, 3, generator=generator, dtype=torch.float64)
    rows = torch.randn(4, P, generator=generator, dtype=torch.float64)
    ranks = ThreadRanks(world)

    def job(rank: int) -> dict[str, torch.Tensor]:
        pieces = local_ranges(SHAPES, rank, world)
        mine = global_indices(pieces)
        space = SlicedSpace(pieces, lambda value: ranks.reduce(rank, value))
        assert space.size == mine.numel() < P
        return {
            "dot": space.dot(a[mine], b[mine]),
            "norm": space.norm(a[mine]),
            "columns": space.column_norms(block[mine]),
            "project": space.project(rows[:, mine], block[mine]),
            "probes": space.probes(5, "rademacher", torch.Generator().manual_seed(2)),
            "indices": mine,
        }

    expected_probes = VectorSpace(P).probes(5, "rademacher", torch.Generator().manual_seed(2))
    for got in ranks.run(job):
        assert float(got["dot"]) == pytest.approx(float(np.dot(a.numpy(), b.numpy())), rel=1e-13)
        assert float(got["norm"]) == pytest.approx(float(np.linalg.norm(a.numpy())), rel=1e-13)
        np.testing.assert_allclose(
            got["columns"].numpy(), np.linalg.norm(block.numpy(), axis=0), rtol=1e-13
        )
        np.testing.assert_allclose(
            got["project"].numpy(), rows.numpy() @ block.numpy(), rtol=1e-12, atol=1e-12
        )
        assert torch.equal(got["probes"], expected_probes[got["indices"]])


def test_gaussian_draws_do_not_depend_on_the_ranks() -> None:
    """A Gaussian vector drawn a parameter at a time: the slices of W = 2 and 3 put together
    are the same vector (W = 1's)."""
    whole = SlicedSpace(local_ranges(SHAPES, 0, 1), lambda v: v).normal(
        torch.Generator().manual_seed(4)
    )
    for world in (2, 3):
        assembled = torch.empty(P, dtype=torch.float64)
        for rank in range(world):
            pieces = local_ranges(SHAPES, rank, world)
            space = SlicedSpace(pieces, lambda v: v)
            assembled[global_indices(pieces)] = space.normal(torch.Generator().manual_seed(4))
        assert torch.equal(assembled, whole)


# -- the kernels on simulated ranks, against the whole-vector run -----------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_lanczos_and_power_on_slices_find_the_exact_eigenvalues(world: int) -> None:
    exact = torch.linalg.eigvalsh(_matrix()).flip(0)[:3]

    def job(op: SlicedDense) -> tuple[list[float], list[float], torch.Tensor, torch.Tensor]:
        vectors: list[torch.Tensor] = []
        spectrum = eigenvalues(op, 3, tol=1e-10, seed=3, on_vectors=vectors.append)
        power = power_iteration(op, 1, tol=1e-10, seed=3)
        assert vectors[0].shape == (op.vector_space.size, 3)  # the rank's slices
        whole = op.vector_space.whole(vectors[0])
        return list(spectrum.eigenvalues), list(power.eigenvalues), whole, vectors[0]

    for values, power, vectors, _ in _on_ranks(world, job):
        np.testing.assert_allclose(values, exact.numpy(), rtol=1e-9)
        assert power[0] == pytest.approx(float(exact[0]), rel=1e-9)
        # the slices handed on, gathered whole, are eigenvectors: A y = λ y
        residual = _matrix() @ vectors - vectors * torch.tensor(values, dtype=torch.float64)
        assert vectors.shape == (P, 3) and float(residual.abs().max()) < 1e-6


@pytest.mark.parametrize("world", [2, 3])
def test_eigenvectors_reach_the_first_rank_a_parameter_at_a_time(world: int) -> None:
    """:meth:`TopEigenvectors.per_parameter` on simulated ranks: rank 0 gets each parameter's
    rows of the whole eigenvectors (as :meth:`by_name` and numpy's eigenvectors give them),
    never more than one parameter at a time; the other ranks get None."""
    from curvcal.curvature.eigenvectors import TopEigenvectors

    names = tuple(f"p{i}" for i in range(len(SHAPES)))
    shapes = tuple(torch.Size(shape) for shape in SHAPES)

    def job(op: SlicedDense) -> tuple[list, list, int]:  # type: ignore[type-arg]
        kept: list[torch.Tensor] = []
        spectrum = eigenvalues(op, 2, tol=1e-10, seed=3, on_vectors=kept.append)
        top = TopEigenvectors(spectrum.eigenvalues, names, shapes, op.vector_space, kept[0])
        streamed = list(top.per_parameter())
        return streamed, top.by_name(), op.longest_collected

    results = _on_ranks(world, job)
    _, exact_vectors = torch.linalg.eigh(_matrix())
    top_two = exact_vectors.flip(1)[:, :2]
    for rank, (streamed, by_name, longest) in enumerate(results):
        assert [name for name, _ in streamed] == list(names)
        # by_name is whole on every rank: v_i up to sign
        whole = torch.stack([torch.cat([v[n].reshape(-1) for n in names]) for v in by_name], 1)
        signs = torch.sign((whole * top_two).sum(0))
        assert float((whole - top_two * signs).abs().max()) < 1e-6
        if rank:
            assert all(part is None for _, part in streamed) and longest == 0
            continue
        assert longest == max(math.prod(shape) for shape in SHAPES) < P
        for (name, part), shape in zip(streamed, SHAPES, strict=True):
            assert part is not None and part.shape == (2, *shape)
            for i in range(2):
                assert torch.equal(part[i], by_name[i][name])


@pytest.mark.parametrize("world", [2, 3])
def test_traces_on_slices_equal_the_whole_vectors(world: int) -> None:
    """Hutchinson, Hutch++ and XTrace from the same seed: the same Rademacher probes, so the
    same estimates and intervals as the whole-vector run, to rounding."""
    matrix = _matrix()
    runs = {
        "hutchinson": lambda op: hutchinson_trace(op, 10, seed=5, probe_batch=3),
        "hutchpp": lambda op: hutchpp_trace(op, 30, seed=5, probe_batch=4),
        "xtrace": lambda op: xtrace(op, 30, seed=5, probe_batch=4),
    }
    for name, run in runs.items():
        whole = run(matrix)
        for got in _on_ranks(world, run):
            assert got.estimate == pytest.approx(whole.estimate, rel=1e-11), name
            assert got.standard_error == pytest.approx(whole.standard_error, rel=1e-8), name
            assert got.matvecs == whole.matvecs


@pytest.mark.parametrize("reorthogonalise", [True, False])
def test_density_on_slices_equals_the_whole_vectors(reorthogonalise: bool) -> None:
    """SLQ from the same seed: the same nodes and weights (Rademacher starts), to rounding."""

    def run(op):  # type: ignore[no-untyped-def]
        return spectral_density(op, runs=2, steps=12, seed=1, reorthogonalise=reorthogonalise)

    whole = run(_matrix())
    for got in _on_ranks(2, run):
        for nodes, expected in zip(got.nodes, whole.nodes, strict=True):
            np.testing.assert_allclose(nodes, expected, rtol=1e-9, atol=1e-10)
        for weights, expected in zip(got.weights, whole.weights, strict=True):
            np.testing.assert_allclose(weights, expected, rtol=1e-7, atol=1e-10)


def test_a_wrong_reduction_is_caught() -> None:
    """The kernels' figures depend on the sums being over every rank: with each rank summing
    only its own slice, the trace is wrong (the test above would fail)."""
    matrix = _matrix()
    ranks = ThreadRanks(2)

    def job(rank: int) -> float:
        op = SlicedDense(matrix, SHAPES, ranks, rank)
        op.vector_space = SlicedSpace(op.pieces, lambda value: value, op._whole)
        return hutchinson_trace(op, 10, seed=5).estimate

    whole = hutchinson_trace(matrix, 10, seed=5).estimate
    assert all(abs(got - whole) > 1e-3 * abs(whole) for got in ranks.run(job))


# -- W gloo ranks sharing a sharded model -------------------------------------------------------

WORKER = Path(__file__).with_name("sliced_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _torchrun(out: Path, ranks: int, dtype: str, how: str) -> list[dict[str, torch.Tensor]]:
    return worker_results(WORKER, out, ranks, dtype, how, timeout=600)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.slow  # W ranks, about 90 central-difference products of 2 gradient passes each
@pytest.mark.parametrize(("ranks", "how"), [(2, "blocks"), (4, "modules")])
def test_sliced_vectors_equal_one_exact_process(tmp_path: Path, ranks: int, how: str) -> None:
    """float64, W ranks, every vector a slice of P/W values: λmax and the top 3, the Hutchinson,
    Hutch++ and XTrace traces and the SLQ moments equal one process's exact (double backward)
    figures within 1e-7, and the whole-vector sharded path's; no tensor with a dimension of P
    is made on any rank, while computing or while rank 0 collects the top eigenvectors a
    parameter at a time (those equal one process's up to sign)."""
    from curvcal.curvature import build_operator
    from curvcal.losses import loss_from_name

    from .sharded_worker import N_SAMPLES, make_problem
    from .sliced_worker import batches_of, figures

    model, x, y = make_problem(torch.float64)
    single_vectors: list[torch.Tensor] = []
    single = figures(
        build_operator(model, loss_from_name("ce", 0.0), batches_of(x, y, list(range(N_SAMPLES)))),
        torch.float64,
        single_vectors,
    )
    results = _torchrun(tmp_path, ranks, "float64", how)
    n_params = int(results[0]["n_params"])
    assert sum(int(r["length"]) for r in results) == n_params
    for got in results:
        assert int(got["length"]) <= -(-n_params // ranks) + 200  # about P/W (uneven rows)
        assert int(got["longest"]) < n_params  # no P-long vector, basis row or block
        for name in ("eigenvalues", "hutchinson", "hutchpp", "xtrace", "moments"):
            assert _relative(got[name], single[name]) < 1e-7, name
        assert _relative(got["eigenvalues"], got["whole_eigenvalues"]) < 1e-7
        assert _relative(got["hutchpp"][0], got["whole_hutchpp"]) < 1e-7
        # the eigenvectors reach rank 0 a parameter at a time: no P-long tensor on any rank
        assert int(got["longest_streaming"]) < n_params
    streamed, exact = results[0]["streamed"], single_vectors[0]
    assert streamed.shape == exact.shape == (n_params, 3)
    signs = torch.sign((streamed * exact).sum(0))  # the vectors, up to sign
    assert float((streamed * signs - exact).abs().max()) < 1e-5
    assert all(bool(r["streamed_none"]) for r in results[1:])
    assert single["eigenvalues"][0] > 1.0 and single["hutchpp"][0] > 1.0  # not trivial


# -- a 16-bit model stays refused, with the count in the message ------------------------------


def test_the_sixteen_bit_floor_is_the_least_error_over_steps() -> None:
    """(h, error) minimises 3u/h + h⁴/30 (a brute-force search agrees), and the least error is
    far above float32's floor: 2.4% in bfloat16, 0.45% in float16."""
    from curvcal.curvature.central_difference import relative_floor, sixteen_bit_floor

    for dtype, unit, expected in (
        (torch.bfloat16, 2.0**-8, 0.024),
        (torch.float16, 2.0**-11, 0.0045),
    ):
        steps = np.linspace(1e-3, 2.0, 200_001)
        errors = 3 * unit / steps + steps**4 / 30
        step, error = sixteen_bit_floor(dtype)
        assert step == pytest.approx(float(steps[errors.argmin()]), rel=1e-4)
        assert error == pytest.approx(float(errors.min()), rel=1e-6)
        assert error == pytest.approx(expected, rel=0.02)
        assert error > 100 * relative_floor(torch.float32)


@pytest.mark.parametrize(("dtype", "share"), [("bfloat16", "2.4%"), ("float16", "0.5%")])
def test_a_sixteen_bit_model_is_refused_with_its_count(run_cli, dtype: str, share: str) -> None:
    result = run_cli(
        "hessian", str(ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"), "--data", "curvcal:digits", "--device", "cpu",
        "--shard-model", "blocks", "--dtype", dtype,
    )  # fmt: skip
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"still leaves about {share} error" in lines[0]
