"""`calibrate --method laplace --laplace-prior nll` on the bundled digits model: the figures
docs/guide/calibration.md quotes for both prior rules, the fits table, and the option refused
where it would do nothing."""

from __future__ import annotations

import pytest

from tests.commands.test_calibrate import CKPT, DATA, as_json


def test_digits_figures_of_both_prior_rules(run_cli) -> None:
    args = ("calibrate", CKPT, *DATA, "--method", "laplace", "--json")
    marglik = as_json(run_cli(*args))["results"]
    nll = as_json(run_cli(*args, "--laplace-prior", "nll"))["results"]
    assert marglik["fits"]["laplace"]["prior_rule"] == "marglik"
    assert marglik["fits"]["laplace"]["heldout_nll"] is None
    assert marglik["fits"]["laplace"]["prior_precision"] == pytest.approx(4.16, rel=1e-3)
    assert marglik["evaluation"]["laplace"]["ece"] == pytest.approx(0.462, abs=1e-3)
    assert marglik["evaluation"]["laplace"]["nll"] == pytest.approx(0.710, abs=1e-3)
    fit = nll["fits"]["laplace"]
    assert fit["prior_rule"] == "nll" and fit["prior_folds"] == 5
    assert fit["prior_bracket"] == [1e-8, 1e8] and not fit["at_bracket_end"]
    assert fit["prior_precision"] == pytest.approx(485.4, rel=1e-3)
    evaluation = nll["evaluation"]
    assert evaluation["uncalibrated"]["ece"] == pytest.approx(0.022, abs=1e-3)
    assert evaluation["laplace"]["ece"] == pytest.approx(0.027, abs=1e-3)
    assert evaluation["laplace"]["nll"] == pytest.approx(0.104, abs=1e-3)
    # the held-out rule beats the evidence on the evaluation split here
    assert evaluation["laplace"]["nll"] < marglik["evaluation"]["laplace"]["nll"]
    # the evaluation split is the same for both rules
    assert evaluation["uncalibrated"] == marglik["evaluation"]["uncalibrated"]


def test_fits_table_names_the_rule(run_cli) -> None:
    table = run_cli("calibrate", CKPT, *DATA, "--method", "laplace", "--laplace-prior", "nll",
                    "--laplace-structure", "kron")  # fmt: skip
    assert table.code == 0, table.output
    assert "held-out NLL (5 folds)" in table.stdout and "held-out NLL at δ" in table.stdout


def test_laplace_prior_without_laplace_is_refused(run_cli) -> None:
    result = run_cli("calibrate", CKPT, *DATA, "--method", "ts", "--laplace-prior", "nll")
    assert result.code == 2 and "--laplace-prior" in result.output


@pytest.mark.parametrize(
    ("structure", "previous_delta", "ece", "nll"),
    [("full", 339.3523257789349, 0.014, 0.090), ("kron", 264.80411156948, 0.012, 0.083)],
)
def test_digits_monte_carlo_prior_is_the_delta_asking_every_grid_point_chose(
    run_cli, structure, previous_delta, ece, nll
) -> None:
    """The Monte Carlo search asks the held-out NLL only on its descent from the probit minimum;
    on the digits it still chooses the δ that asking all 65 grid points then Brent's bounded
    method chose (``previous_delta``: that search's output), to its tolerance, and the guide's
    table figures follow."""
    result = run_cli("calibrate", CKPT, *DATA, "--method", "laplace", "--laplace-prior", "nll",
                     "--laplace-predictive", "mc", "--laplace-samples", "100",
                     "--laplace-structure", structure, "--json")  # fmt: skip
    document = as_json(result)["results"]
    assert document["fits"]["laplace"]["prior_precision"] == pytest.approx(previous_delta, rel=1e-6)
    assert document["evaluation"]["laplace"]["ece"] == pytest.approx(ece, abs=1e-3)
    assert document["evaluation"]["laplace"]["nll"] == pytest.approx(nll, abs=1e-3)
