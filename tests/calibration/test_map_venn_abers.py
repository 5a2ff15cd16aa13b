"""Inductive Venn–Abers predictors against a brute-force reference (two scikit-learn isotonic
fits of the augmented calibration set per test score) and against the ``venn-abers`` package,
directly and through probmetrics' wrappers."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, logsumexp, softmax
from sklearn.isotonic import IsotonicRegression

from curvcal.calibration.venn_abers import fit_venn_abers, gap_values, log_odds
from tests.commands.test_metrics import as_json, logits_file


def brute_force(
    cal_scores: np.ndarray, cal_labels: np.ndarray, test_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p0, p1, p) of every test score from the definition: the isotonic regression (scikit-
    learn, ties pooled) of the calibration set with (s, 0), resp. (s, 1), added, read at s."""
    p0, p1 = np.empty(len(test_scores)), np.empty(len(test_scores))
    for i, s in enumerate(test_scores):
        for label, out in ((0, p0), (1, p1)):
            fitted = IsotonicRegression(out_of_bounds="clip").fit(
                np.append(cal_scores, s), np.append(cal_labels, label).astype(np.float64)
            )
            out[i] = fitted.predict([s])[0]
    return p0, p1, p1 / (1.0 - p0 + p1)


def binary_logits(scores: np.ndarray) -> torch.Tensor:
    """Logits [0, s] (log-odds of class 1 = s, distinct small whole numbers stay apart)."""
    return torch.from_numpy(np.stack([np.zeros_like(scores), scores], axis=1))


