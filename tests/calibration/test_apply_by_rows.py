"""A per-row map's apply checks and converts the scores chunk by chunk as it maps them (no N×K
float64 copy beside the result): the same calibrated rows as mapping the whole
log-probabilities, and a faulty row named exactly as the whole-input check names it, for the
chunk sizes of every map (one-vs-rest chunks span several check chunks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvcal.calibration.binning import fit_histogram
from curvcal.calibration.inputs import chunk_rows, log_probabilities
from curvcal.calibration.isotonic import fit_isotonic
from curvcal.calibration.univariate import ONE_VS_REST_CHUNK, by_rows, map_chunk_rows
from curvcal.errors import InputError

N, K = 5000, 40  # 1,638 rows per check chunk, 3,276 per one-vs-rest chunk


def maps() -> list:
    rng = np.random.default_rng(2)
    z = torch.tensor(rng.standard_normal((N, K)) * 3)
    y = torch.tensor(rng.integers(0, K, N))
    return [
        fit_histogram(z, y, "histogram-ovr").calibrator,
        fit_histogram(z, y, "histogram").calibrator,
        fit_isotonic(z, y, "isotonic-ovr").calibrator,
        fit_isotonic(z, y, "isotonic").calibrator,
    ]


def test_one_vs_rest_chunks_span_several_check_chunks() -> None:
    step = map_chunk_rows(K, ONE_VS_REST_CHUNK)
    assert step % chunk_rows(K) == 0 and step > chunk_rows(K) and step < N


@pytest.mark.parametrize("kind", ["logits", "probs", "logprobs"])
def test_apply_is_the_map_of_the_whole_log_probabilities(kind: str) -> None:
    rng = np.random.default_rng(3)
    z = torch.tensor(rng.standard_normal((N, K)) * 3)
    scores = {"logits": z, "probs": torch.softmax(z, 1), "logprobs": torch.log_softmax(z, 1)}
    for fitted in maps():
        got = fitted.apply(scores[kind], kind)
        expected = by_rows(log_probabilities(scores[kind], kind), fitted._map_rows, fitted._chunk)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("kind", ["logits", "probs"])
@pytest.mark.parametrize("row", [0, 1700, 4999])
def test_a_faulty_row_is_named_as_the_whole_input_check_names_it(kind: str, row: int) -> None:
    rng = np.random.default_rng(4)
    z = torch.tensor(rng.standard_normal((N, K)))
    scores = z if kind == "logits" else torch.softmax(z, 1)
    scores[row, 3] = float("nan") if kind == "logits" else 0.7  # NaN; a row summing to 1.7
    with pytest.raises(InputError) as whole:
        log_probabilities(scores, kind, "ev.npz")
    for fitted in maps():
        with pytest.raises(InputError) as applied:
            fitted.apply(scores, kind, "ev.npz")
        assert str(applied.value) == str(whole.value)


def test_another_number_of_classes_is_refused_before_any_work() -> None:
    for fitted in maps():
        with pytest.raises(InputError, match=r"has 41 classes but the .* map has 40"):
            fitted.apply(torch.full((10, K + 1), float("nan")), "logits", "ev.npz")


def test_probabilities_are_the_exponential_of_apply_taken_by_chunks() -> None:
    """The per-row maps' probabilities (exp taken chunk by chunk as the map writes, exp(−∞)
    written as 0) are exp of their log-probabilities bit for bit, BBQ's too."""
    from curvcal.calibration.bbq import fit_bbq

    rng = np.random.default_rng(5)
    z = torch.tensor(rng.standard_normal((N, K)) * 3)
    z[:50] *= 300  # saturated rows: probabilities 0 (log −∞)
    y = torch.tensor(rng.integers(0, K, N))
    for fitted in [*maps(), fit_bbq(z, y).calibrator]:
        for kind, scores in (("logits", z), ("probs", torch.softmax(z, 1))):
            expected = torch.exp(fitted.apply(scores, kind))
            assert torch.equal(fitted.probabilities(scores, kind), expected)


def test_in_sample_nll_of_the_top_label_maps_is_that_of_their_rows() -> None:
    """The fit's NLL after the map keeps only each chunk's q_y: the mean −log q_y of the whole
    mapped rows, bit for bit, on ordinary and saturated rows."""
    from curvcal.calibration.bbq import fit_bbq
    from curvcal.calibration.univariate import fit_nll, mapped_nll

    rng = np.random.default_rng(6)
    z = torch.tensor(rng.standard_normal((N, K)) * 3)
    y = torch.tensor(rng.integers(0, K, N))
    logp = log_probabilities(z)
    for fitted in [fit_histogram(z, y), fit_isotonic(z, y), fit_bbq(z, y)]:
        expected = fit_nll(by_rows(logp, fitted.calibrator._map_rows), y)
        assert mapped_nll(logp, y, fitted.calibrator._map_rows) == expected == fitted.nll_after
    saturated = z * 400  # probabilities that underflow to 0 and round to 1
    fitted = fit_isotonic(saturated, y)
    assert fitted.nll_after == fit_nll(
        by_rows(log_probabilities(saturated), fitted.calibrator._map_rows), y
    )
