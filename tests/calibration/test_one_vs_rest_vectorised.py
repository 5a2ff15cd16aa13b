"""The one-vs-rest histogram and isotonic fits, which share their work across classes (one sort
of all columns, hits from each sample's own class), against plain per-column references written
here: one class at a time, straight from the definitions in docs/guide/calibration.md.

Data: ties (logits rounded to a coarse grid), saturated rows (logits ×200, probabilities that
underflow to 0 and round to 1), equal-width bins left empty, K = 2 and K = 100. Histogram maps
must agree exactly (their values are whole counts divided by whole counts); isotonic points are
compared exactly against the per-column fit and within 1e-13 as functions against the plain
pool-adjacent-violators reference (its sums are pooled in another order). The top-label rule is
checked against its formula computed from the probabilities.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from curvcal.calibration.binning import bin_of, fit_histogram
from curvcal.calibration.isotonic import fit_isotonic, isotonic_points
from curvcal.calibration.univariate import TIE_MARGIN, top_label_log_probabilities


def hard_scores(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits with tied rows, saturated rows and a few exactly equal columns."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k)) * 3
    z[: n // 10] *= 200  # saturated: probabilities 0 and 1
    z[n // 10 : n // 3] = np.round(z[n // 10 : n // 3])  # many exact ties
    z[n // 3 : n // 3 + 5] = 0.0  # uniform rows
    y = rng.integers(0, k, n)
    y[: min(n, k)] = np.arange(min(n, k))  # every class present
    return torch.tensor(z), torch.tensor(y)


def reference_histogram(
    x: np.ndarray, target: np.ndarray, n_bins: int, scheme: str
) -> tuple[np.ndarray, np.ndarray]:
    """One class's bins: (e_m, e_{m+1}], equal-width m/M or equal-mass cuts at round(i·N/M)
    moved to the end of their tie group (empty bins dropped), inner edges halfway between the
    bins' extreme scores; each value the mean target of its bin, the middle when empty."""
    n = len(x)
    if scheme == "equal-width":
        edges = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    else:
        ranked = np.sort(x)
        cuts = []
        for i in range(1, n_bins):
            cut = math.floor(i * n / n_bins + 0.5)
            if cut > 0:
                while cut < n and ranked[cut] == ranked[cut - 1]:
                    cut += 1
            cuts.append(max([cut, *cuts]))
        inner = []
        for cut in sorted(set(cuts)):
            if 0 < cut < n:
                below, above = ranked[cut - 1], ranked[cut]
                middle = below + (above - below) / 2
                edge = middle if middle < above else below
                if edge > 0:  # zeros and a score under 2 subnormals cannot be split
                    inner.append(edge)
        edges = np.array([0.0, *inner, 1.0])
    values = []
    for low, high in itertools.pairwise(edges):
        inside = (x > low) & (x <= high) if low > 0 else x <= high
        count = int(inside.sum())
        values.append(target[inside].sum() / count if count else (low + high) / 2)
    return edges, np.array(values)


