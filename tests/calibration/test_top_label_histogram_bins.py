"""The top-label histogram's bin lookup by cells (:func:`cell_bin_of`) against the bins as
defined, the number of inner edges strictly below each score (``numpy.searchsorted`` with
``side="left"``: an edge value goes to the lower bin): equal-width and equal-mass edges, scores
at, just below and just above every edge, 0, −0.0, 1, above 1 and 2, subnormals, edges closer
than a cell (tied fit scores), one bin, and the scores that go to the search for every score
(negative, above 2, NaN); and the fitted top-label histogram map against its values looked up
that way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration import binning
from curvcal.calibration.binning import cell_bin_of, fit_histogram, histogram_edges
from curvcal.calibration.univariate import top_label_map
from tests.calibration.lookup_paths import cell_path_at_every_size as every_size

#: each test twice: the cell lookup at every size, and as shipped
cell_path_at_every_size = every_size(binning, "FEW_BIN_SCORES")


def defined_bins(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.searchsorted(edges[1:-1], x, side="left")


def probes(rng: np.random.Generator, x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    special = [0.0, -0.0, 1.0, np.nextafter(1.0, 2.0), 1.5, 2.0, 5e-324, 1e-310]
    around = [edges, np.nextafter(edges, 0.0), np.nextafter(edges, 2.0)]
    return np.concatenate([x, *around, special, rng.random(500)])


@pytest.mark.parametrize("scheme", ["equal-width", "equal-mass"])
@pytest.mark.parametrize("n_bins", [1, 2, 15, 37, 200])
def test_cell_bins_are_the_bins_as_defined(scheme: str, n_bins: int) -> None:
    rng = np.random.default_rng(n_bins)
    x = np.concatenate([rng.random(3000) ** 4, 1 - rng.random(1000) ** 8])
    edges = histogram_edges(x, n_bins, scheme)
    scores = probes(rng, x, edges)
    np.testing.assert_array_equal(cell_bin_of(scores, edges), defined_bins(scores, edges))


def test_edges_closer_than_a_cell() -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate([np.repeat(0.3 + np.arange(30) * 1e-12, 50), rng.random(500)])
    edges = histogram_edges(x, 40, "equal-mass")
    assert np.diff(edges).min() < 1e-11  # several edges in one cell
    scores = probes(rng, x, edges)
    np.testing.assert_array_equal(cell_bin_of(scores, edges), defined_bins(scores, edges))


def test_scores_outside_zero_to_two_are_searched() -> None:
    edges = np.array([0.0, 0.25, 0.5, 1.0])
    scores = np.array([0.25, -1.0, 2.5, np.inf, 0.75, np.nan])
    got = cell_bin_of(scores, edges)
    np.testing.assert_array_equal(got[:5], defined_bins(scores[:5], edges))
    assert cell_bin_of(np.zeros(0), edges).shape == (0,)


def test_fitted_top_label_histogram_applies_its_values_by_the_defined_bins() -> None:
    rng = np.random.default_rng(8)
    logits = torch.from_numpy(rng.normal(size=(3000, 9)) * 3)
    labels = torch.from_numpy(rng.integers(0, 9, size=3000))
    for scheme in ("equal-width", "equal-mass"):
        fitted = fit_histogram(logits, labels, "histogram", n_bins=15, scheme=scheme)
        edges = np.array(fitted.calibrator.edges[0])
        values = np.array(fitted.calibrator.values[0])
        new_logits = torch.from_numpy(rng.normal(size=(800, 9)) * 4)
        expected = top_label_map(
            torch.log_softmax(new_logits, dim=1),
            lambda c, v=values, e=edges: v[defined_bins(c, e)],
        )
        assert torch.equal(fitted.calibrator.apply(new_logits), expected)
