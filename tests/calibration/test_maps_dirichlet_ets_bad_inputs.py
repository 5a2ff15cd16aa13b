"""Dirichlet calibration and ensemble TS: bad inputs, saved forms and border cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.calibration.dirichlet import fit_dirichlet
from curvcal.calibration.ensemble import EnsembleMap, fit_ensemble_temperature
from curvcal.calibration.inputs import InputNames
from curvcal.calibration.linear import MAX_MATRIX_CLASSES, LinearMap, fit_linear
from curvcal.errors import InputError
from tests.calibration.test_maps_dirichlet_ets import synthetic
from tests.commands.test_metrics import logits_file


@pytest.mark.parametrize(
    ("saved", "needle"),
    [
        (
            {"method": "ensemble-temperature", "temperature": 0.0, "weights": [1, 0, 0]},
            "temperature 0.0 is outside",
        ),
        (
            {"method": "ensemble-temperature", "temperature": 1.0, "weights": [1, 0]},
            "weights must have 3 entries, got 2",
        ),
        ({"method": "ensemble-temperature", "temperature": 1.0, "weights": [0.5, 0.6, 0]}, "sum"),
        (
            {"method": "ensemble-temperature", "temperature": 1.0, "weights": [1.2, -0.2, 0]},
            "weights -0.2 is outside 0",
        ),
        ({"method": "ensemble-temperature", "temperature": "1", "weights": [1, 0, 0]}, "number"),
        ({"method": "ensemble-temperature", "temperature": 1.0}, "missing"),
        (
            {"method": "ensemble-temperature", "temperature": 1, "weights": [1, 0, 0], "x": 1},
            "unknown",
        ),
        ({"method": "temperature", "temperature": 1.0, "weights": [1, 0, 0]}, "unknown method"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_saved_ensemble_maps_are_refused(saved: object, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        EnsembleMap.from_dict(saved, "cal.json")


def test_bad_saved_dirichlet_map_is_refused() -> None:
    with pytest.raises(InputError, match="bias has 2 entries where K = 1"):
        LinearMap.from_dict({"method": "dirichlet", "weights": [[1.0]], "bias": [0.0, 0.0]})


def test_nan_scores_and_bad_labels_are_refused() -> None:
    z = torch.zeros(6, 3)
    z[2, 1] = float("nan")
    for fit in (
        lambda s, y: fit_linear(s, y, "dirichlet", names=InputNames("fit.npz")),
        lambda s, y: fit_ensemble_temperature(s, y, names=InputNames("fit.npz")),
    ):
        with pytest.raises(InputError, match=r"fit\.npz"):
            fit(z, torch.zeros(6, dtype=torch.int64))
        with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
            fit(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_dirichlet_class_limit() -> None:
    k = MAX_MATRIX_CLASSES + 1
    with pytest.raises(InputError, match="method dirichlet"):
        fit_linear(torch.zeros(3, k), torch.tensor([0, 1, 2]), "dirichlet")


def test_unknown_regulariser_is_refused() -> None:
    z, y = synthetic(50, 3, 1.0, seed=1)
    with pytest.raises(InputError, match="odir or l2"):
        fit_linear(torch.from_numpy(z), torch.from_numpy(y), "dirichlet", regulariser="l1")


def test_binary_problems_fit_both_maps() -> None:
    z, y = synthetic(400, 2, 3.0, seed=2)
    dirichlet = fit_dirichlet(torch.from_numpy(z), torch.from_numpy(y))
    assert dirichlet.converged and dirichlet.cv_folds == 5
    ets = fit_ensemble_temperature(torch.from_numpy(z), torch.from_numpy(y))
    assert ets.nll_after <= ets.nll_before


def test_a_class_absent_from_the_fit_split() -> None:
    # Class 2 never appears: the fold rule cannot deal it, so λ stays fixed; the fit still
    # ends with finite numbers and says whether it converged (b_2 → −∞ is the infimum).
    z, y = synthetic(300, 3, 2.0, seed=3)
    y[y == 2] = 0
    fit = fit_dirichlet(torch.from_numpy(z), torch.from_numpy(y))
    assert np.isfinite(fit.nll_after) and fit.nll_after < fit.nll_before
    assert fit.converged == (fit.gradient_max < fit.gradient_tol)
    ets = fit_ensemble_temperature(torch.from_numpy(z), torch.from_numpy(y))
    assert np.isfinite(ets.nll_after)


def test_a_class_rare_enough_to_miss_a_fold_falls_back() -> None:
    z, y = synthetic(60, 3, 2.0, seed=8)
    y[y == 2] = 0
    y[:3] = 2  # fewer than 2 per fold
    fit = fit_dirichlet(torch.from_numpy(z), torch.from_numpy(y), regulariser="l2")
    assert fit.cv_folds == 0 and fit.regulariser == "l2"


def test_zero_probabilities_are_floored_not_fatal() -> None:
    z, y = synthetic(300, 4, 2.0, seed=5)
    probs = np.exp(z - z.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    probs[:20] = np.eye(4)[(y[:20] + 1) % 4]  # confidently wrong, exact zeros on the truth
    fit = fit_linear(torch.from_numpy(probs), torch.from_numpy(y), "dirichlet", kind="probs")
    assert np.isfinite(fit.nll_after)
    ets = fit_ensemble_temperature(torch.from_numpy(probs), torch.from_numpy(y), kind="probs")
    assert ets.weights[2] > 0 and np.isfinite(ets.nll_after)  # only the uniform part rescues


def test_tampered_saved_ets_is_one_line_naming_the_file(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 150, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--fit", fit, "--method", "ets", "--save-calibrator", calibrator)
    assert run_cli("metrics", test, *args).code == 0
    saved = json.loads(calibrator.read_text())
    saved["ets"]["weights"] = [0.5, 0.5, 0.5]
    calibrator.write_text(json.dumps(saved))
    result = run_cli("metrics", test, "--apply", calibrator)
    assert result.code == 2 and str(calibrator) in result.stderr and "sum" in result.stderr
    assert "Traceback" not in result.stderr
    saved["ets"] = {"method": "dirichlet", "weights": [[1.0]], "bias": [0.0]}
    calibrator.write_text(json.dumps(saved))
    result = run_cli("metrics", test, "--apply", calibrator)
    assert result.code == 2 and "ensemble-temperature" in result.stderr
