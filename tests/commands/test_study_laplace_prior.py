"""`study` takes the Laplace map's settings (`--laplace-prior` and the others) from the
calibration settings, as `calibrate` does: the same data, split and seed give the same fitted
map; typed without a Laplace map in `--maps`, they are refused as `calibrate` refuses them."""

from __future__ import annotations

import json

from tests.commands.test_calibrate import CKPT, DATA, as_json

QUICK_HESSIAN = ("--probes", "4", "--max-iter", "3")


def test_study_fits_the_laplace_map_calibrate_fits_with_the_nll_prior(run_cli) -> None:
    rule = ("--laplace-prior", "nll")
    studied = run_cli("study", CKPT, *DATA, "--maps", "laplace", *rule, *QUICK_HESSIAN, "--json")
    assert studied.code == 0, studied.output
    document = json.loads(studied.stdout)
    assert document["settings"]["calibration"]["laplace_prior"] == "nll"
    (row,) = document["results"]["rows"]
    calibrated = as_json(run_cli("calibrate", CKPT, *DATA, "--method", "laplace", *rule, "--json"))
    fit = calibrated["results"]["fits"]["laplace"]
    assert fit["prior_rule"] == "nll" and abs(fit["prior_precision"] - 485.4) < 0.5
    # the same δ gives the same predictive: the evaluation split's numbers agree exactly
    assert row["calibration"]["maps"]["laplace"] == {
        key: calibrated["results"]["evaluation"]["laplace"][key] for key in ("ece", "nll")
    }
    # and differ from the marginal-likelihood rule's map (δ = 4.16: ECE 0.462)
    assert abs(row["calibration"]["maps"]["laplace"]["ece"] - 0.0266) < 1e-3


def test_laplace_options_without_a_laplace_map_are_refused(run_cli) -> None:
    result = run_cli("study", CKPT, *DATA, "--laplace-prior", "nll", *QUICK_HESSIAN)
    assert result.code == 2
    assert "--maps both fits no map that --laplace-prior would shape" in result.output
    assert "Traceback" not in result.output
