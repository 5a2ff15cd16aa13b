"""`curvcal.pipeline.check`: what a policy needs measured, settings precedence, and run_check's numbers
against the calibration engine called directly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from curvcal.assets import demo_checkpoint
from curvcal.errors import InputError
from curvcal.pipeline.check import run_check
from curvcal.policy.baseline import measured_values
from curvcal.policy.evaluate import MetricValue
from curvcal.policy.parse import Rule, load_policy
from curvcal.policy.settings import DEFAULTS, needs, resolve_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([Rule("ece", max=0.1, stage="uncalibrated")], (True, False, False, False, False, "none")),
        ([Rule("ece", max=0.1, stage="ts")], (True, True, False, False, False, "ts")),
        ([Rule("temperature", max=3.0)], (True, True, False, False, False, "ts")),
        ([Rule("focal_gamma", max=3.0)], (True, False, True, False, False, "focal-ts")),
        (
            [Rule("nll", max=1, stage="focal_ts"), Rule("brier", max=1, stage="ts")],
            (True, True, True, False, False, "both"),
        ),
        ([Rule("lambda_max", max=1.0)], (False, False, False, True, False, "none")),
        ([Rule("trace", max=1.0)], (False, False, False, True, True, "none")),
    ],
)
def test_needs_only_what_the_rules_gate(rules: list[Rule], expected: tuple) -> None:
    need = needs(rules)
    assert (
        need.predictions,
        need.ts,
        need.focal_ts,
        need.hessian,
        need.trace,
        need.method,
    ) == expected


def test_settings_precedence_option_then_policy_then_default(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, "[settings]\nseed = 3\nbins = 10\n[ece]\nmax = 1\n"))
    settings, sources = resolve_settings(policy, {"seed": 7, "device": None})
    assert (settings["seed"], sources["seed"]) == (7, "option")
    assert (settings["bins"], sources["bins"]) == (10, "policy")
    assert (settings["device"], sources["device"]) == (DEFAULTS["device"], "default")
    with pytest.raises(InputError, match="unknown settings"):
        resolve_settings(policy, {"sede": 1})


def test_run_check_equals_the_calibration_engine(tmp_path: Path) -> None:
    from curvcal.calibration.analysis import CalibrationSettings, analyse_calibration
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.load.datasets.labels import stratified_split
    from curvcal.pipeline.inference import predict_logits
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

    text = (
        '[settings]\ndata = "curvcal:digits"\ndevice = "cpu"\nmax_samples = 100\n'
        "val_split = 0.4\nseed = 2\nbins = 10\n"
        "[ts.ece]\nmax = 1\n[temperature]\nmax = 100\n[accuracy]\nmin = 0.99\n"
    )
    policy = load_policy(write(tmp_path, text))
    result = run_check(policy, demo_checkpoint())
    assert result.hessian is None and result.calibration is not None

    # The reference: the same split and fit through the engine, without the gate.
    loaded = load_model(demo_checkpoint(), CheckpointSettings(device="cpu"))
    data = load_dataset(DataSettings(data="curvcal:digits", max_samples=100))
    logits, labels = predict_logits(loaded.module, iter_batches(data.dataset, 256), loaded.device)
    fit, held = stratified_split(labels, 0.4, 2)
    reference = analyse_calibration(
        logits[fit],
        labels[fit],
        logits[held],
        labels[held],
        "logits",
        CalibrationSettings(method="ts", bins=10, seed=2),
        "val-split",
        0.4,
    )
    assert reference.fits.ts is not None and reference.evaluation.ts is not None
    assert result.values["ts.ece"].value == reference.evaluation.ts.ece
    assert result.values["temperature"].value == reference.fits.ts.temperature
    accuracy = reference.evaluation.uncalibrated.accuracy
    assert result.values["accuracy"].value == accuracy
    # accuracy below 0.99 fails exactly when the reference says so
    assert result.verdict.rows[-1].passed == (accuracy >= 0.99)


def test_measured_values_maps_nonfinite_to_none() -> None:
    from curvcal.curvature.results import EigenResult, EigenSpectrum, HessianAnalysis

    value = EigenResult(math.nan, 1, 1, 0.0, 0.0, True)
    spectrum = EigenSpectrum((value,), "power", "largest", 1e-4, 1, True)
    analysis = HessianAnalysis(math.nan, None, spectrum, None, None, None, None, {}, {})
    values = measured_values(analysis, None)
    assert values["lambda_max"] == MetricValue(None)
    assert "trace" in values and values["trace"] == MetricValue(None)  # not measured: null
    assert "ece" not in values


@pytest.mark.parametrize(
    ("settings", "what"),
    [
        ('method = "ts"', ":2"),
        ('objective = "mse"', ":2"),
        ("bins = 1\nedges = 'middle'", ":3"),
    ],
)
def test_bad_settings_name_the_policy_line(tmp_path: Path, settings: str, what: str) -> None:
    text = f"[settings]\n{settings}\ndata = 'curvcal:digits'\n[focal_ts.ece]\nmax = 1\n"
    policy = load_policy(write(tmp_path, text))
    with pytest.raises(InputError) as info:
        run_check(policy, demo_checkpoint())
    assert info.value.what.endswith(what)


def test_option_is_named_when_it_set_the_bad_value(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, "[settings]\ndata = 'curvcal:digits'\n[trace]\nmax = 1\n"))
    with pytest.raises(InputError) as info:
        run_check(policy, demo_checkpoint(), {"dtype": "int8"})
    assert info.value.what == "--dtype"
