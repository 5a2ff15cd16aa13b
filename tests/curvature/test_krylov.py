"""KrylovBasis against dense linear algebra: orthogonalisation, coefficients, combinations."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.curvature.krylov import MAX_BLOCK, RESTART_COLUMNS, KrylovBasis
from curvcal.curvature.vectors import VectorSpace


def _orthonormal(size: int, count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(size, count, dtype=torch.float64, generator=generator)
    return torch.linalg.qr(matrix).Q  # size × count


def _filled(size: int, count: int) -> tuple[KrylovBasis, torch.Tensor]:
    columns = _orthonormal(size, count)
    basis = KrylovBasis(size, torch.float64, "cpu")
    for index in range(count):
        basis.append(columns[:, index])
    return basis, columns


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 8, 13, 2 * MAX_BLOCK + 3])
def test_extend_matches_the_dense_projection(count: int) -> None:
    """v − QQᵀv and Qᵀv, across every block boundary the basis grows through."""
    basis, columns = _filled(60, count)
    vector = torch.randn(60, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kept = vector.clone()
    remainder, coefficients = basis.extend(vector)
    assert torch.equal(vector, kept)  # the input is not modified
    expected = vector - columns @ (columns.t() @ vector)
    assert torch.allclose(remainder, expected, atol=1e-13, rtol=0)
    assert torch.allclose(coefficients, columns.t() @ vector, atol=1e-13, rtol=0)
    assert len(basis) == count


@pytest.mark.parametrize("count", [0, 1, 2, 7, 8, 2 * MAX_BLOCK + 3])
def test_extend_clears_in_the_next_row_and_commit_keeps_it(count: int) -> None:
    """extend: the dense projection v − QQᵀv and Qᵀv, written into the basis' next row (a
    float32 input cast there); a second extend overwrites it; commit normalises and keeps it."""
    basis, columns = _filled(60, count)
    generator = torch.Generator().manual_seed(4)
    first = torch.randn(60, dtype=torch.float32, generator=generator)
    basis.extend(first)
    vector = torch.randn(60, dtype=torch.float32, generator=generator)
    remainder, coefficients = basis.extend(vector)  # the pending row is reused
    wide = vector.to(torch.float64)
    expected = wide - columns @ (columns.t() @ wide)
    assert remainder.dtype == torch.float64 and len(basis) == count
    assert torch.allclose(remainder, expected, atol=1e-13, rtol=0)
    assert torch.allclose(coefficients, columns.t() @ wide, atol=1e-13, rtol=0)
    norm = float(remainder.norm())
    basis.commit(norm)
    assert len(basis) == count + 1
    assert torch.allclose(basis[-1], expected / norm, atol=1e-13, rtol=0)
    stacked = torch.stack([basis[i] for i in range(count + 1)], dim=1)
    gram = stacked.t() @ stacked
    assert torch.allclose(gram, torch.eye(count + 1, dtype=torch.float64), atol=1e-12, rtol=0)


def test_a_lanczos_image_is_left_orthogonal_to_working_precision() -> None:
    """A vector almost inside the span (a Lanczos image: large components along the latest
    vectors, a small remainder) comes out orthogonal to the basis to ε, not to ε·‖v‖/‖r‖."""
    basis, columns = _filled(500, 12)
    generator = torch.Generator().manual_seed(2)
    outside = torch.randn(500, dtype=torch.float64, generator=generator)
    outside -= columns @ (columns.t() @ outside)
    vector = 1e6 * columns[:, -1] + 3e5 * columns[:, -2] + 1.0 * columns[:, 0] + 1e-3 * outside
    remainder, coefficients = basis.extend(vector)
    leak = (columns.t() @ remainder).abs().max() / remainder.norm()
    assert leak < 1e-12
    assert torch.allclose(remainder, 1e-3 * outside, rtol=0, atol=1e-9)
    assert coefficients[-1] == pytest.approx(1e6, rel=1e-12)
    assert coefficients[-2] == pytest.approx(3e5, rel=1e-12)
    assert coefficients[0] == pytest.approx(1.0, abs=1e-8)


def test_a_vector_inside_the_span_leaves_nothing() -> None:
    basis, _ = _filled(40, 40)  # the whole space
    vector = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    remainder, _ = basis.extend(vector)
    assert float(remainder.norm()) < 1e-13 * float(vector.norm())


@pytest.mark.parametrize("count", [1, 4, MAX_BLOCK + 1])
def test_combine_is_the_dense_product(count: int) -> None:
    basis, columns = _filled(30, count)
    generator = torch.Generator().manual_seed(4)
    coefficients = torch.randn(count, 3, dtype=torch.float64, generator=generator)
    assert torch.allclose(basis.combine(coefficients), columns @ coefficients, atol=1e-14)
    # the first rows only: a basis one vector ahead of its Rayleigh–Ritz matrix
    assert torch.allclose(
        basis.combine(coefficients[: count - 1]), columns[:, : count - 1] @ coefficients[:-1]
    )


def test_indexing_and_bad_requests() -> None:
    basis, columns = _filled(10, 5)
    assert torch.equal(basis[0], columns[:, 0]) and torch.equal(basis[-1], columns[:, 4])
    with pytest.raises(IndexError):
        basis[5]
    with pytest.raises(IndexError):
        basis[-6]
    with pytest.raises(ValueError, match="6 coefficients for a basis of 5"):
        basis.combine(torch.zeros(6, 1, dtype=torch.float64))


def test_float32_basis_and_input_dtype() -> None:
    """The basis keeps its own dtype; inputs of another dtype are cast."""
    basis = KrylovBasis(8, torch.float32, "cpu")
    basis.append(torch.eye(8)[0])
    remainder, coefficients = basis.extend(torch.ones(8, dtype=torch.float64))
    assert remainder.dtype == coefficients.dtype == torch.float32
    assert remainder[0] == 0.0 and coefficients.tolist() == [1.0]


@pytest.mark.parametrize("count", [0, 1, 3, MAX_BLOCK + 1])
def test_extend_into_clears_what_is_written_in_the_next_row(count: int) -> None:
    """extend_into: the row handed to ``write`` is the basis' next row, and what is written there
    is cleared exactly as extend clears a copy of it."""
    basis, columns = _filled(60, count)
    vector = torch.randn(60, dtype=torch.float32, generator=torch.Generator().manual_seed(6))
    rows: list[torch.Tensor] = []

    def write(row: torch.Tensor) -> None:
        assert row.shape == (60,) and row.dtype == torch.float64
        rows.append(row)
        row.copy_(vector)

    remainder, coefficients = basis.extend_into(write)
    assert len(rows) == 1 and remainder.data_ptr() == rows[0].data_ptr()
    wide = vector.to(torch.float64)
    assert torch.allclose(remainder, wide - columns @ (columns.t() @ wide), atol=1e-13, rtol=0)
    assert torch.allclose(coefficients, columns.t() @ wide, atol=1e-13, rtol=0)
    basis.commit(float(remainder.norm()))
    assert basis[-1].data_ptr() == rows[0].data_ptr() and len(basis) == count + 1


@pytest.mark.parametrize(("count", "kept"), [(3, 1), (9, 4), (2 * MAX_BLOCK + 3, 9), (6, 5)])
def test_restart_keeps_the_combinations_and_the_latest_vector(
    count: int, kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restart(C): rows y_j = Σ_{i<n} q_i c_ij, then q_m, against the dense product Q_n C, in
    column pieces (7 columns at a time, so 60 columns take 9 pieces, the last a short one)."""
    monkeypatch.setattr("curvcal.curvature.krylov.RESTART_COLUMNS", 7)
    basis, columns = _filled(60, count)
    rows = count - 1
    coefficients = _orthonormal(rows, kept, seed=3)
    basis.restart(coefficients)
    assert len(basis) == kept + 1
    expected = torch.cat([columns[:, :rows] @ coefficients, columns[:, -1:]], dim=1)
    stacked = torch.stack([basis[i] for i in range(kept + 1)], dim=1)
    assert torch.allclose(stacked, expected, atol=1e-13, rtol=0)
    gram = stacked.t() @ stacked
    assert torch.allclose(gram, torch.eye(kept + 1, dtype=torch.float64), atol=1e-12, rtol=0)
    # the basis goes on growing from there, orthogonal to what it kept
    vector = torch.randn(60, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    remainder, _ = basis.extend(vector)
    assert float((stacked.t() @ remainder).abs().max()) < 1e-12


def test_a_bounded_basis_never_allocates_more_rows() -> None:
    """max_rows = 5: the blocks hold 5 rows in all (2 + 2 + 1, not 2 + 2 + 4); a sixth row is
    refused until a restart makes room, which allocates nothing."""
    columns = _orthonormal(40, 5)
    basis = KrylovBasis(40, torch.float64, "cpu", max_rows=5)
    for index in range(5):
        basis.append(columns[:, index])
    assert sum(block.shape[0] for block in basis._blocks) == 5
    with pytest.raises(RuntimeError, match="full"):
        basis.extend(torch.ones(40, dtype=torch.float64))
    blocks = list(basis._blocks)
    basis.restart(torch.eye(4, 2, dtype=torch.float64))  # y = q_1, q_2, then q_5
    assert len(basis) == 3 and torch.equal(basis[2], columns[:, 4])
    remainder, _ = basis.extend(torch.ones(40, dtype=torch.float64))
    basis.commit(float(remainder.norm()))
    assert [b.data_ptr() for b in basis._blocks] == [b.data_ptr() for b in blocks]


def test_bad_bounds_and_restarts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 rows"):
        KrylovBasis(10, torch.float64, "cpu", max_rows=1)
    basis, _ = _filled(10, 4)
    for shape in ((4, 1), (3, 4), (5, 2)):  # n and l must both be fewer than the 4 vectors
        with pytest.raises(ValueError, match="fewer than the vectors held"):
            basis.restart(torch.zeros(*shape, dtype=torch.float64))
    assert len(basis) == 4  # a refused restart changes nothing


def test_combine_in_a_narrower_dtype_is_the_wide_sum_rounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """combine(C, float32): Q_n C summed in float64 (7 columns at a time), then rounded once;
    equal to the dense float64 product cast to float32."""
    monkeypatch.setattr("curvcal.curvature.krylov.RESTART_COLUMNS", 7)
    basis, columns = _filled(60, 2 * MAX_BLOCK + 3)
    coefficients = torch.randn(
        10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
    )
    wide = columns[:, :10] @ coefficients
    narrow = basis.combine(coefficients, dtype=torch.float32)
    assert narrow.dtype == torch.float32
    assert torch.allclose(narrow, wide.float(), atol=1e-6, rtol=0)
    assert torch.allclose(basis.combine(coefficients), wide, atol=1e-13, rtol=0)
    with pytest.raises(ValueError, match="coefficients for a basis"):
        basis.combine(torch.zeros(2 * MAX_BLOCK + 4, 1, dtype=torch.float64))


NARROW = RESTART_COLUMNS + 1000  # more columns than one piece: the chunked sums are exercised


def _narrow(count: int, seed: int = 0) -> tuple[KrylovBasis, torch.Tensor]:
    """A float64 basis stored in float32, filled by extend and commit from random vectors; the
    float32 rows widened (what the dense references are taken against)."""
    basis = KrylovBasis(NARROW, torch.float64, "cpu", storage=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        remainder, _ = basis.extend(torch.randn(NARROW, dtype=torch.float64, generator=generator))
        basis.commit(float(remainder.norm()))
    rows = torch.stack([basis[i] for i in range(count)], dim=1) if count else torch.empty(NARROW, 0)
    return basis, rows.to(torch.float64)


@pytest.mark.parametrize("count", [1, 2, 3, MAX_BLOCK + 2])
def test_narrow_storage_clears_in_float64_and_rounds_once(count: int) -> None:
    """Rows in float32, arithmetic in float64: the remainder and coefficients are the dense
    float64 projection against the stored (rounded) rows, and the stored rows are orthonormal to
    float32 precision."""
    basis, rows = _narrow(count)
    assert basis.narrow and basis[0].dtype == torch.float32
    gram = rows.t() @ rows
    assert float((gram - torch.eye(count, dtype=torch.float64)).abs().max()) < 1e-6
    vector = torch.randn(NARROW, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    remainder, coefficients = basis.extend(vector)
    assert remainder.dtype == torch.float64
    # classical Gram–Schmidt against nearly orthonormal rows: Qᵀv to rounding, and the
    # remainder v − Q·c with c the coefficients removed
    assert torch.allclose(coefficients, rows.t() @ vector, atol=1e-9, rtol=0)
    assert torch.allclose(remainder, vector - rows @ coefficients, atol=1e-12, rtol=0)
    assert float((rows.t() @ remainder).abs().max()) < 1e-6 * float(vector.norm())
    norm = float(remainder.norm())
    cleared = remainder.clone()
    basis.commit(norm)
    assert basis[-1].dtype == torch.float32
    # divided in float64 and rounded once as it is stored; the work vector is then the new
    # row's wide copy, its stored values exactly
    assert torch.equal(basis[-1], (cleared / norm).to(torch.float32))
    assert torch.equal(remainder, basis[-1].to(torch.float64))


def test_narrow_storage_restart_and_combine_are_the_wide_sums() -> None:
    basis, rows = _narrow(6, seed=2)
    generator = torch.Generator().manual_seed(3)
    coefficients = torch.linalg.qr(torch.randn(5, 3, dtype=torch.float64, generator=generator)).Q
    combined = basis.combine(coefficients)
    assert combined.dtype == torch.float64
    assert torch.allclose(combined, rows[:, :5] @ coefficients, atol=1e-13, rtol=0)
    basis.restart(coefficients)
    assert len(basis) == 4
    kept = torch.stack([basis[i] for i in range(4)], dim=1)
    assert kept.dtype == torch.float32
    # the combinations summed in float64, rounded once; the latest vector moved as it was
    assert torch.allclose(kept[:, :3].double(), rows[:, :5] @ coefficients, atol=1e-7, rtol=0)
    assert torch.equal(kept[:, 3].double(), rows[:, 5])


@pytest.mark.parametrize("storage", [torch.float64, torch.float32])
@pytest.mark.parametrize("count", [1, 2, 3, MAX_BLOCK + 1, 2 * MAX_BLOCK + 3])
def test_clearing_of_the_latest_two_then_of_the_whole_basis(
    count: int, storage: torch.dtype
) -> None:
    """clear_next(whole=False): v − Q₂Q₂ᵀv over the two latest vectors only (the other
    coefficients 0), its norm in remainder_norm; reorthogonalise: then the dense projection
    v − QQᵀv, the coefficients it removed being Qᵀv on the older vectors; narrow (float32)
    rows too, cleared in the wide work vector."""
    columns = _orthonormal(60, count)
    # float32 rows are orthonormal to float32's precision only
    atol = 1e-12 if storage == torch.float64 else 1e-6
    basis = KrylovBasis(60, torch.float64, "cpu", storage=storage)
    for index in range(count):
        basis.append(columns[:, index])
    stored = torch.stack([basis[i].to(torch.float64) for i in range(count)], dim=1)
    vector = torch.randn(60, dtype=storage, generator=torch.Generator().manual_seed(2))
    basis.next_row().copy_(vector)
    wide = vector.to(torch.float64)
    recent = stored[:, -2:]
    remainder, coefficients = basis.clear_next(whole=False)
    expected = wide - recent @ (recent.t() @ wide)
    assert torch.allclose(remainder, expected, atol=atol, rtol=0)
    assert torch.allclose(coefficients[-2:], recent.t() @ wide, atol=atol, rtol=0)
    assert not coefficients[:-2].any()
    assert basis.remainder_norm == pytest.approx(float(expected.norm()), rel=atol)
    older = basis.reorthogonalise()
    assert torch.allclose(remainder, wide - stored @ (stored.t() @ wide), atol=atol, rtol=0)
    assert torch.allclose(older[:-2], stored[:, :-2].t() @ wide, atol=atol, rtol=0)
    assert basis.remainder_norm == pytest.approx(float(remainder.norm()), rel=atol)


def test_reorthogonalise_needs_a_cleared_vector() -> None:
    basis, _columns = _filled(20, 3)
    with pytest.raises(RuntimeError, match="follows clear_next"):
        basis.reorthogonalise()
    basis.next_row().fill_(1.0)
    basis.clear_next(whole=False)
    basis.commit(basis.remainder_norm)
    with pytest.raises(RuntimeError, match="follows clear_next"):
        basis.reorthogonalise()


@pytest.mark.parametrize("count", [1, 2, 3, MAX_BLOCK + 2])
def test_narrow_two_row_clearing_is_the_dense_float64_one(count: int) -> None:
    """A product written into a narrow basis' next row and cleared of the latest two vectors
    only (a partial Lanczos step): the coefficients are the
    float64 inner products with the two stored rows (the older ones 0), the remainder the
    widened row minus those components, its norm the measured β; the two rows are removed
    together from their wide copies, whichever blocks they lie in. The commit divides in
    float64 and rounds once, the work vector becoming the new row's wide copy."""
    basis, rows = _narrow(count, seed=4)
    product = torch.randn(NARROW, generator=torch.Generator().manual_seed(5))  # float32
    basis.next_row().copy_(product)
    remainder, coefficients = basis.clear_next(whole=False)
    wide = product.to(torch.float64)
    # the two latest rows removed together (count = 3: they lie in two blocks, of 2 and 2 rows)
    group = list(range(max(0, count - 2), count))
    expected = torch.zeros(count, dtype=torch.float64)
    expected[group] = rows[:, group].t() @ wide
    reference = wide - rows[:, group] @ expected[group]
    assert remainder.dtype == torch.float64
    assert torch.allclose(coefficients, expected, atol=1e-12, rtol=0)
    assert torch.allclose(remainder, reference, atol=1e-12, rtol=0)
    assert basis.remainder_norm == pytest.approx(float(reference.norm()), rel=1e-14)
    kept = remainder.clone()
    basis.commit(basis.remainder_norm)
    assert torch.equal(basis[-1], (kept / basis.remainder_norm).to(torch.float32))
    assert torch.equal(remainder, basis[-1].to(torch.float64))


def test_narrow_two_row_clearing_then_reorthogonalisation_clears_the_whole_basis() -> None:
    """After the fused two-row clearing, :meth:`reorthogonalise` works on the same remainder:
    it ends orthogonal to every stored row (to the float32 rows' own orthonormality, 1e-7)."""
    basis, rows = _narrow(MAX_BLOCK + 2, seed=6)
    product = torch.randn(NARROW, generator=torch.Generator().manual_seed(7))
    basis.next_row().copy_(product)
    remainder, _ = basis.clear_next(whole=False)
    basis.reorthogonalise()
    assert float((rows.t() @ remainder).abs().max()) < 1e-6 * float(product.norm())
    assert basis.remainder_norm == pytest.approx(float(remainder.norm()), rel=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_whole_vectors_gaussian_draw_is_one_float64_draw_of_p_values(
    dtype: torch.dtype,
) -> None:
    """The start vector of a whole-vector run: one float64 draw of P values from the generator
    (returned as drawn in float64, no copy), rounded to a narrower dtype when asked."""
    drawn = VectorSpace(1001).normal(torch.Generator().manual_seed(8), dtype)
    reference = torch.randn(1001, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    assert drawn.dtype == dtype
    assert torch.equal(drawn, reference.to(dtype))


@pytest.mark.parametrize("size", [1, 15, 16, 17, 1001, NARROW])
def test_a_draw_in_place_is_the_same_vector(size: int) -> None:
    """normal_into draws into memory already held the very values of a float64 torch.randn
    (Box–Muller over blocks of 16, the tail redrawn): a run's start vector does not change."""
    out = torch.full((size,), math.nan, dtype=torch.float64)
    held = out.data_ptr()
    VectorSpace(size).normal_into(out, torch.Generator().manual_seed(8))
    reference = torch.randn(size, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    assert out.data_ptr() == held and torch.equal(out, reference)


@pytest.mark.parametrize("storage", [torch.float64, torch.float32])
def test_a_start_drawn_into_the_draft_is_stored_as_the_drawn_vector_made_unit(
    storage: torch.dtype,
) -> None:
    """Lanczos' start: drawn into the basis' draft and committed by its norm, the first row is
    the float64 draw divided by its norm, rounded once to the storage dtype."""
    basis = KrylovBasis(NARROW, torch.float64, "cpu", storage=storage)
    start = basis.draft()
    basis.space.normal_into(start, torch.Generator().manual_seed(3))
    basis.commit(float(start.norm()))
    drawn = torch.randn(NARROW, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert len(basis) == 1
    assert torch.equal(basis[0], (drawn / drawn.norm()).to(storage))


def test_a_partial_step_reads_the_latest_rows_widened_and_never_widens_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A narrow basis keeps its two latest rows widened (their stored values exactly): the
    two-row clearing of a partial step projects against those float64 copies, no float32 row
    is widened for it, and the result is the dense float64 clearing against the stored rows."""
    basis, rows = _narrow(MAX_BLOCK + 3, seed=11)
    read: list[torch.dtype] = []
    project = KrylovBasis._project

    def spied(self: KrylovBasis, block: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        read.append(block.dtype)
        return project(self, block, vector)

    monkeypatch.setattr(KrylovBasis, "_project", spied)
    for step in range(4):  # the copies move on with every commit
        product = torch.randn(NARROW, generator=torch.Generator().manual_seed(20 + step))
        basis.next_row().copy_(product)
        remainder, coefficients = basis.clear_next(whole=False)
        stored = torch.stack([basis[i] for i in range(len(basis))], dim=1).to(torch.float64)
        latest = stored[:, -2:]
        wide = product.to(torch.float64)
        assert torch.allclose(coefficients[-2:], latest.t() @ wide, atol=1e-12, rtol=0)
        assert torch.allclose(remainder, wide - latest @ (latest.t() @ wide), atol=1e-12, rtol=0)
        basis.commit(basis.remainder_norm)
    assert read == [torch.float64] * 4
    assert rows.shape[1] == MAX_BLOCK + 3


def test_after_a_restart_the_clearing_uses_the_stored_rows_until_copies_are_made_again() -> None:
    """A restart moves the rows, so the wide copies are dropped: the next clearing is still the
    dense one against the stored rows, and the commits after it widen the new rows again."""
    basis, _rows = _narrow(6, seed=12)
    generator = torch.Generator().manual_seed(13)
    basis.restart(torch.linalg.qr(torch.randn(5, 3, dtype=torch.float64, generator=generator)).Q)
    assert basis._latest_wide() is None
    for step in range(3):
        stored = torch.stack([basis[i] for i in range(len(basis))], dim=1).to(torch.float64)
        vector = torch.randn(NARROW, dtype=torch.float64, generator=generator)
        remainder, coefficients = basis.extend(vector)
        scale = float(vector.norm())
        # v = Q c + r with r orthogonal to the stored rows (orthonormal to float32's precision)
        assert torch.allclose(vector, stored @ coefficients + remainder, atol=1e-12 * scale), step
        assert float((stored.t() @ remainder).abs().max()) < 1e-6 * scale
        basis.commit(float(remainder.norm()))
    assert basis._latest_wide() is not None  # two commits made the copies again
