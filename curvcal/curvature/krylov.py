"""An orthonormal Krylov basis q_1 … q_m of long vectors, kept for reorthogonalisation.

Lanczos (:mod:`curvcal.curvature.eigen`) and stochastic Lanczos quadrature
(:mod:`curvcal.curvature.density`) keep every basis vector so that each new one can be made
orthogonal to all of them: on every step (full reorthogonalisation, the density's), or only
when an estimate of the lost orthogonality asks for it (partial, Lanczos':
:mod:`curvcal.curvature.orthogonality`), the other steps clearing the new vector of the two
latest alone (``clear_next(whole=False)``, 4 rows read instead of 2m + 4). At P = 10⁷ parameters a vector is 80 MB in float64, and the
orthogonalisation, not the products, can become the cost of a run if it is written vector by
vector: a dot and an update per basis vector and pass read the new vector 5·m times per pass
and allocate as often. Here the vectors are rows of a few preallocated blocks, and a pass of
classical Gram–Schmidt is two matrix–vector products per block: c = Q_bᵀv, v ← v − Q_b c
(the blocks in turn, each against the vector already cleared of the earlier blocks). The two
latest vectors are removed first, so that one pass usually suffices; a second runs when the
DGKS test asks for it (see :meth:`KrylovBasis.extend`). One number per call is read
back to the host.

The vectors may be stored narrower than they are computed (``storage``: float32 rows for a
float64 basis). Each new vector is then cleared in one wide work vector, every dot and update
summed in the wide dtype over :data:`RESTART_COLUMNS` columns at a time (a float32 BLAS dot over
10⁷ entries loses about three digits, and Lanczos stalls on it), and rounded to the storage
dtype once, when it is committed: the basis is orthonormal to the storage dtype's precision
and holds half the memory. The two latest vectors, which every step clears against, are also
kept widened (their stored values exactly, in the wide dtype): the commit rounds the work vector
into its row and widens it back a piece at a time, in cache, and the work vector becomes the
latest vector's wide copy (the oldest copy's vector is the next work vector), so a step reads
two wide rows instead of widening two narrow ones twice (0.083 s against 0.101 s a step at
P = 13.5 M, one thread). Memory: :data:`WIDE_VECTORS` wide vectors besides the rows (the work
vector and the two copies: 2·P·8 bytes more than a work vector alone).

A basis may be given the most rows it will ever hold (``max_rows``, the row being written
included); :meth:`KrylovBasis.restart` then replaces it, in place, by a few combinations of its
vectors (a thick restart of Lanczos keeps its best Ritz vectors), so that a long run holds no
more memory than a short one.

The vectors may be each rank's slice of vectors sharded over ranks (``space``, a
:class:`~curvcal.curvature.vectors.SlicedSpace`): every inner product (Q_bᵀv, qᵀv, ‖v‖) is then
the local one summed over the ranks, one all-reduce of m values per block pass; the updates,
combinations and restarts are local.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from curvcal.curvature.operators import LinearOperator
from curvcal.curvature.vectors import VectorSpace, space_of

#: rows of the largest block; smaller blocks come first, so a short run allocates little more
#: than it uses
MAX_BLOCK = 8
#: latest vectors removed one by one before the block pass
RECENT = 2
#: wide vectors a narrow basis holds besides its rows: the work vector and the wide copies of
#: the :data:`RECENT` latest rows
WIDE_VECTORS = RECENT + 1
#: the DGKS threshold: a second pass when a pass leaves less than this share of the norm
DGKS_ETA = 2**-0.5
#: columns combined at a time by :meth:`KrylovBasis.restart` (its only scratch memory:
#: rows × this many values)
RESTART_COLUMNS = 2**16


class KrylovBasis:
    """Orthonormal vectors of length ``size``, computed in ``dtype`` on ``device`` and stored in
    ``storage`` (default: ``dtype``; a narrower one keeps :data:`WIDE_VECTORS` ``dtype`` vectors
    besides the rows: the work vector and the two latest rows widened), appended one at a time; at most ``max_rows`` rows are ever allocated (None: no
    limit). ``space`` says how inner products are summed (default: whole vectors of ``size``;
    a sliced space's ``size`` must equal ``size``)."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_rows: int | None = None,
        storage: torch.dtype | None = None,
        space: VectorSpace | None = None,
    ) -> None:
        if max_rows is not None and max_rows < 2:
            raise ValueError(f"a basis needs room for at least 2 rows, got max_rows={max_rows}")
        self.size = size
        self.space = space or VectorSpace(size)
        self.dtype = dtype
        self.storage = storage or dtype
        self.device = torch.device(device)
        self.max_rows = max_rows
        self._blocks: list[Tensor] = []
        self._count = 0
        self._capacity = 0
        # narrow storage only: WIDE_VECTORS wide vectors (allocated at the first clearing), the
        # slot of the one being cleared, and the slots holding the latest rows widened, by index
        self._wide_block: Tensor | None = None
        self._work_slot: int | None = None
        self._wide_rows: dict[int, int] = {}
        #: ‖v‖ of the vector the latest :meth:`extend` or :meth:`clear_next` cleared, after
        #: clearing (summed over the ranks of a sliced space); nan before any
        self.remainder_norm = math.nan
        self._pending: Tensor | None = None  # the vector cleared and not yet committed

    def __len__(self) -> int:
        return self._count

    @property
    def narrow(self) -> bool:
        """Whether the rows are stored narrower than they are computed."""
        return self.storage != self.dtype

    def append(self, vector: Tensor) -> None:
        """Store a copy of ``vector`` (assumed unit and orthogonal to the basis) as q_{m+1}."""
        row = self._next_row()
        row.copy_(vector)
        if self.narrow:  # its wide copy: the row's values exactly
            self._wide().copy_(row)
            self._remember(self._count)
        self._count += 1

    def extend(self, vector: Tensor) -> tuple[Tensor, Tensor]:
        """``vector`` minus its components along the basis, computed in the basis' next row:
        ``vector`` is written there (cast to the basis' dtype; the input is not modified) and
        cleared of the basis in place. Returns that row (a view: the remainder) and the
        coefficients removed (the sum over the steps of :meth:`_clear` of q_iᵀ·v, a length-m
        tensor on the basis' device). :meth:`commit` then makes it q_{m+1}; another call to
        ``extend`` overwrites it. No P-long vector is allocated: at P = 10⁷ that spares three
        vectors of 80 MB per Lanczos step (a cast, a copy, the normalised one). A narrow basis
        clears it in its wide work vector instead, and returns that."""
        if self.narrow:  # straight into the wide work vector, not rounded through a row
            self._next_row()  # room for the commit
            work = self._wide().copy_(vector)
            return work, self._clear(work)
        return self.extend_into(lambda row: row.copy_(vector))

    def extend_into(self, write: Callable[[Tensor], object]) -> tuple[Tensor, Tensor]:
        """As :meth:`extend`, with the vector written into the basis' next row by ``write(row)``
        (a product computed in place), so that no P-long vector at all is made for it: the
        same as ``write(basis.next_row())`` then :meth:`clear_next`."""
        write(self._next_row())
        return self.clear_next()

    def draft(self) -> Tensor:
        """The wide vector the next row is made from — a narrow basis' work vector, else the
        next row itself — for a vector written there and kept by :meth:`commit` (divided by
        its norm): a run's start vector, drawn in place rather than drawn and copied in."""
        row = self._next_row()  # room for the commit
        return self._wide() if self.narrow else row

    def next_row(self) -> Tensor:
        """The row q_{m+1} goes to, for a product to be written into (then :meth:`clear_next`)."""
        return self._next_row()

    def clear_next(self, whole: bool = True) -> tuple[Tensor, Tensor]:
        """What was written into :meth:`next_row`, cleared of the basis in place: the remainder
        and the coefficients removed, as :meth:`extend` returns them. ``whole=False`` clears it
        of the latest :data:`RECENT` vectors only (a Lanczos step's α q_m + β q_{m−1}; the other
        coefficients are 0): :meth:`reorthogonalise` then clears it of the whole basis when
        the caller's estimate of the lost orthogonality asks for it."""
        row = self._next_row()
        if self.narrow:  # cleared in the wide work vector, stored by commit
            row = self._wide().copy_(row)
        return row, self._clear(row, whole)

    def reorthogonalise(self) -> Tensor:
        """Clear the vector the latest :meth:`clear_next` cleared (before its :meth:`commit`)
        of the whole basis, in place: one block pass, a second when the DGKS test asks for it;
        :attr:`remainder_norm` becomes its norm. Returns the coefficients removed by this call
        (length m)."""
        if self._pending is None:
            raise RuntimeError("reorthogonalise follows clear_next and precedes commit")
        coefficients = torch.zeros(self._count, dtype=self.dtype, device=self.device)
        self.remainder_norm = self._whole_passes(self._pending, coefficients, self.remainder_norm)
        return coefficients

    def latest(self, buffer: Tensor | None = None) -> Tensor:
        """q_m, the latest vector (a view), or copied into ``buffer`` (another dtype) when given."""
        return self[-1] if buffer is None else buffer.copy_(self[-1])

    def _wide(self) -> Tensor:
        """The work vector a narrow basis clears new vectors in: a wide vector that holds no
        latest row's copy (the :data:`WIDE_VECTORS` of them allocated once)."""
        if self._wide_block is None:
            self._wide_block = torch.empty(
                WIDE_VECTORS, self.size, dtype=self.dtype, device=self.device
            )
        if self._work_slot is None:
            held = set(self._wide_rows.values())
            self._work_slot = next(s for s in range(WIDE_VECTORS) if s not in held)
        return self._wide_block[self._work_slot]

    def _remember(self, index: int) -> None:
        """The work vector now holds row ``index`` widened: it becomes that row's wide copy, and
        the copies of rows older than the :data:`RECENT` latest are released."""
        assert self._work_slot is not None
        self._wide_rows[index] = self._work_slot
        self._work_slot = None
        for older in [i for i in self._wide_rows if i <= index - RECENT]:
            del self._wide_rows[older]

    def _latest_wide(self) -> tuple[list[int], Tensor] | None:
        """The indices of the :data:`RECENT` latest rows and a view of their wide copies (in the
        order of their slots, which the indices follow), or None when one has no copy (a wide
        basis, or right after a restart)."""
        latest = range(max(0, self._count - RECENT), self._count)
        if not latest or self._wide_block is None:
            return None
        if not all(i in self._wide_rows for i in latest):
            return None
        order = sorted(latest, key=self._wide_rows.__getitem__)
        slots = [self._wide_rows[i] for i in order]
        first = slots[0]
        step = slots[-1] - first if len(slots) > 1 else 1
        return order, self._wide_block[first : slots[-1] + 1 : step]

    def commit(self, norm: float) -> None:
        """Divide the vector cleared by :meth:`extend` by ``norm`` and keep it as q_{m+1} (in a
        narrow basis the work vector :meth:`extend` returned then holds q_{m+1} widened: the
        remainder is not kept)."""
        self._pending = None
        if self.narrow:
            assert self._work_slot is not None, "commit follows extend"
            # divided in float64 and rounded once, as the row is written, then widened back:
            # the work vector becomes the row's wide copy. A piece at a time, so that the
            # rounding and widening run in cache — the same arithmetic as a mixed-dtype
            # ``torch.div(work, norm, out=row)``, which is not vectorised (0.055 s against
            # 0.02 s at P = 13.5 M, one thread)
            work = self._wide()
            row = self._next_row()
            for begin in range(0, self.size, RESTART_COLUMNS):
                end = min(begin + RESTART_COLUMNS, self.size)
                piece = work[begin:end].div_(norm)
                row[begin:end].copy_(piece)
                piece.copy_(row[begin:end])
            self._remember(self._count)
        else:
            self._next_row().div_(norm)
        self._count += 1

    def _next_row(self) -> Tensor:
        """The row q_{m+1} goes to, allocating a block when the blocks are full."""
        if self._count == self._capacity:
            rows = min(MAX_BLOCK, max(2, self._count))
            if self.max_rows is not None:
                rows = min(rows, self.max_rows - self._capacity)
                if rows < 1:
                    raise RuntimeError(
                        f"the basis is full ({self.max_rows} rows): restart it before extending"
                    )
            self._blocks.append(
                torch.empty(rows, self.size, dtype=self.storage, device=self.device)
            )
            self._capacity += rows
        block, row = self._locate(self._count)
        return self._blocks[block][row]

    def __getitem__(self, index: int) -> Tensor:
        """q_{index+1} (negative indices count from the end), a view: do not modify it."""
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(f"basis index {index} out of range for {self._count} vectors")
        block, row = self._locate(index)
        return self._blocks[block][row]

    def _clear(self, vector: Tensor, whole: bool = True) -> Tensor:
        """Remove the basis from ``vector`` in place; the coefficients removed.

        First the latest :data:`RECENT` vectors, which hold nearly all of a Lanczos image's
        component along the basis (α q_m + β q_{m−1}); then, when ``whole``, the whole basis
        (:meth:`_whole_passes`)."""
        coefficients = torch.zeros(self._count, dtype=self.dtype, device=self.device)
        latest = self._latest_wide()
        if latest is not None:  # their wide copies, together: one sweep of the vector
            indices, rows = latest
            amounts = self._project(rows, vector)
            self._subtract(vector, rows, amounts)
            coefficients[indices] += amounts
        # else the latest rows of each block they lie in at once (one sweep of the vector per
        # block, not one per row: the two rows are orthonormal, so removing them together or in
        # turn differs by rounding, which a later pass or the caller's estimate accounts for)
        index = self._count if latest is not None else max(0, self._count - RECENT)
        while index < self._count:
            block, row = self._locate(index)
            # at most the rows left, and never past the end of the block
            rows = self._blocks[block][row : row + self._count - index]
            amounts = self._project(rows, vector)
            self._subtract(vector, rows, amounts)
            coefficients[index : index + rows.shape[0]] += amounts
            index += rows.shape[0]
        norm = float(self.space.norm(vector))
        if whole:
            norm = self._whole_passes(vector, coefficients, norm)
        # read by the caller as the new vector's norm (β of Lanczos): no sweep over it again
        self.remainder_norm = norm
        self._pending = vector
        return coefficients

    def _whole_passes(self, vector: Tensor, coefficients: Tensor, before: float) -> float:
        """One block Gram–Schmidt pass over the whole basis, a second only if that pass removed
        more than 1 − η of the norm ``before`` it, η = 1/√2 (the DGKS test: a pass that keeps
        more leaves the vector orthogonal to working precision; Daniel, Gragg, Kaufman &
        Stewart 1976); the norm after."""
        self._pass(vector, coefficients)
        after = float(self.space.norm(vector))
        if after < DGKS_ETA * before:
            self._pass(vector, coefficients)
            after = float(self.space.norm(vector))
        return after

    def _pass(self, vector: Tensor, coefficients: Tensor) -> None:
        """One block Gram–Schmidt pass, in place: per block c = Q_b·v, v ← v − Q_bᵀc."""
        start = 0
        for rows in self._filled():
            amounts = self._project(rows, vector)
            self._subtract(vector, rows, amounts)
            coefficients[start : start + rows.shape[0]] += amounts
            start += rows.shape[0]

    def _project(self, rows: Tensor, vector: Tensor) -> Tensor:
        """Q_b·v in the basis' dtype (narrow rows widened :data:`RESTART_COLUMNS` at a time)."""
        if rows.dtype == self.dtype:
            return self.space.project(rows, vector)
        amounts = torch.zeros(rows.shape[0], dtype=self.dtype, device=self.device)
        for begin in range(0, self.size, RESTART_COLUMNS):
            end = min(begin + RESTART_COLUMNS, self.size)
            amounts.addmv_(rows[:, begin:end].to(self.dtype), vector[begin:end])
        return self.space.reduce(amounts)

    def _subtract(self, vector: Tensor, rows: Tensor, amounts: Tensor) -> None:
        """v ← v − Q_bᵀc in place, in the basis' dtype."""
        if rows.dtype == self.dtype:
            vector.addmv_(rows.t(), amounts, alpha=-1.0)
            return
        for begin in range(0, self.size, RESTART_COLUMNS):
            end = min(begin + RESTART_COLUMNS, self.size)
            vector[begin:end].addmv_(rows[:, begin:end].t().to(self.dtype), amounts, alpha=-1.0)

    def combine(self, coefficients: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Σ_i q_i c_iᵀ: the size × k matrix Q_n C of an n × k ``coefficients`` matrix, n ≤ m
        (the first n basis vectors), summed in the basis' dtype and returned in ``dtype``
        (default: the basis'). Computed :data:`RESTART_COLUMNS` entries at a time, so a result
        in a narrower dtype costs no wide copy of it."""
        count = coefficients.shape[0]
        if count > self._count:
            raise ValueError(f"{count} coefficients for a basis of {self._count} vectors")
        coefficients = coefficients.to(device=self.device, dtype=self.dtype)
        result = torch.empty(
            self.size, coefficients.shape[1], dtype=dtype or self.dtype, device=self.device
        )
        for begin, end, part in self._combined(count, coefficients):
            result[begin:end].copy_(part)
        return result

    def _combined(self, count: int, coefficients: Tensor) -> Iterator[tuple[int, int, Tensor]]:
        """(begin, end, Σ_i q_i[begin:end] c_iᵀ) over :data:`RESTART_COLUMNS` entries at a time,
        the first ``count`` vectors combined by the rows of ``coefficients`` (count × l, in the
        basis' dtype), summed in the basis' dtype in one scratch piece of RESTART_COLUMNS × l
        values: each piece is complete before it is handed out, so the caller may overwrite
        those entries of the basis (:meth:`restart`)."""
        blocks = self._leading(count, coefficients)
        scratch = torch.empty(
            min(RESTART_COLUMNS, self.size),
            coefficients.shape[1],
            dtype=self.dtype,
            device=self.device,
        )
        # narrow rows widened into one scratch of MAX_BLOCK pieces, not a new tensor per block
        widened = (
            torch.empty(
                MAX_BLOCK, min(RESTART_COLUMNS, self.size), dtype=self.dtype, device=self.device
            )
            if self.narrow
            else None
        )
        for begin in range(0, self.size, RESTART_COLUMNS):
            end = min(begin + RESTART_COLUMNS, self.size)
            part = scratch[: end - begin].zero_()
            for rows, share in blocks:
                piece = rows[:, begin:end]
                if widened is not None:
                    piece = widened[: piece.shape[0], : end - begin].copy_(piece)
                part.addmm_(piece.t(), share)
            yield begin, end, part

    def _leading(self, count: int, coefficients: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The first ``count`` rows, block by block, each with its rows of ``coefficients``."""
        blocks = []
        start = 0
        for rows in self._filled():
            if start >= count:
                break
            rows = rows[: count - start]
            blocks.append((rows, coefficients[start : start + rows.shape[0]]))
            start += rows.shape[0]
        return blocks

    def restart(self, coefficients: Tensor) -> None:
        """Replace q_1 … q_m, in place, by y_j = Σ_{i≤n} q_i c_ij (j = 1 … l) followed by q_m:
        the basis becomes y_1, …, y_l, q_m (l + 1 vectors), for an n × l ``coefficients``
        matrix with n < m and l < m. With orthonormal columns c_j and q_m orthogonal to the
        first n vectors, the new basis is orthonormal too (a thick restart: the y_j are Ritz
        vectors, q_m the latest Lanczos vector). Computed a few thousand columns at a time, so
        the scratch memory is l × :data:`RESTART_COLUMNS` values, never a vector of ``size``."""
        count, kept = coefficients.shape
        if not (count < self._count and kept < self._count):
            raise ValueError(
                f"a {count} × {kept} restart of a basis of {self._count} vectors: both must be "
                f"fewer than the vectors held"
            )
        coefficients = coefficients.to(device=self.device, dtype=self.dtype)
        latest = self[-1]
        target = self[kept]
        for begin, end, part in self._combined(count, coefficients):
            for index in range(kept):
                self[index][begin:end].copy_(part[:, index])
            target[begin:end].copy_(latest[begin:end])
        self._count = kept + 1
        self._wide_rows.clear()  # the rows moved: the next commits make the copies again

    def _filled(self) -> Iterator[Tensor]:
        """The blocks, each cut to the rows written so far."""
        left = self._count
        for block in self._blocks:
            if left <= 0:
                return
            yield block[: min(left, block.shape[0])]
            left -= block.shape[0]

    def _locate(self, index: int) -> tuple[int, int]:
        for number, block in enumerate(self._blocks):
            if index < block.shape[0]:
                return number, index
            index -= block.shape[0]
        raise IndexError(index)


def basis_storage(dtype: torch.dtype) -> torch.dtype:
    """The dtype a float64 Krylov basis stores its rows in for products in ``dtype``: float32
    for float32 products (their rounding is above float32's representation error), float64
    otherwise. (Float64 rows where the memory budget holds them were tried: a sweep of the
    orthogonalisation costs less without the piecewise widening, but every product then writes
    and scales a float64 row, and a whole λ1 run on ResNet-18 took 4–5 % longer:
    bench_overhead.py.)"""
    return torch.float32 if dtype == torch.float32 else torch.float64


def operator_basis(
    op: LinearOperator, max_rows: int | None = None
) -> tuple[KrylovBasis, Tensor | None]:
    """A float64 basis for Lanczos on ``op`` (rows in :func:`basis_storage` of its dtype, at
    most ``max_rows``) and the buffer in the operator's dtype that q_m is copied into for a
    product when the rows are stored in another (None: the stored row itself is multiplied).
    A step is then ``product(basis.latest(buffer), basis.next_row())`` — A·q_m straight into the
    next row, ``product`` from :func:`~curvcal.curvature.operators.product_into` — and
    :meth:`KrylovBasis.clear_next`."""
    space = space_of(op)
    n_params = space.size  # this rank's slice when the vectors are sliced
    storage = basis_storage(op.dtype)
    basis = KrylovBasis(
        n_params, torch.float64, op.device, max_rows=max_rows, storage=storage, space=space
    )
    if op.dtype == storage:
        return basis, None
    return basis, torch.empty(n_params, dtype=op.dtype, device=op.device)
