"""Venn–Abers at scale: the corner-only hull pass against the plain stack pass and against
scikit-learn, and the chunked passes over N×K scores against whole-array references."""

from __future__ import annotations

from array import array

import numpy as np
import torch

from curvcal.calibration.univariate import fit_nll
from curvcal.calibration.venn_abers import (
    CHUNK_ELEMENTS,
    _lower_hull_links,
    _stack_links,
    fit_venn_abers,
    gap_values,
)
from tests.calibration.test_map_venn_abers import brute_force, hidden_style


def test_corner_pass_gives_every_link_of_the_stack_pass_over_all_points() -> None:
    """Diagrams with long flat runs (few positives, as one class of many), ties (weights above
    1, groups partly positive) and dense rises: the links from the corners-only pass and its
    tangent searches equal those of one stack pass over every point, in both directions."""
    rng = np.random.default_rng(3)
    for _ in range(400):
        m = int(rng.integers(1, 300))
        weights = rng.integers(1, 4, m)
        rate = rng.choice([0.005, 0.05, 0.5, 0.95])
        positives = np.minimum(weights, rng.binomial(weights, rate))
        x = np.concatenate([[0], np.cumsum(weights)]).astype(np.float64)
        y = np.concatenate([[0], np.cumsum(positives)]).astype(np.float64)
        for reverse in (False, True):
            np.testing.assert_array_equal(
                _lower_hull_links(x, y, reverse), _stack_links(x, y, reverse)
            )


def test_gap_values_with_few_positives_match_scikit_learn() -> None:
    """200 distinct scores, 4 of them positive (long flat runs between few corners)."""
    rng = np.random.default_rng(5)
    s = rng.permutation(200).astype(np.float64)
    y = np.zeros(200)
    y[rng.choice(200, 4, replace=False)] = 1.0
    p0, p1 = gap_values(np.ones(200), y[np.argsort(s)])
    gaps = np.concatenate([[-1.0], np.arange(199) + 0.5, [200.0]])
    ref0, ref1, _ = brute_force(s, y, gaps)
    np.testing.assert_allclose(p0, ref0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p1, ref1, rtol=0, atol=1e-12)


def test_row_chunks_change_no_number() -> None:
    """A fit split several row chunks long: applying the map to all rows at once equals
    applying it to each row alone, and the fit record's in-sample NLL and widths are those of
    the whole-array formulas (fit_nll of the mapped rows, p1 − p0 of the intervals)."""
    k = 50
    n = 3 * CHUNK_ELEMENTS // k + 17
    z, labels = hidden_style(n, k, 2.0, seed=4, saturated=40)
    logits, y = torch.from_numpy(z), torch.from_numpy(labels)
    fit = fit_venn_abers(logits, y)
    mapped = fit.calibrator.apply(logits)
    for row in np.random.default_rng(0).choice(n, 20, replace=False):
        assert torch.equal(fit.calibrator.apply(logits[row : row + 1]), mapped[row : row + 1])
    assert torch.equal(fit.calibrator.probabilities(logits), torch.exp(mapped))
    assert fit.nll_after == fit_nll(mapped, y)
    low, high = fit.calibrator.intervals(torch.log_softmax(logits, 1))
    assert fit.width_mean == float((high - low).mean())
    assert fit.width_max == float((high - low).max())


def test_map_rows_are_float64_arrays_and_round_trip() -> None:
    """The rows are kept as array("d") (8 bytes a number); a map given tuples of floats is
    still checked and applies the same."""
    z, labels = hidden_style(500, 5, 2.0, seed=2)
    fitted = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(labels)).calibrator
    assert all(isinstance(row, array) and row.typecode == "d" for row in fitted.c)
    as_tuples = type(fitted)(
        fitted.n_classes,
        tuple(tuple(row) for row in fitted.c),
        tuple(tuple(row) for row in fitted.p0),
        tuple(tuple(row) for row in fitted.p1),
    )
    assert as_tuples.to_dict() == fitted.to_dict()
    assert torch.equal(as_tuples.apply(torch.from_numpy(z)), fitted.apply(torch.from_numpy(z)))
