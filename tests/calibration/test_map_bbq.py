"""BBQ (Bayesian binning into quantiles): hand-worked cases from the formula (scipy's gammaln,
not the module's code), border cases, the peers' BBQ (netcal 1.4, torch-uncertainty) and the
CLI (fit, save, apply; ``--method all``).

Measured against the peers, on the top-label problem (confidence against correctness) each
peer sees as a binary one, 2,000 fit / 1,000 evaluation samples, over- and under-confident,
K = 2, 10, 100, and ties with saturated rows (K = 10):

* the formula: torch-uncertainty's ``BBQScaler.compute_log_score`` on curvcal's binnings gives
  the same log marginal likelihood to float32 rounding (≤ 2e-6 relative: its lgamma of the bin
  counts is float32) and the bin frequencies;
* the average: a :class:`BBQMap` holding a fitted peer's own models (edges, bin values,
  weights) reproduces that peer's output (netcal ≤ 1e-12, torch-uncertainty ≤ 1e-6: float32);
* end to end, torch-uncertainty's ``BBQScaler(max_bins=15)`` against curvcal with the same
  bin counts 2..15: max |Δp| 2e-4 to 3.2e-2 (ties and saturated rows: 4.6e-4). The conventions that differ: its cuts are
  interpolated quantiles (a bin may hold one sample more or less than curvcal's, whose cuts
  never split ties), its bin value the frequency k/n, not the posterior mean (k + α)/(n + N'/B),
  and its scores float32; a change of one sample moves a model's log evidence by O(1), and so
  its weight, where two models are close;
* netcal's ``BBQ`` is another estimator: equal-width bins (its equal-mass option cannot be
  applied), the BIC of the maximum-likelihood histogram instead of the BDeu marginal
  likelihood, and the paper's elbow rule: max |Δp| 0.04 to 0.29 (ties and saturated rows: 0.16).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import gammaln, log_softmax, logit

from curvcal.calibration.bbq import (
    BBQMap,
    bin_counts,
    fit_bbq,
    fit_models,
)
from curvcal.calibration.binning import sorted_equal_mass_edges
from tests.calibration.test_linear_maps import synthetic
from tests.commands.test_metrics import as_json, logits_file
from tests.commands.test_study_maps import GOLDEN
from tests.commands.test_study_maps import _calibrate as calibrate_evaluation
from tests.commands.test_study_maps import _study as study_maps

CASES = [(k, sharpen) for k in (2, 10, 100) for sharpen in (3.0, 0.5)]


def binary_probs(c: np.ndarray) -> np.ndarray:
    """N×2 probabilities whose top class is 1 with confidence ``c`` (≥ 0.5)."""
    return np.stack([1.0 - c, c], axis=1)


def beta_bin(n: float, k: float, low: float, high: float, a: float) -> tuple[float, float]:
    """(log evidence, posterior mean) of one bin (low, high] holding n samples, k right, under
    Beta(a·m, a·(1 − m)), m the bin's middle: the paper's BDeu term, written out."""
    m = (low + high) / 2
    alpha, beta = a * m, a * (1 - m)
    log_evidence = (
        gammaln(a)
        - gammaln(n + a)
        + gammaln(k + alpha)
        - gammaln(alpha)
        + gammaln(n - k + beta)
        - gammaln(beta)
    )
    return log_evidence, (k + alpha) / (n + a)


def test_ten_points_by_hand() -> None:
    # N = 10: B from max(1, ⌊10^{1/3}/10⌋) = 1 to min(⌈10/5⌉, ⌈10·10^{1/3}⌉) = 2; N' = 2.
    c = np.array([0.55, 0.6, 0.62, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99])
    t = np.array([0, 1, 0, 1, 1, 0, 1, 1, 1, 1])
    fit = fit_bbq(torch.tensor(binary_probs(c)), torch.tensor(t), kind="probs")
    # one bin: n = 10, k = 7, Beta(1, 1)
    s1, theta1 = beta_bin(10, 7, 0.0, 1.0, 2.0)
    # the written-out term against the closed form under the uniform prior Beta(1, 1):
    # P(D) = ∫ θ^7 (1 − θ)^3 dθ = 1 / (11 · C(10, 7)), posterior mean (7 + 1)/(10 + 2)
    assert s1 == pytest.approx(-math.log(11 * math.comb(10, 7)), rel=1e-14)
    assert theta1 == pytest.approx(8 / 12, rel=1e-15)
    # two bins cut at round(10/2) = 5, halfway between 0.75 and 0.8: 3 of 5 and 4 of 5 right
    cut = (0.75 + 0.8) / 2
    left, low_value = beta_bin(5, 3, 0.0, cut, 1.0)
    right, high_value = beta_bin(5, 4, cut, 1.0, 1.0)
    s2 = left + right
    w2 = 1.0 / (1.0 + np.exp(s1 - s2))
    w1 = 1.0 - w2
    saved = fit.calibrator.to_dict()
    np.testing.assert_allclose(saved["edges"][1], [0.0, cut, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(saved["values"][0], [theta1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["values"][1], [low_value, high_value], rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["weights"], [w1, w2], rtol=0, atol=1e-12)
    assert fit.n_models == 2 and fit.min_bins == 1 and fit.max_bins == 2

    new = np.concatenate([c, [0.51, cut, cut + 1e-9, 1.0]])
    expected = w1 * theta1 + w2 * np.where(new <= cut, low_value, high_value)
    q = fit.calibrator.probabilities(torch.tensor(binary_probs(new)), "probs").numpy()
    np.testing.assert_allclose(q[:, 1], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(q[:, 0], 1.0 - expected, rtol=0, atol=1e-12)
    nll = -np.mean(np.log(np.where(t == 1, expected[:10], 1.0 - expected[:10])))
    assert fit.nll_after == pytest.approx(nll, rel=1e-12)


def test_a_tie_moves_the_cut_to_its_end() -> None:
    # the cut at round(10/2) = 5 falls inside the six 0.6s: it moves to their end
    c = np.array([0.6] * 6 + [0.8, 0.8, 0.9, 0.9])
    t = np.array([1, 0, 0, 1, 0, 1, 1, 1, 0, 1])
    fit = fit_bbq(torch.tensor(binary_probs(c)), torch.tensor(t), kind="probs")
    s1, theta1 = beta_bin(10, 6, 0.0, 1.0, 2.0)
    left, low_value = beta_bin(6, 3, 0.0, 0.7, 1.0)
    right, high_value = beta_bin(4, 3, 0.7, 1.0, 1.0)
    w2 = 1.0 / (1.0 + np.exp(s1 - left - right))
    saved = fit.calibrator.to_dict()
    np.testing.assert_allclose(saved["edges"][1], [0.0, 0.7, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(saved["values"][1], [low_value, high_value], rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["values"][0], [theta1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(saved["weights"], [1 - w2, w2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", ["plain", "ties", "saturated", "tiny"])
def test_the_models_are_histogram_binnings_equal_mass_bins(case: str) -> None:
    # every candidate binning, found for all B at once, is the equal-mass histogram's binning
    # for that B, bit for bit; each bin's evidence is the formula's
    z, y = synthetic(60 if case == "tiny" else 3000, 10, 3.0, 7)
    if case == "ties":
        z[:1500] = np.round(z[:1500], 1)
    if case == "saturated":
        z[:800, 0] += 60.0
    c, t = top_label(z, y)
    edges, values, _, log_evidence = fit_models(c, t)
    ranked = np.sort(c)
    expected = []
    for n_bins in bin_counts(len(c)):
        row = sorted_equal_mass_edges(ranked, n_bins)
        if not any(np.array_equal(row, seen) for seen in expected):
            expected.append(row)
    assert len(edges) == len(expected)
    for row, reference, row_values, score in zip(
        edges, expected, values, log_evidence, strict=True
    ):
        assert np.array_equal(row, reference)
        index = np.searchsorted(row[1:-1], c, side="left")
        total = 0.0
        for b in range(len(row) - 1):
            inside = index == b
            evidence, mean = beta_bin(
                inside.sum(), t[inside].sum(), row[b], row[b + 1], 2.0 / (len(row) - 1)
            )
            total += evidence
            assert row_values[b] == pytest.approx(mean, rel=1e-13)
        assert score == pytest.approx(total, rel=1e-12)


def test_bin_counts_are_the_papers_range_in_whole_numbers() -> None:
    assert bin_counts(1) == (1,) and bin_counts(5) == (1,) and bin_counts(6) == (1, 2)
    assert bin_counts(1000) == tuple(range(1, 101))  # ⌈10·10⌉ = 100, not 101
    assert bin_counts(20_000) == tuple(range(2, 273))  # 27.14…: ⌊2.71⌋ = 2, ⌈271.4⌉ = 272
    # 8000^{1/3} = 20 exactly: ⌊20/10⌋ = 2 (a floating cube root, 19.999…, gives 1)
    assert bin_counts(8000)[0] == 2 and bin_counts(8000)[-1] == 200
    assert bin_counts(10**6)[0] == 10 and bin_counts(10**6)[-1] == 1000


def test_the_averaged_map_is_the_weighted_sum_of_its_models() -> None:
    rng = np.random.default_rng(3)
    z, y = synthetic(3000, 10, 3.0, 2)
    fitted = fit_bbq(torch.tensor(z), torch.tensor(y)).calibrator
    c = np.concatenate([rng.random(2000), [0.0, 1.0], np.asarray(fitted.edges[3])])
    direct = np.zeros_like(c)
    for edges, values, weight in zip(fitted.edges, fitted.values, fitted.weights, strict=True):
        # bins (e_b, e_{b+1}]: the number of inner edges below c
        direct += weight * np.asarray(values)[np.searchsorted(edges[1:-1], c, side="left")]
    np.testing.assert_allclose(fitted.confidence(c), direct, rtol=0, atol=1e-15)
    assert len(fitted.weights) < 40 and abs(sum(fitted.weights) - 1.0) < 1e-15


def test_small_weights_are_dropped_and_the_rest_renormalised() -> None:
    z, y = synthetic(3000, 10, 3.0, 2)
    logp = log_softmax(z, axis=1)
    c, t = np.exp(logp.max(1)), (logp.argmax(1) == y).astype(float)
    edges, values, weights, log_evidence = fit_models(c, t)
    assert len(weights) == len(bin_counts(3000))  # no ties: every B is its own binning
    np.testing.assert_allclose(
        weights, np.exp(log_evidence - log_evidence.max()) / np.exp(
            log_evidence - log_evidence.max()).sum(), rtol=1e-12
    )  # fmt: skip
    fitted = fit_bbq(torch.tensor(z), torch.tensor(y)).calibrator
    kept = weights >= 2.0**-52
    assert len(fitted.weights) == kept.sum() < len(weights)
    full = np.zeros_like(c)
    for row_edges, row_values, weight in zip(edges, values, weights, strict=True):
        full += weight * row_values[np.searchsorted(row_edges[1:-1], c, side="left")]
    dropped = weights[~kept].sum()
    assert np.abs(fitted.confidence(c) - full).max() <= dropped + 1e-15


# ---------------------------------------------------------------------------------------------
# border cases


def test_one_sample() -> None:
    right = fit_bbq(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([1]), kind="probs")
    assert right.calibrator.values == ((2 / 3,),) and right.calibrator.weights == (1.0,)
    wrong = fit_bbq(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([0]), kind="probs")
    assert wrong.calibrator.values == ((1 / 3,),)
    q = wrong.calibrator.probabilities(torch.tensor([[0.1, 0.7, 0.2]]), "probs")
    assert int(q.argmax()) == 1  # 1/3 is under the floor c_tie = 0.2/0.5: the top class stays


def test_all_scores_equal_is_one_bin() -> None:
    z = torch.zeros(40, 4)  # every confidence 1/4
    y = torch.tensor([0] * 12 + [1] * 28)
    fit = fit_bbq(z, y)
    # every B collapses to the one bin (0, 1]: one model, (k + 1)/(n + 2)
    assert fit.n_models == 1 and fit.calibrator.edges == ((0.0, 1.0),)
    assert fit.calibrator.values[0][0] == pytest.approx(13 / 42, rel=1e-15)


@pytest.mark.parametrize("right", [True, False])
def test_all_right_or_all_wrong_stays_inside_zero_and_one(right: bool) -> None:
    z, _ = synthetic(300, 5, 2.0, 4)
    top = z.argmax(1)
    y = top if right else (top + 1) % 5
    fit = fit_bbq(torch.tensor(z), torch.tensor(y))
    values = np.concatenate([np.asarray(v) for v in fit.calibrator.values])
    assert (values > 0).all() and (values < 1).all()  # posterior means, never 0 or 1
    assert np.isfinite(fit.nll_after) and fit.nll_after < fit.nll_before
    q = fit.calibrator.probabilities(torch.tensor(z)).numpy()
    assert (q.argmax(1) == top).all()  # top-label: the prediction never changes


def test_saturated_and_tied_rows() -> None:
    z, y = synthetic(2000, 10, 3.0, 4)
    z[:300] = np.repeat(z[:30], 10, axis=0)  # tied confidences
    z[300:400, 0] += 60.0  # confidence 1 in float64
    fit = fit_bbq(torch.tensor(z), torch.tensor(y))
    for edges in fit.calibrator.edges:
        assert edges[-2] < 1.0  # the saturated rows share the top bin (edge, 1]
    q = fit.calibrator.probabilities(torch.tensor(z)).numpy()
    assert np.isfinite(q).all() and np.allclose(q.sum(1), 1.0, atol=1e-12)
    c = np.exp(log_softmax(z, axis=1).max(1))
    same = np.flatnonzero(c == c[0])
    assert len(same) >= 10 and len(np.unique(q[same].max(1))) == 1


# ---------------------------------------------------------------------------------------------
# peers


def split(k: int, sharpen: float, seed: int = 1) -> tuple[np.ndarray, ...]:
    """2,000 fit and 1,000 evaluation rows; ``sharpen`` 0 stands for the tied and saturated
    case: over-confident (3.0), K = 10, 300 rows repeated 10 times, 100 rows saturated."""
    z, y = synthetic(3000, k, sharpen or 3.0, seed)
    if not sharpen:
        z[:300] = np.repeat(z[:30], 10, axis=0)
        z[300:400, 0] += 60.0  # confidence 1 in float64
        z[2000:2300] = np.repeat(z[2000:2030], 10, axis=0)
    return z[:2000], y[:2000], z[2000:], y[2000:]


#: the peers' cases: over- and under-confident at K = 2, 10, 100, and ties with saturated rows
PEER_CASES = [*CASES, (10, 0.0)]


def top_label(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logp = log_softmax(z, axis=1)
    return np.exp(logp.max(1)), (logp.argmax(1) == y).astype(np.float64)


def quiet(call):  # netcal prints and warns
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        return call()


def torch_uncertainty_bbq(c: np.ndarray, t: np.ndarray, max_bins: int = 15):
    """torch-uncertainty's BBQScaler fitted on the binary problem (c, t): float32 logits
    logit(c), which it turns back into probabilities by a sigmoid."""
    post = pytest.importorskip("torch_uncertainty.post_processing")
    from torch.utils.data import DataLoader, TensorDataset

    scaler = post.BBQScaler(model=None, max_bins=max_bins)
    x = torch.tensor(logit(c), dtype=torch.float32)
    logging.disable(logging.WARNING)  # "model is None"
    try:
        scaler.fit(DataLoader(TensorDataset(x, torch.tensor(t)), batch_size=len(t)), False)
    finally:
        logging.disable(logging.NOTSET)
    return scaler


def torch_uncertainty_apply(scaler, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(its calibrated confidences, the float32 probabilities it binned) of confidences c."""
    x = torch.tensor(logit(c), dtype=torch.float32)
    with torch.no_grad():
        out = torch.sigmoid(scaler(x)).double().numpy()
    return out, torch.sigmoid(x).double().numpy()


