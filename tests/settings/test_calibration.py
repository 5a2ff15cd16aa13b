"""CalibrationSettings is the one declaration of every calibration option: the options of
calibrate, metrics and study are its fields, its validation keeps the kernel's words, and the
report records it as one ``calibration`` group."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from curvcal.calibration.analysis import analyse_calibration
from curvcal.commands import load_command
from curvcal.errors import InputError, as_option, wording
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import click_options, default_of, record, settings_fields

FIELDS = {field.name: field for field, _spec in settings_fields(CalibrationSettings)}


def _options(command: str) -> dict[str, click.Option]:
    return {
        param.name: param
        for param in load_command(command).params
        if isinstance(param, click.Option) and param.name is not None
    }


@pytest.mark.parametrize("command", ["calibrate", "metrics"])
def test_every_field_is_an_option_of_the_same_name_and_default(command: str) -> None:
    options = _options(command)
    for name, field in FIELDS.items():
        option = options[name]
        assert option.opts == ["--" + name.replace("_", "-")]
        default = default_of(field)
        if default is not None and not isinstance(default, tuple):
            assert option.default == default, name


def test_study_takes_its_calibration_options_from_the_same_fields() -> None:
    options = _options("study")
    for name in ("val_split", "gammas", "bins"):
        assert options[name].help == _options("metrics")[name].help
    assert "objective" not in options and "nan_policy" not in options


@pytest.mark.parametrize("command", ["metrics", "study"])
def test_gammas_are_parsed_by_the_field_in_every_command(run_cli, command: str) -> None:
    args = ["metrics", "z.npz"] if command == "metrics" else ["study", "a.pt", "--data", "d"]
    result = run_cli(*args, "--gammas", "0,x")
    assert result.code == 2
    assert (
        "Invalid value for '--gammas': takes comma-separated numbers such as 0,0.5,1,2; "
        "got '0,x'" in result.stderr
    )


def test_a_command_taking_part_of_the_class_builds_the_rest_from_defaults() -> None:
    @click.command()
    @click_options(CalibrationSettings, "calibration", only=("bins", "val_split"))
    def command(calibration: CalibrationSettings) -> None:
        click.echo(json.dumps(record(calibration)))

    result = CliRunner().invoke(command, ["--bins", "7"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == record(CalibrationSettings(bins=7))
    refused = CliRunner().invoke(command, ["--seed", "3"])
    assert refused.exit_code == 2 and "No such option '--seed'" in refused.output


def test_the_report_records_the_settings_as_one_group(run_cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "z.npz"
    np.savez(path, logits=rng.standard_normal((40, 3)), labels=rng.integers(0, 3, 40))
    # the device is recorded as resolved (auto: cuda:0 on a GPU machine), so it is named here
    result = run_cli("metrics", path, "--bins", "5", "--seed", "2", "--val-split", "0.5",
                     "--gammas", "1,0", "--device", "cpu", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    asked = CalibrationSettings(
        method="both", bins=5, seed=2, val_split=0.5, gammas=(0.0, 1.0), device="cpu"
    )
    assert document["settings"] == {
        "logits": {
            "input_kind": "logits",
            "scores_key": "logits",
            "labels_key": "labels",
            "fit": None,
            "apply": None,
            "apply_anyway": False,
            "strict": False,
        },
        "calibration": record(asked),
    }
    assert document["results"]["settings"] == record(asked)


def test_the_kernel_fits_both_maps_when_no_method_is_given() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(40, 3, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (40,), generator=generator)
    settings = CalibrationSettings(gammas=(0.0, 1.0))
    fitted = analyse_calibration(
        logits[:20], labels[:20], logits[20:], labels[20:], "logits", settings
    )
    assert fitted.settings.method == "both"
    assert fitted.fits.ts is not None and fitted.fits.focal_ts is not None
    measured = analyse_calibration(None, None, logits, labels, "logits", settings, "none")
    assert measured.settings.method == "none" and measured.fits.ts is None


@pytest.mark.parametrize(
    ("changes", "what", "why"),
    [
        ({"bins": 0}, "--bins", "the number of bins must be an integer >= 1, got 0"),
        ({"gammas": (0.0, -1.0)}, "--gammas", "gamma must be a finite number >= 0, got -1.0"),
        ({"gammas": (0.0, 100.5)}, "--gammas", "gamma 100.5 is outside 0..100"),
        ({"bootstrap": -1}, "--bootstrap", "must be >= 0, got -1"),
        ({"method": "no-such-map"}, "--method", "unknown method 'no-such-map'"),
        ({"bins": 10_001}, "--bins", "must be an integer ≥ 1 and ≤ 10000, got 10001"),
        ({"seed": -1}, "--seed", "must be an integer ≥ 0"),
        ({"val_split": 1.0}, "--val-split", "must be a number > 0 and < 1, got 1.0"),
        ({"dpi": 5}, "--dpi", "must be an integer ≥ 10 and ≤ 2400, got 5"),
        ({"plot_classes": -1}, "--plot-classes", "must be an integer ≥ 0, got -1"),
        ({"nan_policy": "skip"}, "--nan-policy", "unknown value 'skip'"),
    ],
)
def test_each_error_names_the_option(changes: dict[str, object], what: str, why: str) -> None:
    """On the command line the error names the option; in Python, the field."""
    with wording(as_option), pytest.raises(InputError) as error:
        CalibrationSettings(**changes)  # type: ignore[arg-type]
    assert error.value.what == what
    assert why in error.value.why
    with pytest.raises(InputError) as in_python:
        CalibrationSettings(**changes)  # type: ignore[arg-type]
    assert in_python.value.what == what.lstrip("-").replace("-", "_")


def test_the_plot_decides_the_classwise_tables() -> None:
    assert CalibrationSettings(plot_classes=3).reliability_classes == 0
    with_plot = CalibrationSettings(plot_classes=3, plot=Path("r.png"))
    assert with_plot.reliability_classes == 3
    assert with_plot.outputs() == [("--plot", Path("r.png"))]
    assert dataclasses.replace(with_plot, plot=None).outputs() == []


def test_the_policy_keys_keep_their_defaults_and_words() -> None:
    from curvcal.policy.settings import DEFAULTS, Locator, check_choices

    policy_keys = ("fit_data", "val_split", "seed", "bins", "edges", "method", "objective",
                   "focal_objective", "gammas")  # fmt: skip
    assert {name: DEFAULTS[name] for name in policy_keys} == {
        "fit_data": None,
        "val_split": None,
        "seed": 0,
        "bins": 15,
        "edges": "left",
        "method": None,
        "objective": "nll",
        "focal_objective": "ece",
        "gammas": None,
    }
    where = Locator(None, {"focal_objective": "option"})  # type: ignore[arg-type]
    with pytest.raises(InputError) as error:
        check_choices({**DEFAULTS, "focal_objective": "mse"}, where)
    assert error.value.what == "--focal-objective"
    assert error.value.why == "focal_objective 'mse' is not one of ece, nll, adaece, adaece-grid"
