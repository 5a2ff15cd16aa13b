"""A saved Laplace calibrator is checked against the model it is applied with, and its
posterior against what a posterior is: each tampering below was applied with exit 0 (or exit 70)
before; now it is one line, exit 2, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from curvcal.calibration.laplace import PRIOR_BRACKET
from curvcal.settings.calibration import MAX_LAPLACE_SAMPLES, CalibrationSettings
from curvcal.settings.fields import settings_fields
from tests.commands.test_calibrate import as_json, one_line_error
from tests.commands.test_laplace_cli import TwoClass, arch, write_data, write_model


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[tuple[object, ...], Path, dict]:
    """A TwoClass checkpoint (head: 2×6 weights and a bias, P = 14), its data, and a full
    Laplace calibrator fitted on it: (calibrate arguments, calibrator, the report)."""
    from click.testing import CliRunner

    from curvcal.cli import main

    tmp = tmp_path_factory.mktemp("laplace-saved")
    model, ckpt = write_model(tmp, TwoClass)
    write_data(tmp / "fit.pt", model, 120, 1)
    write_data(tmp / "test.pt", model, 80, 2)
    calibrator = tmp / "cal.json"
    args = ("calibrate", ckpt, *arch(TwoClass), "--data", tmp / "test.pt")
    with CliRunner().isolation() as streams:
        code = main([str(a) for a in (*args, "--fit-data", tmp / "fit.pt", "--method",
                                      "laplace", "--laplace-structure", "full",
                                      "--save-calibrator", calibrator, "--json")])  # fmt: skip
        report = json.loads(streams[0].getvalue().decode())
    assert code == 0
    return args, calibrator, report


def _tampered(tmp_path: Path, calibrator: Path, **change: object) -> Path:
    document = json.loads(calibrator.read_text())
    document["laplace"] = {**document["laplace"], **change}
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(document))
    return path


def test_the_untampered_calibrator_applies(run_cli, fitted) -> None:
    args, calibrator, report = fitted
    applied = as_json(run_cli(*args, "--apply", calibrator, "--json"))["results"]
    assert applied["evaluation"]["laplace"]["accuracy"] == pytest.approx(
        report["results"]["evaluation"]["laplace"]["accuracy"], abs=0
    )


def test_negated_last_layer_weights_are_refused(run_cli, fitted, tmp_path: Path) -> None:
    """The file's weights would replace the model's head (accuracy falls to that of the
    negated head) though its provenance names this checkpoint: they must equal the model's."""
    args, calibrator, _ = fitted
    saved = json.loads(calibrator.read_text())["laplace"]
    negated = [[-w for w in row] for row in saved["weight"]]
    bad = _tampered(tmp_path, calibrator, weight=negated)
    one_line_error(
        run_cli(*args, "--apply", bad),
        str(bad),
        "its Laplace calibrator's weight differs from the weight of the model's layer 'head'",
    )
    bias = _tampered(tmp_path, calibrator, bias=[b + 1e-6 for b in saved["bias"]])
    one_line_error(run_cli(*args, "--apply", bias), str(bias), "bias differs")


@pytest.mark.parametrize(
    ("layer", "needle"),
    [
        ("no.such.layer", "'no.such.layer' is not a layer of the model"),
        ("body.0", "'body.0' is a layer, but the model's last nn.Linear is 'head'"),
        ("__class__.__init__", "'__class__.__init__' is not a layer of the model"),
        ("head; import os", "is not a module path"),
    ],
)
def test_a_layer_that_is_not_the_last_linear_is_refused(
    run_cli, fitted, tmp_path: Path, layer: str, needle: str
) -> None:
    args, calibrator, _ = fitted
    bad = _tampered(tmp_path, calibrator, layer=layer)
    one_line_error(run_cli(*args, "--apply", bad), str(bad), needle)


def _covariance(calibrator: Path) -> torch.Tensor:
    return torch.tensor(json.loads(calibrator.read_text())["laplace"]["covariance"])


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (lambda c: c.fill_diagonal_(-1e-3), "covariance has a negative diagonal entry"),
        (lambda c: c.__setitem__((0, 1), c[0, 1] + 1.0), "covariance is not symmetric"),
        (lambda c: c.__setitem__((0, 0), 1e300), "covariance 1e+300 is outside -1.0e+08..1.0e+08"),
        # within the elementwise bound, above 1/δ: (H + δI)⁻¹ ≼ δ⁻¹ I never allows it
        (lambda c: c.__setitem__((0, 0), 1e7), "above 1/prior_precision"),
        # symmetric, non-negative diagonal, not PSD: [[1, 2], [2, 1]] in the corner
        (lambda c: _corner(c), "covariance is not positive semi-definite"),
    ],
)
def test_a_covariance_that_is_not_a_posterior_is_refused(
    run_cli, fitted, tmp_path: Path, tamper, needle: str
) -> None:
    args, calibrator, _ = fitted
    covariance = _covariance(calibrator).double()
    tamper(covariance)
    bad = _tampered(tmp_path, calibrator, covariance=covariance.tolist())
    one_line_error(run_cli(*args, "--apply", bad), str(bad), needle)


def _corner(c: torch.Tensor) -> None:
    scale = float(c.diagonal().min())
    c[:2, :2] = torch.tensor([[1.0, 2.0], [2.0, 1.0]]) * scale


def test_monte_carlo_draws_share_the_option_and_policy_cap(run_cli, fitted, tmp_path) -> None:
    """10**9 draws would allocate 80 GB (exit 70): the saved count has the cap of
    --laplace-samples and the policy key, one constant."""
    (spec,) = [s for f, s in settings_fields(CalibrationSettings) if f.name == "laplace_samples"]
    assert spec.high == MAX_LAPLACE_SAMPLES
    args, calibrator, _ = fitted
    bad = _tampered(tmp_path, calibrator, predictive="mc", samples=10**9)
    one_line_error(
        run_cli(*args, "--apply", bad), str(bad), f"samples 1000000000 is outside 0..{spec.high}"
    )


def test_prior_precision_outside_the_searched_bracket_is_refused(run_cli, fitted, tmp_path) -> None:
    args, calibrator, _ = fitted
    bad = _tampered(tmp_path, calibrator, prior_precision=PRIOR_BRACKET[0] / 10)
    one_line_error(run_cli(*args, "--apply", bad), str(bad), "prior_precision 1e-09 is outside")


def test_a_platt_slope_past_the_coefficient_bound_is_refused(run_cli, tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    scores = tmp_path / "s.npz"
    np.savez(scores, logits=3 * rng.standard_normal((60, 2)), labels=rng.integers(0, 2, 60))
    calibrator = tmp_path / "cal.json"
    fit = run_cli("metrics", scores, "--val-split", "0.5", "--method", "platt",
                  "--save-calibrator", calibrator)  # fmt: skip
    assert fit.code == 0, fit.stderr
    document = json.loads(calibrator.read_text())
    document["platt"]["slope"] = 1e308
    calibrator.write_text(json.dumps(document))
    one_line_error(
        run_cli("metrics", scores, "--apply", calibrator),
        str(calibrator),
        "slope 1e+308 is outside -8.5e+37..8.5e+37",
    )
