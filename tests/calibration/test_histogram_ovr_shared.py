"""The one-vs-rest histogram's work shared across classes, against the per-class kernels it
replaced (themselves tested against the definitions in test_one_vs_rest_vectorised.py):

* :func:`sorted_equal_mass_cuts` (all classes' equal-mass cuts from the sorted K×N columns,
  reading only a window of neighbours after each cut) against :func:`sorted_equal_mass_edges`
  row by row, with tie groups longer than the window, near-ties, zeros and a subnormal, and
  more bins than fit in one block;
* the step table (each class's bins found from one cell index of all classes' edges) against
  ``torch.bucketize`` (:func:`bin_of`) per class, bit for bit, at the edges themselves and at
  their float neighbours;
* the applied map against f_k(p_k) / Σ_j f_j from :func:`bin_of` and the saved values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration import binning
from curvcal.calibration.binning import (
    TIE_WINDOW,
    _bins_among,
    bin_of,
    fit_histogram,
    sorted_equal_mass_cuts,
    sorted_equal_mass_edges,
)
from curvcal.calibration.isotonic import knot_segments, step_table


def tied_columns(n_rows: int, n: int, seed: int) -> np.ndarray:
    """Sorted rows of scores in [0, 1] with exact ties longer than the window at the cuts,
    runs a few roundings apart, exact zeros and a subnormal."""
    rng = np.random.default_rng(seed)
    rows = rng.uniform(0.0, 1.0, (n_rows, n)) ** 3
    rows[0, : n // 2] = 0.0  # half the row zero: the first cuts fall in one tie group
    long = min(3 * TIE_WINDOW, n // 2)  # a tie group longer than the window, across n/4
    rows[1] = np.concatenate(
        [
            rng.uniform(0.0, 0.2, n // 4 - 5),
            np.full(long, 0.25),
            rng.uniform(0.3, 1.0, n - n // 4 + 5 - long),
        ]
    )
    base = 0.5
    near = min(4 * TIE_WINDOW, n)
    rows[2, :near] = base + np.arange(near) % 5 * np.spacing(base)
    rows[3, :3] = 0.0
    rows[3, 3] = np.nextafter(0.0, 1.0)  # no float edge between 0 and it
    rows[4] = np.round(rows[4] * 8) / 8  # few values, many ties
    rows.sort(axis=1)
    return rows


@pytest.mark.parametrize(("n", "n_bins"), [(500, 15), (2000, 7), (400, 400), (60, 1)])
def test_equal_mass_cuts_of_all_rows_are_the_per_row_edges(n: int, n_bins: int) -> None:
    columns = tied_columns(6, n, seed=n + n_bins)
    cuts, inner, kept = sorted_equal_mass_cuts(columns, n_bins)
    for row, ranked in enumerate(columns):
        expected = sorted_equal_mass_edges(ranked, n_bins)
        edges = np.concatenate([[0.0], inner[row, kept[row]], [1.0]])
        np.testing.assert_array_equal(edges, expected)
        # the bins hold the scores between the cuts: searchsorted of the edges
        counts = np.diff(cuts[row, kept[row]], prepend=0, append=n)
        at = np.searchsorted(ranked, expected[1:-1], side="right")
        np.testing.assert_array_equal(counts, np.diff(at, prepend=0, append=n))


def test_long_tie_groups_are_exercised() -> None:
    """The data above has tie groups at a cut longer than the window (the per-row path)."""
    columns = tied_columns(6, 500, seed=1)
    group = np.flatnonzero(columns[1] == 0.25)
    assert len(group) > TIE_WINDOW and group[0] < 500 // 4 <= group[-1]
    cuts, _, _ = sorted_equal_mass_cuts(columns, 4)
    assert cuts[1, 0] == group[-1] + 1  # moved past the whole group


def test_equal_mass_cuts_in_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    columns = tied_columns(6, 300, seed=3)
    whole = sorted_equal_mass_cuts(columns, 15)
    monkeypatch.setattr(binning, "COMPARE_ELEMENTS", 50)  # one row per block
    for got, expected in zip(sorted_equal_mass_cuts(columns, 15), whole, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_bins_among_rows_of_edges_is_bin_of() -> None:
    rng = np.random.default_rng(4)
    inner = np.sort(rng.uniform(0, 1, (50, 9)), axis=1)
    kept = rng.uniform(0, 1, (50, 9)) < 0.7
    x = np.concatenate([rng.uniform(0, 1, 50), inner[:, 3], np.zeros(50), np.ones(50)])
    rows = np.tile(np.arange(50), 4)
    got = _bins_among(x, inner[rows], kept[rows])
    expected = [bin_of(x[i : i + 1], np.r_[0, inner[r, kept[r]], 1])[0] for i, r in enumerate(rows)]
    np.testing.assert_array_equal(got, expected)


def test_step_table_finds_the_bins_of_bin_of_at_and_beside_every_edge() -> None:
    rng = np.random.default_rng(6)
    edges = [
        np.r_[0.0, np.sort(rng.uniform(0, 1, 14)), 1.0],
        np.r_[0.0, 1e-300, 2e-300, 0.5, 1.0],  # edges in the subnormal-adjacent range
        np.array([0.0, 1.0]),  # one bin: no inner edge
        np.r_[0.0, np.sort(rng.uniform(0, 1e-6, 20)), 0.999, 1.0],  # many edges in one place
    ]
    values = [rng.uniform(0, 1, len(e) - 1) for e in edges]
    table = step_table([np.nextafter(e[1:-1], np.inf) for e in edges], values)
    probes = np.unique(
        np.concatenate(
            [np.concatenate([e, np.nextafter(e, 0.0), np.nextafter(e, 2.0)]) for e in edges]
            + [rng.uniform(0, 1, 2000), rng.uniform(0, 1e-6, 2000), [0.0, 5e-324, 1.0]]
        )
    )
    probes = probes[(probes >= 0) & (probes <= 1)]
    p = np.ascontiguousarray(np.repeat(probes[:, None], len(edges), axis=1))
    got = np.take(table.value, knot_segments(table, p))
    for k, (row_edges, row_values) in enumerate(zip(edges, values, strict=True)):
        np.testing.assert_array_equal(got[:, k], row_values[bin_of(probes, row_edges)])


@pytest.mark.parametrize("scheme", ["equal-mass", "equal-width"])
def test_applied_one_vs_rest_histogram_is_the_renormalised_bin_values(scheme: str) -> None:
    rng = np.random.default_rng(8)
    z = torch.tensor(rng.standard_normal((3000, 40)) * 4)
    z[:300] = torch.round(z[:300])  # ties
    y = torch.tensor(rng.integers(0, 40, 3000))
    fit = fit_histogram(z, y, "histogram-ovr", n_bins=12, scheme=scheme)
    p = torch.softmax(z, dim=1).numpy()
    lp = torch.log_softmax(z, dim=1)
    p = torch.exp(lp).numpy()  # curvcal's p
    f = np.stack(
        [
            np.asarray(fit.calibrator.values[j])[
                bin_of(p[:, j], np.asarray(fit.calibrator.edges[j]))
            ]
            for j in range(40)
        ],
        axis=1,
    )
    with np.errstate(divide="ignore"):
        expected = np.log(f) - np.log(f.sum(axis=1, keepdims=True))
    got = fit.calibrator.apply(z).numpy()
    np.testing.assert_array_equal(np.isneginf(got), f == 0)
    finite = f > 0
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-14, atol=1e-14)
    assert fit.nll_after == pytest.approx(float(-got[np.arange(3000), y.numpy()].mean()), rel=1e-14)
