"""Border cases of the calibration maps where a fit can claim more than it holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.calibration.linear import fit_linear
from tests.calibration.test_linear_maps import synthetic


def _nll(z: np.ndarray, y: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> float:
    """Mean NLL of softmax(w ⊙ z + b), written in NumPy float64."""
    s = z * weights + bias
    s = s - s.max(axis=1, keepdims=True)
    logq = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    return float(-logq[np.arange(len(y)), y].mean())


def test_vector_scaling_on_separated_rows_says_it_has_no_minimum() -> None:
    # Before: the fit reported converged and nothing else, though its NLL has no minimum
    # (w = c·1 on rows whose argmax is their label).
    z, _ = synthetic(90, 4, 3.0, 7)
    y = z.argmax(axis=1)
    fit = fit_linear(torch.tensor(z), torch.tensor(y), "vector")
    assert fit.no_minimum is not None and "classifies all 90 fit rows" in fit.no_minimum
    weights = np.array(fit.calibrator.weights)
    bias = np.array(fit.calibrator.bias)
    # the ground truth of 'no minimum': the same map scaled up fits strictly better
    assert _nll(z, y, 2 * weights, 2 * bias) < _nll(z, y, weights, bias)


@pytest.mark.parametrize("absent", [[2], [1, 2, 3]])
def test_vector_scaling_with_a_class_missing_from_the_fit_says_it_has_no_minimum(
    absent: list[int],
) -> None:
    # Before: converged, and nothing said; the missing class's bias was wherever the gradient
    # tolerance stopped it, which sets that class's probability on the evaluation split.
    z, y = synthetic(300, 4, 3.0, 7)
    keep = ~np.isin(y, absent)
    z, y = z[keep], y[keep]
    fit = fit_linear(torch.tensor(z), torch.tensor(y), "vector")
    assert fit.no_minimum is not None
    verb = "has" if len(absent) == 1 else "have"
    named = ", ".join(map(str, absent))
    assert f"{len(absent)} of its 4 classes ({named}) {verb} no fit row" in fit.no_minimum
    weights, bias = np.array(fit.calibrator.weights), np.array(fit.calibrator.bias)
    lower = bias.copy()
    lower[absent] -= 1.0
    # the ground truth: a lower bias of the missing classes fits strictly better
    assert _nll(z, y, weights, lower) < _nll(z, y, weights, bias)


def test_vector_scaling_on_overlapping_rows_is_not_called_separated() -> None:
    z, y = synthetic(300, 4, 3.0, 7)
    assert (z.argmax(axis=1) != y).any()
    fit = fit_linear(torch.tensor(z), torch.tensor(y), "vector")
    assert fit.no_minimum is None and fit.converged
    weights, bias = np.array(fit.calibrator.weights), np.array(fit.calibrator.bias)
    # a minimum: scaling the map either way fits worse
    for factor in (0.9, 1.1):
        assert _nll(z, y, factor * weights, factor * bias) > _nll(z, y, weights, bias)


def test_metrics_warns_when_vector_scaling_has_no_minimum(run_cli, tmp_path: Path) -> None:
    z, y = synthetic(200, 3, 3.0, 1)
    fit, test = tmp_path / "fit.npz", tmp_path / "test.npz"
    np.savez(fit, logits=z[:80], labels=np.zeros(80, dtype=np.int64))
    np.savez(test, logits=z[80:], labels=y[80:])
    result = run_cli("metrics", test, "--fit", fit, "--method", "vector", "--json")
    assert result.code == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any("vector scaling's NLL has no minimum" in line for line in warnings)
    no_minimum = json.loads(result.stdout)["results"]["fits"]["vector"]["no_minimum"]
    assert no_minimum.startswith("2 of its 3 classes (1, 2) have no fit row")


def _full_nll(x: np.ndarray, y: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> float:
    """Mean NLL of softmax(W x + b), written in NumPy float64."""
    s = x @ weights.T + bias
    s = s - s.max(axis=1, keepdims=True)
    logq = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    return float(-logq[np.arange(len(y)), y].mean())


def test_dirichlet_odir_with_a_class_missing_from_the_fit_says_it_has_no_minimum() -> None:
    # Before: converged, and nothing said; ODIR leaves W_kk free, and with class k absent
    # ∂L/∂W_kk = mean q_k log p_k < 0 everywhere, so W_kk ran off (to about 70 here).
    from curvcal.calibration.dirichlet import fit_dirichlet

    z, y = synthetic(300, 3, 3.0, 7)
    keep = y != 2
    z, y = z[keep], y[keep]
    fit = fit_dirichlet(torch.tensor(z), torch.tensor(y), seed=0)
    assert fit.no_minimum is not None and "1 of its 3 classes (2) has no fit row" in (
        fit.no_minimum
    )
    assert "diagonal weight" in fit.no_minimum
    logp = z - z.max(axis=1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
    weights, bias = np.array(fit.calibrator.weights), np.array(fit.calibrator.bias)
    larger = weights.copy()
    larger[2, 2] += 1.0
    # the ground truth: ODIR does not charge W_22, and a larger W_22 fits strictly better
    assert _full_nll(logp, y, larger, bias) < _full_nll(logp, y, weights, bias)
    # L2 on every parameter (λ > 0) has a minimum on the same rows
    assert fit_dirichlet(torch.tensor(z), torch.tensor(y), regulariser="l2").no_minimum is None


def test_an_infinite_nll_of_a_binning_map_is_not_blamed_on_rounded_scores(
    run_cli, tmp_path: Path
) -> None:
    # Before: 'rounded or clipped probabilities?', of float logits that hold no zero: the
    # one-vs-rest maps give 0 to class 2, which the fit split never held.
    z, y = synthetic(300, 3, 3.0, 2)
    fit, test = tmp_path / "fit.npz", tmp_path / "test.npz"
    np.savez(fit, logits=z[:150], labels=np.where(y[:150] == 2, 0, y[:150]))
    np.savez(test, logits=z[150:], labels=y[150:])
    result = run_cli("metrics", test, "--fit", fit, "--method", "histogram-ovr", "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["evaluation"]["histogram_ovr"]["nll"] is None  # infinite
    (warning,) = [w for w in document["warnings"] if "histogram_ovr stage" in w]
    assert "no row of that class" in warning and "rounded" not in warning


def test_check_says_what_calibrate_says_of_a_gated_fit(run_cli, tmp_path: Path) -> None:
    # Before: check gated vector.ece on a fit split missing half of the classes, with no
    # word that the map had no minimum; calibrate warned of the same fit.
    from curvcal.assets import demo_checkpoint
    from tests.commands.test_check_command import SETTINGS

    policy = tmp_path / "gate.toml"
    settings = SETTINGS.replace("max_samples = 120", "max_samples = 12")
    policy.write_text(f"{settings}\n[vector.ece]\nmax = 0.9\n")
    result = run_cli("check", demo_checkpoint(), "--policy", policy, "--json")
    assert result.code in (0, 1), result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any(w.startswith("vector scaling's NLL has no minimum") for w in warnings)


def test_study_says_what_calibrate_says_of_each_checkpoints_fit(run_cli) -> None:
    # Before: study fitted the maps exactly as calibrate does but said none of its warnings.
    from curvcal.assets import demo_checkpoint

    checkpoint = demo_checkpoint()
    result = run_cli("study", checkpoint, "--data", "curvcal:digits", "--max-samples", "12",
                     "--maps", "vector", "--probes", "4", "--tol", "1e-2", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any(w.startswith(f"{checkpoint}: vector scaling's NLL has no minimum") for w in warnings)


def test_method_all_skips_a_map_the_fit_split_cannot_fit(run_cli, tmp_path: Path) -> None:
    # Before: a 4-row fit split, too small for 15 histogram bins, stopped the whole run
    # (exit 2) and no map was measured.
    z, y = synthetic(120, 3, 3.0, 3)
    fit, test = tmp_path / "fit.npz", tmp_path / "test.npz"
    np.savez(fit, logits=z[:4], labels=np.array([0, 1, 2, 0]))
    np.savez(test, logits=z[4:], labels=y[4:])
    result = run_cli("metrics", test, "--fit", fit, "--method", "all", "--json")
    assert result.code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    reasons = {row["stage"]: row["reason"] for row in results["ranking"]["skipped"]}
    for stage in ("histogram", "histogram_ovr"):
        assert "--histogram-bins: 15 bins need at least 15 fit samples" in reasons[stage]
        assert stage not in results["evaluation"]
    assert {"ts", "vector", "isotonic", "ets"} <= set(results["evaluation"])
    # a fault of the fit split's labels still stops the run, from TS
    np.savez(fit, logits=z[:4], labels=np.array([0, 1, 5, 0]))
    refused = run_cli("metrics", test, "--fit", fit, "--method", "all")
    assert refused.code == 2 and "out of range" in refused.stderr