@pytest.mark.parametrize(("k", "sharpen"), PEER_CASES)
def test_the_log_evidence_is_torch_uncertaintys(k: int, sharpen: float) -> None:
    post = pytest.importorskip("torch_uncertainty.post_processing")
    zf, yf, _, _ = split(k, sharpen)
    c, t = top_label(zf, yf)
    scaler = post.BBQScaler(model=None)
    edges, values, _, log_evidence = fit_models(c, t, range(2, 16))
    for row_edges, row_values, ours in zip(edges, values, log_evidence, strict=True):
        index = np.searchsorted(row_edges[1:-1], c, side="left")
        frequency, theirs = scaler.compute_log_score(
            torch.tensor(index), torch.tensor(row_edges), torch.tensor(t)
        )
        # its lgamma(n_b + N'/B) is float32 (its counts are): float32 rounding of terms ~ 1e4
        assert float(theirs) == pytest.approx(ours, rel=2e-6)
        count = np.bincount(index, minlength=len(row_values))
        hits = np.bincount(index, weights=t, minlength=len(row_values))
        np.testing.assert_allclose(frequency.numpy(), hits / count, rtol=0, atol=1e-7)  # float32
        # curvcal's bin value: the posterior mean (k + a·m)/(n + a), a = N'/B, m the middle
        a = 2.0 / len(count)
        middle = (row_edges[:-1] + row_edges[1:]) / 2
        np.testing.assert_allclose(row_values, (hits + a * middle) / (count + a), 0, 1e-15)


