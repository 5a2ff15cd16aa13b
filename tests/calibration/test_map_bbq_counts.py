"""BBQ's bin counts against a direct count: every candidate model's bins (e_b, e_{b+1}] (the
first from 0 inclusive, the last open above) hold the fit samples and hits that comparing
each score with the model's edges finds, whichever way the scores were sorted (one integer
sort of the packed scores and 0/1 targets, or a stable argsort for other inputs), on data with
ties, saturated rows, exact zeros and neighbouring floats."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from curvcal.calibration.bbq import bin_evidence, fit_models


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    n = 3000
    ties = np.round(rng.uniform(0.2, 1.0, n), 2)
    saturated = np.round(rng.beta(5, 1, n), 3)
    saturated[: n // 3] = 1.0
    zeros = rng.uniform(0, 1, n)
    zeros[: n // 5] = 0.0
    close = np.sort(rng.uniform(0.5, 1.0, n))
    close[1::2] = np.nextafter(close[0::2], 2.0)  # pairs one float apart
    close = rng.permutation(close)
    signed_zero = rng.uniform(0, 1, n)
    signed_zero[:7] = -0.0  # not packed: the argsort path
    return {
        name: (c, (rng.uniform(size=n) < np.abs(c) ** 2).astype(np.float64))
        for name, c in {"ties": ties, "saturated": saturated, "zeros": zeros,
                        "close": close, "signed zero": signed_zero}.items()
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_cases()))
@pytest.mark.parametrize("target_type", [np.float64, np.bool_, np.int64])
def test_every_bin_holds_what_a_direct_count_finds(name: str, target_type: type) -> None:
    c, correct = _cases()[name]
    edges, values, _, log_evidence = fit_models(c, correct.astype(target_type))
    assert len(edges) > 5
    for row_edges, row_values, row_evidence in zip(edges, values, log_evidence, strict=True):
        n_bins = len(row_edges) - 1
        inside = [(c > low) & (c <= high) for low, high in pairwise(row_edges)]
        inside[0] |= c <= row_edges[0]
        inside[-1] |= c > row_edges[-1]
        count = np.array([mask.sum() for mask in inside], dtype=np.float64)
        hits = np.array([correct[mask].sum() for mask in inside])
        assert count.sum() == len(c)
        middle = (row_edges[:-1] + row_edges[1:]) / 2
        per_bin, direct = bin_evidence(count, hits, middle, np.full(n_bins, n_bins))
        assert row_values.tobytes() == direct.tobytes()
        assert row_evidence == pytest.approx(per_bin.sum(), rel=1e-12, abs=1e-9)
