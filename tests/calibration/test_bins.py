"""Equal-width and equal-mass binning: edge side, ties, weights, order."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from curvcal.calibration.bins import equal_mass_index, equal_width_edges, equal_width_index

F64 = torch.float64


def test_left_edges_send_an_edge_value_to_the_lower_bin() -> None:
    c = torch.tensor([0.0, 0.25, 0.5, 0.5000001, 0.75, 1.0], dtype=F64)
    assert equal_width_index(c, 4, "left").tolist() == [0, 0, 1, 2, 2, 3]


def test_right_edges_send_an_edge_value_to_the_upper_bin() -> None:
    c = torch.tensor([0.0, 0.25, 0.5, 0.4999999, 0.75, 1.0], dtype=F64)
    assert equal_width_index(c, 4, "right").tolist() == [0, 1, 2, 1, 3, 3]


def test_edges_are_uniform() -> None:
    assert equal_width_edges(4).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_one_bin_holds_everything() -> None:
    c = torch.tensor([0.0, 0.3, 1.0], dtype=F64)
    assert equal_width_index(c, 1).tolist() == [0, 0, 0]
    assert equal_mass_index(c, 1).tolist() == [0, 0, 0]


def test_equal_mass_splits_evenly_without_ties() -> None:
    c = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.7, 0.2], dtype=F64)
    # sorted: .1 .2 .3 .5 .7 .9, cuts at 2 and 4
    assert equal_mass_index(c, 3).tolist() == [2, 0, 1, 1, 2, 0]


def test_equal_mass_moves_cuts_to_the_end_of_a_tie_group() -> None:
    c = torch.tensor([0.6, 0.9, 0.6, 0.6, 0.9, 0.6], dtype=F64)
    # cuts at 2 and 4 both move to 4 (end of the 0.6 group); bin 1 is empty
    assert equal_mass_index(c, 3).tolist() == [0, 2, 0, 0, 2, 0]


def test_equal_mass_all_ties_is_one_bin() -> None:
    c = torch.full((7,), 0.4, dtype=F64)
    assert set(equal_mass_index(c, 5).tolist()) == {0}


def test_equal_mass_fewer_samples_than_bins() -> None:
    c = torch.tensor([0.3, 0.8], dtype=F64)
    index = equal_mass_index(c, 15)
    assert index[0] < index[1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=40),
    st.lists(st.integers(0, 3), min_size=40, max_size=40),
    st.integers(1, 8),
)
def test_weights_equal_repetition(levels: list[int], counts: list[int], n_bins: int) -> None:
    """A weighted sample bins exactly like the sample with each value repeated w times."""
    values = torch.tensor(levels, dtype=F64) / 6
    weights = torch.tensor(counts[: len(levels)], dtype=F64)
    if weights.sum() == 0:
        weights[0] = 1
    repeats = weights.to(torch.int64)
    repeated = values.repeat_interleave(repeats)
    weighted = equal_mass_index(values, n_bins, weights=weights)
    plain = equal_mass_index(repeated, n_bins)
    # Tie groups never straddle bins, so each distinct value has one bin in each result.
    by_value = {
        float(v): int(b) for v, b, r in zip(values, weighted, repeats, strict=True) if r > 0
    }
    assert by_value == {float(v): int(b) for v, b in zip(repeated, plain, strict=True)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=50), st.integers(1, 10), st.randoms())
def test_equal_mass_depends_only_on_values(levels: list[int], n_bins: int, rnd: object) -> None:
    values = torch.tensor(levels, dtype=F64) / 5
    perm = torch.randperm(len(levels), generator=torch.Generator().manual_seed(len(levels)))
    assert (
        equal_mass_index(values, n_bins)[perm].tolist()
        == equal_mass_index(values[perm], n_bins).tolist()
    )