@pytest.mark.parametrize(("k", "sharpen"), PEER_CASES)
def test_a_map_of_torch_uncertaintys_models_is_its_output(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    c, t = top_label(zf, yf)
    ce, _ = top_label(ze, np.zeros(len(ze), dtype=np.int64))
    scaler = torch_uncertainty_bbq(c, t)
    models, weights = scaler.bbq_models[0]
    edges = []
    for model in models:  # its outer edges are -1e-5 and 1 + 1e-5: no score lies beyond 0, 1
        row = model["edges"].double().numpy().copy()
        row[0], row[-1] = 0.0, 1.0
        edges.append(tuple(row.tolist()))
    kept = weights.double().numpy()
    theirs_map = BBQMap(
        2,
        tuple(edges),
        tuple(tuple(m["bin_pos_freq"].double().numpy().tolist()) for m in models),
        tuple((kept / kept.sum()).tolist()),
    )
    out, binned = torch_uncertainty_apply(scaler, ce)
    mask = (out > 1e-6) & (out < 1 - 1e-6)  # it clamps to [eps, 1 - eps] before the logit
    ours = theirs_map.confidence(binned) * kept.sum()  # it does not renormalise after pruning
    np.testing.assert_allclose(ours[mask], out[mask], rtol=0, atol=2e-6)


@pytest.mark.parametrize(("k", "sharpen"), PEER_CASES)
def test_torch_uncertaintys_bbq_end_to_end(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    c, t = top_label(zf, yf)
    ce, _ = top_label(ze, np.zeros(len(ze), dtype=np.int64))
    fitted = fit_bbq(torch.tensor(zf), torch.tensor(yf), counts=range(2, 16)).calibrator
    theirs, binned = torch_uncertainty_apply(torch_uncertainty_bbq(c, t), ce)
    # conventions (module docstring): interpolated cuts, frequencies, float32 scores
    assert np.abs(fitted.confidence(binned) - theirs).max() < 0.05


def netcal_bbq(c: np.ndarray, t: np.ndarray):
    binning = pytest.importorskip("netcal.binning")
    return quiet(lambda: binning.BBQ().fit(c, t))


@pytest.mark.parametrize(("k", "sharpen"), PEER_CASES)
def test_a_map_of_netcals_models_is_its_output(k: int, sharpen: float) -> None:
    zf, yf, ze, _ = split(k, sharpen)
    c, t = top_label(zf, yf)
    ce, _ = top_label(ze, np.zeros(len(ze), dtype=np.int64))
    model = netcal_bbq(c, t)
    theirs_map = BBQMap(
        2,
        tuple(tuple(m._bin_bounds[0].tolist()) for m in model._binning_models),
        tuple(tuple(np.asarray(m._bin_map).tolist()) for m in model._binning_models),
        tuple(np.asarray(model._model_scores, dtype=np.float64).tolist()),
    )
    theirs = quiet(lambda: model.transform(ce))
    np.testing.assert_allclose(theirs_map.confidence(ce), theirs, rtol=0, atol=1e-12)
    # its own candidate range is the paper's too (with a floating cube root)
    assert len(model._binning_models) <= len(bin_counts(len(c)))


# ---------------------------------------------------------------------------------------------
# CLI


def test_fit_save_and_apply_through_metrics(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 400, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 300, 4, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", "bbq", "--save-calibrator", calibrator, "--json")
    document = as_json(run_cli("metrics", test, "--fit", fit, *args))
    fitted = document["results"]
    assert set(fitted["evaluation"]) == {"uncalibrated", "ts", "focal_ts", "bbq"}
    assert fitted["evaluation"]["bbq"]["ece"] < fitted["evaluation"]["uncalibrated"]["ece"]
    assert fitted["fits"]["bbq"]["n_models"] == len(bin_counts(400))
    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.3" and saved["bbq"]["method"] == "bbq"
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    for metric in ("ece", "nll", "brier", "accuracy"):
        assert applied["evaluation"]["bbq"][metric] == pytest.approx(
            fitted["evaluation"]["bbq"][metric], rel=1e-12
        )
    # the numbers themselves: the saved map applied here
    data = np.load(test)
    ours = BBQMap.from_dict(saved["bbq"]).probabilities(torch.tensor(data["logits"]))
    nll = -float(torch.log(ours[torch.arange(300), torch.tensor(data["labels"])]).mean())
    assert applied["evaluation"]["bbq"]["nll"] == pytest.approx(nll, rel=1e-12)
    table = run_cli("metrics", test, "--fit", fit, "--method", "bbq")
    assert table.code == 0 and "equal-mass binnings" in table.stdout


def test_calibrate_method_bbq_on_a_checkpoint(run_cli, tmp_path: Path) -> None:
    from curvcal.assets import demo_checkpoint

    small = ("--data", "curvcal:digits", "--max-samples", "200", "--batch-size", "100")
    calibrator, logits = tmp_path / "cal.json", tmp_path / "all.npz"
    result = run_cli(
        "calibrate", demo_checkpoint(), *small, "--method", "bbq",
        "--save-calibrator", calibrator, "--save-logits", logits, "--json",
    )  # fmt: skip
    assert "bbq" in as_json(result)["results"]["fits"]
    saved = json.loads(calibrator.read_text())["bbq"]
    # --apply measures the saved map on all of --data: the numbers of the map applied here
    applied = as_json(
        run_cli("calibrate", demo_checkpoint(), *small, "--apply", calibrator, "--json")
    )
    data = np.load(logits)
    q = BBQMap.from_dict(saved).probabilities(torch.tensor(data["logits"]))
    y = torch.tensor(data["labels"])
    nll = -float(torch.log(q[torch.arange(len(y)), y]).mean())
    assert applied["results"]["evaluation"]["bbq"]["nll"] == pytest.approx(nll, rel=1e-12)
    again = as_json(run_cli("metrics", logits, "--apply", calibrator, "--json"))
    for metric in ("ece", "nll", "brier"):
        assert again["results"]["evaluation"]["bbq"][metric] == pytest.approx(
            applied["results"]["evaluation"]["bbq"][metric], rel=1e-12
        )


def test_method_all_includes_bbq(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 400, 3, seed=3)
    args = ("--val-split", "0.5", "--method", "all", "--gammas", "0", "--json")
    results = as_json(run_cli("metrics", test, *args))["results"]
    assert "bbq" in results["fits"] and "bbq" in results["evaluation"]
    assert "bbq" in {item["stage"] for item in results["ranking"]["stages"]}


def test_a_policy_gates_the_bbq_stage(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 4, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 4, seed=3)
    report = tmp_path / "bbq.json"
    assert run_cli("metrics", test, "--fit", fit, "--method", "bbq", "-o", report).code == 0
    ece = json.loads(report.read_text())["results"]["evaluation"]["bbq"]["ece"]
    policy = tmp_path / "gate.toml"
    policy.write_text(f"[bbq.ece]\nmax = {ece + 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 0
    policy.write_text(f"[bbq.ece]\nmax = {ece - 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 1


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden study's tiny DigitsCNN checkpoints (10 classes) and data."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("golden_regenerate_bbq", GOLDEN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path_factory.mktemp("study_bbq")
    module.build_workspace(folder)
    return folder


def test_study_maps_bbq_is_calibrates_bbq(workspace: Path, run_cli) -> None:
    # the study's map equals calibrate's for the same checkpoint, split and seed
    names = ("a_ce", "b_flsd")
    result = study_maps(run_cli, workspace, "bbq", names)
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)["results"]["rows"]
    for name, row in zip(names, rows, strict=True):
        truth = calibrate_evaluation(run_cli, workspace, name, "bbq")["bbq"]
        ours = row["calibration"]["maps"]["bbq"]
        assert ours["ece"] == pytest.approx(truth["ece"], rel=1e-9, abs=1e-12)
        assert ours["nll"] == pytest.approx(truth["nll"], rel=1e-9)