def test_gap_values_match_scikit_learn_on_random_small_sets_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(1, 25))
        s = rng.integers(0, int(rng.integers(1, 10)), n).astype(np.float64)
        y = (rng.random(n) < rng.random()).astype(np.float64)
        c, group, weights = np.unique(s, return_inverse=True, return_counts=True)
        p0, p1 = gap_values(weights, np.bincount(group, weights=y, minlength=len(c)))
        gaps = np.concatenate([[c[0] - 1], (c[:-1] + c[1:]) / 2, [c[-1] + 1]])
        ref0, ref1, _ = brute_force(s, y, gaps)
        np.testing.assert_allclose(p0, ref0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(p1, ref1, rtol=0, atol=1e-12)


def test_gap_values_on_long_hull_chains_and_the_saved_steps() -> None:
    """400 samples, 300 distinct scores, labels following a noisy rising curve: hull chains
    long enough for several binary-lifting levels; the saved map (steps where p0 or p1
    changes) gives the same values at every fit score and in every gap."""
    rng = np.random.default_rng(11)
    s = np.round(rng.normal(size=400) * 60.0)
    y = (rng.random(400) < 1 / (1 + np.exp(-s / 40.0))).astype(np.int64)
    c = np.unique(s)
    tests = np.concatenate([c, (c[:-1] + c[1:]) / 2, [c[0] - 1, c[-1] + 1]])
    ref0, ref1, ref = brute_force(s, y, tests)
    fit = fit_venn_abers(binary_logits(s), torch.from_numpy(y))
    assert fit.distinct_scores == (len(c),) and fit.knots[0] < len(c)
    low, high = fit.calibrator.intervals(torch.log_softmax(binary_logits(tests), 1))
    np.testing.assert_allclose(low[:, 0], ref0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(high[:, 0], ref1, rtol=0, atol=1e-12)
    q = fit.calibrator.probabilities(binary_logits(tests))[:, 1].numpy()
    np.testing.assert_allclose(q, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_binary_map_matches_the_definition_at_ties_gaps_and_ends(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cal = rng.integers(-4, 5, 40).astype(np.float64)  # many ties
    labels = (rng.random(40) < 1 / (1 + np.exp(-cal / 2))).astype(np.int64)
    tests = np.concatenate([np.arange(-6.0, 7.0), np.arange(-5.5, 6.0)])  # ties, gaps, ends
    fit = fit_venn_abers(binary_logits(cal), torch.from_numpy(labels))
    low, high = fit.calibrator.intervals(torch.log_softmax(binary_logits(tests), 1))
    p = fit.calibrator.probabilities(binary_logits(tests))[:, 1].numpy()
    ref0, ref1, ref = brute_force(cal, labels, tests)
    np.testing.assert_allclose(low[:, 0], ref0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(high[:, 0], ref1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p, ref, rtol=0, atol=1e-12)
    assert fit.distinct_scores == (len(np.unique(cal)),)


def test_one_vs_all_matches_the_definition_per_class_and_renormalises() -> None:
    rng = np.random.default_rng(4)
    rows = rng.integers(-3, 4, (12, 3)).astype(np.float64)  # 12 distinct rows, repeated: ties
    cal, tests = rows[rng.integers(0, 12, 60)], rows
    labels = rng.integers(0, 3, 60)
    fit = fit_venn_abers(torch.from_numpy(cal), torch.from_numpy(labels))
    q = fit.calibrator.probabilities(torch.from_numpy(tests)).numpy()

    def reference_log_odds(z: np.ndarray) -> np.ndarray:
        logp = log_softmax(z, axis=1)
        rest = np.stack([logsumexp(np.delete(logp, k, axis=1), axis=1) for k in range(3)], 1)
        return logp - rest

    s_cal, s_test = reference_log_odds(cal), reference_log_odds(tests)
    merged = np.empty((12, 3))
    for k in range(3):
        _, _, merged[:, k] = brute_force(s_cal[:, k], labels == k, s_test[:, k])
    np.testing.assert_allclose(q, merged / merged.sum(1, keepdims=True), rtol=0, atol=1e-12)


def test_log_odds_of_saturated_rows_stay_apart() -> None:
    z = torch.tensor([[0.0, 40.0], [0.0, 45.0]], dtype=torch.float64)
    s = log_odds(torch.log_softmax(z, 1))
    assert torch.exp(torch.log_softmax(z, 1))[:, 1].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(s[:, 1], [40.0, 45.0], rtol=1e-12)
    np.testing.assert_allclose(s[:, 0], [-40.0, -45.0], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# the venn-abers package and probmetrics' wrappers


def hidden_style(
    n: int, k: int, sharpen: float, seed: int, saturated: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Labels from softmax(u); logits sharpen·u (over-confident above 1, under-confident
    below), a tenth rounded to whole numbers (ties) and ``saturated`` rows whose class 1 leads
    by 60 or more (p_1 = 1.0 in float64)."""
    rng = np.random.default_rng(seed)
    u = 1.5 * rng.standard_normal((n, k))
    labels = (softmax(u, axis=1).cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    z = sharpen * u
    z[: n // 10] = np.round(z[: n // 10])
    z[n // 10 : n // 10 + saturated, 1] += 60.0 + rng.random(saturated)
    return z, labels


def package_one_vs_all(p_cal: np.ndarray, y_cal: np.ndarray, p_test: np.ndarray) -> np.ndarray:
    from venn_abers.venn_abers import VennAbersCalibrator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return VennAbersCalibrator().predict_proba(
            p_cal=p_cal, y_cal=y_cal, p_test=p_test, va_type="one_vs_all"
        )


def probabilities(z: np.ndarray) -> np.ndarray:
    """float64 exp(log_softmax(z)): the probabilities curvcal's scores are ranked by."""
    return torch.exp(torch.log_softmax(torch.from_numpy(z), 1)).numpy()


@pytest.mark.parametrize(
    ("k", "sharpen", "n"), [(2, 3.0, 2000), (2, 0.4, 2000), (10, 3.0, 1500), (10, 0.4, 1500)]
)
def test_agrees_with_the_venn_abers_package(k: int, sharpen: float, n: int) -> None:
    z, y = hidden_style(n, k, sharpen, seed=1)
    zt, _ = hidden_style(800, k, sharpen, seed=2)
    fit = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(y))
    q = fit.calibrator.probabilities(torch.from_numpy(zt)).numpy()
    reference = package_one_vs_all(probabilities(z), y, probabilities(zt))
    np.testing.assert_allclose(q, reference, rtol=0, atol=1e-12)


def test_agrees_with_the_package_at_100_classes() -> None:
    z, y = hidden_style(400, 100, 2.0, seed=3)
    zt, _ = hidden_style(200, 100, 2.0, seed=4)
    y[:100] = np.arange(100)  # every class in the calibration set (the package drops absent ones)
    fit = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(y))
    q = fit.calibrator.probabilities(torch.from_numpy(zt)).numpy()
    reference = package_one_vs_all(probabilities(z), y, probabilities(zt))
    np.testing.assert_allclose(q, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [2, 10])
def test_saturated_rows_differ_from_the_package_only_by_their_ties(k: int) -> None:
    """Rows with p_1 = 1.0 are one tie group for the package and stay apart by their log-odds
    here: the package given any probabilities that keep curvcal's order of the scores (σ of the
    log-odds / 64) agrees to rounding."""
    z, y = hidden_style(1500, k, 3.0, seed=5, saturated=60)
    zt, _ = hidden_style(600, k, 3.0, seed=6, saturated=30)
    fit = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(y))
    q = fit.calibrator.probabilities(torch.from_numpy(zt)).numpy()

    def order_keeping(logits: np.ndarray) -> np.ndarray:
        s = log_odds(torch.log_softmax(torch.from_numpy(logits), 1))
        return 1.0 / (1.0 + np.exp(-s / 64.0))

    reference = package_one_vs_all(order_keeping(z), y, order_keeping(zt))
    np.testing.assert_allclose(q, reference, rtol=0, atol=1e-12)
    raw = package_one_vs_all(probabilities(z), y, probabilities(zt))
    assert np.abs(q - raw).max() > 1e-6  # the saturated rows' ties do change the package's fit


def test_agrees_with_probmetrics_wrappers() -> None:
    from probmetrics.calibrators import (
        BinaryVennAbersCalibrator,
        MulticlassOneVsRestCalibrator,
        VennAbersCalibrator,
    )

    for k, wrappers in (
        (2, (BinaryVennAbersCalibrator(), VennAbersCalibrator())),
        (10, (MulticlassOneVsRestCalibrator(BinaryVennAbersCalibrator()), VennAbersCalibrator())),
    ):
        z, y = hidden_style(1200, k, 2.5, seed=7)
        zt, _ = hidden_style(500, k, 2.5, seed=8)
        q = fit_venn_abers(torch.from_numpy(z), torch.from_numpy(y)).calibrator.probabilities(
            torch.from_numpy(zt)
        )
        for wrapper in wrappers:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrapper.fit(probabilities(z), y)
                out = wrapper.predict_proba(probabilities(zt))
            reference = np.asarray(out.get_probs() if hasattr(out, "get_probs") else out)
            np.testing.assert_allclose(q.numpy(), reference, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# border cases


def test_one_sample_all_scores_equal_and_one_class() -> None:
    one = fit_venn_abers(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))
    low, high = one.calibrator.intervals(torch.log_softmax(torch.tensor([[0.0, 0.5]]).double(), 1))
    assert (low[0, 0], high[0, 0]) == (0.0, 1.0)  # below the one score: nothing to pool
    tied = torch.zeros(7, 3)
    labels = torch.tensor([0, 1, 2, 0, 0, 1, 0])
    fit = fit_venn_abers(tied, labels)
    assert fit.distinct_scores == (1, 1, 1)
    q = fit.calibrator.probabilities(tied).numpy()
    ref = np.empty(3)
    for k in range(3):  # a test score tied with all seven: both fits pool all eight points
        n_k = int((labels == k).sum())
        p0, p1 = n_k / 8, (n_k + 1) / 8
        ref[k] = p1 / (1 - p0 + p1)
    np.testing.assert_allclose(q, np.tile(ref / ref.sum(), (7, 1)), rtol=0, atol=1e-15)
    for k, y in ((2, torch.zeros(5, dtype=torch.int64)), (3, torch.zeros(5, dtype=torch.int64))):
        z = torch.randn(5, k, generator=torch.Generator().manual_seed(0))
        only = fit_venn_abers(z, y)
        q = only.calibrator.probabilities(z)
        assert torch.isfinite(torch.log(q)).all() and torch.allclose(
            q.sum(1), torch.ones(5).double()
        )
        assert only.calibrator.p0[-1][-1] == 0.0  # no positives of the last map: p0 = 0


# ---------------------------------------------------------------------------------------------
# through the CLI


@pytest.mark.parametrize("k", [2, 4])
def test_fit_save_and_apply_through_metrics(run_cli, tmp_path: Path, k: int) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, k, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, k, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", "venn-abers", "--save-calibrator", calibrator, "--json")
    fitted = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    assert "venn_abers" in fitted["evaluation"] and "venn_abers" in fitted["fits"]
    record = fitted["fits"]["venn_abers"]
    assert 0 < record["width_mean"] <= record["width_max"] < 1
    assert record["nll_after"] < record["nll_before"]
    saved = json.loads(calibrator.read_text())
    assert saved["schema"] == "1.3" and saved["venn_abers"]["method"] == "venn-abers"
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    for metric in ("ece", "nll", "brier"):
        assert applied["evaluation"]["venn_abers"][metric] == pytest.approx(
            fitted["evaluation"]["venn_abers"][metric], rel=1e-12
        )
    table = run_cli("metrics", test, "--fit", fit, "--method", "venn-abers")
    assert table.code == 0 and "Venn-Abers" in table.stdout


@pytest.mark.parametrize("k", [2, 3])
def test_method_all_includes_it(run_cli, tmp_path: Path, k: int) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, k, seed=4)
    test = logits_file(tmp_path / "test.npz", 200, k, seed=5)
    results = as_json(run_cli("metrics", test, "--fit", fit, "--method", "all", "--json"))
    assert "venn_abers" in results["results"]["evaluation"]


def test_calibrate_a_checkpoint(run_cli, digits_files: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, data = digits_files
    calibrator = tmp_path / "cal.json"
    common = ("--data", data, "--device", "cpu", "--val-split", "0.5", "--seed", "1")
    result = run_cli(
        "calibrate", checkpoint, *common, "--method", "venn-abers",
        "--save-calibrator", calibrator, "--json",
    )  # fmt: skip
    document = as_json(result)
    assert "venn_abers" in document["results"]["evaluation"]
    assert json.loads(calibrator.read_text())["venn_abers"]["n_classes"] == 3


def test_policy_gates_the_stage(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 300, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 200, 3, seed=3)
    report = tmp_path / "va.json"
    assert run_cli("metrics", test, "--fit", fit, "--method", "venn-abers", "-o", report).code == 0
    ece = json.loads(report.read_text())["results"]["evaluation"]["venn_abers"]["ece"]
    policy = tmp_path / "gate.toml"
    policy.write_text(f"[venn_abers.ece]\nmax = {ece + 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 0
    policy.write_text(f"[venn_abers.ece]\nmax = {ece - 1e-9}\n")
    assert run_cli("compare", report, report, "--policy", policy).code == 1


def test_lifting_tables_double_the_links_until_every_chain_has_ended() -> None:
    from curvcal.calibration.venn_abers import lifting_tables

    tables = lifting_tables(np.array([1, 2, 3, 3]))  # one chain 0 -> 1 -> 2 -> 3
    assert [table.tolist() for table in tables] == [[1, 2, 3, 3], [2, 3, 3, 3], [3, 3, 3, 3]]
    assert [t.tolist() for t in lifting_tables(np.array([0, 1]))] == [[0, 1]]  # ends only