def reference_isotonic(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One class's isotonic fit: scores within 1e-15 of their group's first score pooled
    (scikit-learn's rule), then pool-adjacent-violators on the group means weighted by size."""
    order = np.argsort(x, kind="stable")
    xs, ts = x[order], target[order]
    groups: list[list[float]] = []  # [first score, sum of targets, count]
    for score, t in zip(xs.tolist(), ts.tolist(), strict=True):
        if groups and score - groups[-1][0] < np.finfo(np.float64).resolution:
            groups[-1][1] += t
            groups[-1][2] += 1
        else:
            groups.append([score, t, 1])
    blocks: list[list[float]] = []  # [sum, weight, number of groups]
    for _, total, count in groups:
        blocks.append([total, count, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, weight, size = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight
            blocks[-1][2] += size
    fitted = np.repeat([b[0] / b[1] for b in blocks], [int(b[2]) for b in blocks])
    return np.array([g[0] for g in groups]), fitted


@pytest.mark.parametrize("k", [2, 100])
@pytest.mark.parametrize(
    ("scheme", "n_bins"), [("equal-width", 15), ("equal-width", 60), ("equal-mass", 15)]
)
def test_histogram_one_vs_rest_equals_per_column_reference(
    k: int, scheme: str, n_bins: int
) -> None:
    z, y = hard_scores(400 if k == 2 else 1500, k, seed=k + n_bins)
    fit = fit_histogram(z, y, "histogram-ovr", n_bins=n_bins, scheme=scheme)
    p = torch.exp(torch.log_softmax(z, dim=1)).numpy()  # curvcal's p
    for j in range(k):
        edges, values = reference_histogram(p[:, j], (y.numpy() == j).astype(float), n_bins, scheme)
        np.testing.assert_array_equal(fit.calibrator.edges[j], edges)
        np.testing.assert_array_equal(fit.calibrator.values[j], values)
    if scheme == "equal-width" and n_bins == 60:
        assert fit.empty_bins > 0  # the case of empty bins is exercised
    # the applied map: every class's value of its bin, renormalised
    f = np.stack(
        [
            np.asarray(fit.calibrator.values[j])[
                bin_of(p[:, j], np.asarray(fit.calibrator.edges[j]))
            ]
            for j in range(k)
        ],
        axis=1,
    )
    total = f.sum(axis=1, keepdims=True)
    expected = np.where(total > 0, f / np.where(total > 0, total, 1.0), 1.0 / k)
    np.testing.assert_allclose(
        fit.calibrator.probabilities(z).numpy(), expected, rtol=1e-13, atol=1e-15
    )


@pytest.mark.parametrize("k", [2, 100])
def test_isotonic_one_vs_rest_equals_per_column_reference(k: int) -> None:
    z, y = hard_scores(400 if k == 2 else 1500, k, seed=k)
    fit = fit_isotonic(z, y, "isotonic-ovr")
    p = torch.exp(torch.log_softmax(z, dim=1)).numpy()  # curvcal's p
    probe = np.unique(np.concatenate([p.ravel(), np.linspace(0.0, 1.0, 201)]))
    for j in range(k):
        target = (y.numpy() == j).astype(float)
        px, py = np.asarray(fit.calibrator.x[j]), np.asarray(fit.calibrator.y[j])
        # bit for bit the per-column fit
        column_x, column_y = isotonic_points(p[:, j], target)
        np.testing.assert_array_equal(px, column_x)
        np.testing.assert_array_equal(py, column_y)
        # the same function as the plain reference
        rx, ry = reference_isotonic(p[:, j], target)
        np.testing.assert_allclose(
            np.interp(probe, px, py), np.interp(probe, rx, ry), rtol=0, atol=1e-13
        )


def test_top_label_rule_against_its_formula() -> None:
    """q_t = max(f(c), c_tie), q_j = p_j (1 − q_t)/(1 − c); where the floor binds the others are
    held a relative TIE_MARGIN under q_t and the row renormalised."""
    rng = np.random.default_rng(5)
    z = torch.tensor(rng.standard_normal((3000, 7)) * 2)
    z[:20, 1] = z[:20, 0]  # tied top classes
    logp = torch.log_softmax(z, dim=1)
    confidence = torch.tensor(rng.uniform(0, 1, 3000))
    q = torch.exp(top_label_log_probabilities(logp, confidence)).numpy()
    p = torch.exp(torch.log_softmax(z, dim=1)).numpy()  # curvcal's p
    top = p.argmax(axis=1)
    rows = np.arange(len(p))
    c = p[rows, top]
    second = np.sort(p, axis=1)[:, -2]
    tie = second / (second + 1 - c)
    q_top = np.maximum(confidence.numpy(), tie)
    expected = p * ((1 - q_top) / (1 - c))[:, None]
    expected[rows, top] = q_top
    binds = expected.max(axis=1, where=np.arange(7) != top[:, None], initial=0) > q_top * (
        1 - TIE_MARGIN
    )
    held = np.minimum(expected, (q_top * (1 - TIE_MARGIN))[:, None])
    held[rows, top] = q_top
    expected[binds] = held[binds] / held[binds].sum(axis=1, keepdims=True)
    assert binds.sum() > 100  # the floor binds in many rows
    np.testing.assert_allclose(q, expected, rtol=1e-12, atol=1e-15)
    assert (q.argmax(axis=1) == top).all()
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-14)


def test_equal_mass_bin_of_zeros_before_a_tiny_subnormal_is_merged() -> None:
    """Scores 0 and the smallest subnormal have no float between them: the cut there had left
    an inner edge at 0 (edges not rising, so the fit raised); the two bins are now one."""
    tiny = float(np.nextafter(0.0, 1.0))
    p1 = np.array([0.0, 0.0, 0.0, 0.0, tiny, 0.2, 0.3, 0.4])
    probs = torch.tensor(np.stack([1 - p1, p1], axis=1))
    labels = torch.tensor([0, 0, 1, 0, 1, 1, 0, 1])
    fit = fit_histogram(probs, labels, "histogram-ovr", kind="probs", n_bins=2)
    assert fit.calibrator.edges[1] == (0.0, 1.0)
    assert fit.calibrator.values[1] == (0.5,)
    saved = type(fit.calibrator).from_dict(fit.calibrator.to_dict())
    np.testing.assert_array_equal(
        saved.probabilities(probs, "probs"), fit.calibrator.probabilities(probs, "probs")
    )


@pytest.mark.parametrize("method", ["histogram-ovr", "isotonic-ovr"])
@pytest.mark.parametrize("k", [2, 100])
def test_one_vs_rest_in_sample_nll_is_that_of_the_applied_map(method: str, k: int) -> None:
    """The fit's NLL is found from f_y and Σ_j f_j alone; it is the mean −log q_y of the
    calibrated rows the map gives."""
    z, y = hard_scores(600, k, seed=3 * k)
    fit = (fit_histogram if method == "histogram-ovr" else fit_isotonic)(z, y, method)
    expected = float(-fit.calibrator.apply(z).gather(1, y[:, None]).mean())
    assert fit.nll_after == pytest.approx(expected, rel=1e-14)


def test_equal_mass_edges_of_sorted_columns_tie_as_the_per_column_fit() -> None:
    """Scores equal up to float64 rounding (a few units of 2⁻⁵³ apart) at a cut stay in one bin
    in the shared one-vs-rest fit exactly as in :func:`histogram_edges` (the tie groups of
    curvcal.calibration.ties); exact ties alone would cut the near-tied run."""
    from curvcal.calibration.binning import histogram_edges, sorted_equal_mass_edges

    base = 0.3
    near = base + np.arange(6) * 2.0 * np.spacing(base)  # six scores 2 ulps apart
    x = np.sort(np.concatenate([np.linspace(0.01, 0.29, 7), near, np.linspace(0.31, 0.9, 7)]))
    expected = histogram_edges(x, 4, "equal-mass")
    np.testing.assert_array_equal(sorted_equal_mass_edges(x, 4), expected)
    inner = expected[1:-1]
    assert not ((inner >= near[0]) & (inner < near[-1])).any()  # no edge inside the run
