"""A policy's ``[settings]`` keys are settings fields: their kinds, ranges, choices and defaults
come from the fields; errors name the policy line or the option; and a check's report records
its settings in the groups every other report uses, so that a baseline of any command (1.x
included) compares like with like."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal.assets import demo_checkpoint
from curvcal.errors import InputError
from curvcal.policy import keys
from curvcal.policy.baseline import flat_settings, setting_differences
from curvcal.policy.parse import load_policy
from curvcal.policy.settings import DEFAULTS, Locator, check_choices, settings_of
from curvcal.settings.calibration import MAX_BINS, CalibrationSettings
from curvcal.settings.check import CheckSettings
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import DataSettings
from curvcal.settings.fields import defaults
from curvcal.settings.hessian import LOSSES, HessianSettings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return path


def test_every_key_takes_the_default_and_words_of_its_field() -> None:
    fields = {
        CheckpointSettings: defaults(CheckpointSettings),
        DataSettings: defaults(DataSettings),
        CalibrationSettings: defaults(CalibrationSettings),
        HessianSettings: defaults(HessianSettings),
        CheckSettings: defaults(CheckSettings),
    }
    for key, targets in keys.KEYS.items():
        cls, name = targets[0]
        if key != "gammas":  # unset: the class's grid
            assert DEFAULTS[key] == fields[cls][name], key
    assert DEFAULTS["probes"] == HessianSettings().probes == 100
    assert keys.choices("loss") == LOSSES  # flsd53 too, as `hessian --loss`
    assert keys.choices("eigen_method") == ("power", "lanczos")
    assert keys.choices("method") == (
        *("ts", "focal-ts", "both", "vector", "matrix", "laplace", "histogram"),
        *("histogram-ovr", "isotonic", "isotonic-ovr", "platt", "beta", "dirichlet"),
        *("dirichlet-l2", "ets", "bbq", "venn-abers", "all", "none"),
    )
    assert keys.choices("nan_policy") == ("error", "drop")
    assert keys.kind("bins").text == f"a whole number >= 1 and <= {MAX_BINS}"
    # seed sets both seeds: the tighter range of the two fields
    assert keys.KEYS["seed"] == ((CalibrationSettings, "seed"), (HessianSettings, "seed"))
    assert keys.kind("seed").text == "a whole number >= 0 and <= 2**63-1"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("probes = 1", "'probes' must be a whole number >= 2, not 1"),
        ("num_classes = 2000000", "'num_classes' must be a whole number >= 1 and <= 1000000"),
        ("nan_policy = 1", "'nan_policy' must be a string"),
        ("gammas = [0, -1]", "'gammas' must be a non-empty list of numbers >= 0"),
    ],
)
def test_a_value_outside_its_fields_range_is_refused_when_read(
    tmp_path: Path, line: str, why: str
) -> None:
    path = write(tmp_path, f"[settings]\nseed = 0\n{line}\n[ece]\nmax = 0.1\n")
    with pytest.raises(InputError) as info:
        load_policy(path)
    assert info.value.what == f"{path}:3" and why in info.value.why


def test_a_fields_error_names_the_policy_line_and_the_key(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, '[settings]\nnan_policy = "skip"\n[ece]\nmax = 1\n'))
    where = Locator(policy, {"nan_policy": "policy"})
    with pytest.raises(InputError) as info:
        check_choices({**DEFAULTS, "nan_policy": "skip"}, where)
    assert info.value.what == f"{policy.path}:2"
    assert info.value.why == "nan_policy 'skip' is not one of error, drop"
    # a bound that depends on another field (the trace methods need 4 probes) is checked
    # through the field before the settings are built, and named by the policy's key
    policy = load_policy(write(tmp_path, "[settings]\nprobes = 3\n[trace]\nmax = 1\n"))
    where = Locator(policy, {"probes": "policy"})
    with pytest.raises(InputError) as info:
        settings_of(HessianSettings, {**DEFAULTS, "probes": 3}, where, trace_method="hutchpp")
    assert info.value.what == f"{policy.path}:2"
    assert info.value.why == "probes must be an integer ≥ 4, got 3"
    # a key that names a field of another name is named as the policy spells it
    where = Locator(policy, {"eigen_method": "option"})
    with pytest.raises(InputError) as info:
        settings_of(HessianSettings, {**DEFAULTS, "eigen_method": "qr"}, where)
    assert info.value.what == "--eigen-method"
    assert info.value.why == "eigen_method 'qr' is not one of power, lanczos"


def test_settings_of_converts_what_toml_holds() -> None:
    where = Locator(None, {})  # type: ignore[arg-type]
    values = {**DEFAULTS, "data": "d.pt", "data_root": "roots", "tokenizer": "tok"}
    data = settings_of(DataSettings, values, where)
    assert data.data_root == Path("roots") and data.tokenizer == Path("tok")
    calibration = settings_of(CalibrationSettings, {**DEFAULTS, "gammas": [2, 0]}, where)
    assert calibration.gammas == (0.0, 2.0)
    hessian = settings_of(HessianSettings, {**DEFAULTS, "tol": 1, "seed": 5}, where)
    assert hessian.tol == 1.0 and isinstance(hessian.tol, float) and hessian.seed == 5


def test_a_loaders_complaint_about_a_policy_value_names_the_policy_line(
    run_cli, tmp_path: Path
) -> None:
    text = '[settings]\ndata = "curvcal:digits"\ndevice = "tpu"\n[ece]\nmax = 1\n'
    path = write(tmp_path, text)
    result = run_cli("check", demo_checkpoint(), "--policy", path)
    assert result.code == 2, result.output
    assert f"{path}:3: " in result.stderr and "'tpu' is not a device" in result.stderr
    assert "--device" not in result.stderr.split("is not a device")[0]
    # typed on the command line, the same value is the option's
    result = run_cli("check", demo_checkpoint(), "--policy", path, "--device", "tpu")
    assert result.code == 2 and "--device" in result.stderr


def test_the_check_report_groups_its_settings_like_hessian_and_compare(
    run_cli, tmp_path: Path
) -> None:
    text = (
        '[settings]\ndata = "curvcal:digits"\ndevice = "cpu"\nmax_samples = 60\nseed = 3\n'
        'eigen_method = "lanczos"\ntol = 1e-2\nprobes = 4\nnan_policy = "drop"\n'
        "[lambda_max]\nmax = 1000\n[trace]\nmax = 1e6\n[ts.ece]\nmax = 1\n"
    )
    result = run_cli(
        "check", demo_checkpoint(), "--policy", write(tmp_path, text), "--json",
        "--batch-size", "30", "-o", tmp_path / "check.json",
    )  # fmt: skip
    assert result.code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert set(settings) == {"checkpoint", "data", "calibration", "hessian", "check"}
    assert all(isinstance(group, dict) for group in settings.values())
    assert settings["data"]["max_samples"] == 60 and settings["data"]["batch_size"] == 30
    assert settings["calibration"]["seed"] == settings["hessian"]["seed"] == 3
    assert settings["calibration"]["nan_policy"] == "drop"
    assert settings["calibration"]["method"] == "ts" and settings["hessian"]["method"] == "lanczos"
    assert settings["checkpoint"]["device"] == "cpu"
    assert settings["check"]["strict"] is False and settings["check"]["rules"]
    # hessian's report with the same options: the settings both record are the same
    hessian = run_cli(
        "hessian", demo_checkpoint(), "--data", "curvcal:digits", "--max-samples", "60",
        "--batch-size", "30", "--device", "cpu", "--seed", "3", "--method", "lanczos",
        "--tol", "1e-2", "--probes", "4", "-o", tmp_path / "h.json", "--quiet",
    )  # fmt: skip
    assert hessian.code == 0, hessian.output
    old = json.loads((tmp_path / "h.json").read_text())
    new = json.loads((tmp_path / "check.json").read_text())
    shared = flat_settings(new).keys() & flat_settings(old).keys()
    assert {"hessian.seed", "hessian.tol", "data.max_samples", "checkpoint.device"} <= shared
    assert setting_differences(new, old) == []
    compared = run_cli(
        "compare", tmp_path / "check.json", tmp_path / "h.json", "--policy",
        tmp_path / "gate.toml", "--json",
    )  # fmt: skip
    assert set(json.loads(compared.stdout)["settings"]) == {"compare"}


def test_a_v1_check_report_reads_as_todays_groups() -> None:
    old = {
        "schema": "1.3",
        "command": "check",
        "results": {},
        "settings": {
            "data": "curvcal:digits", "seed": 3, "eigen_method": "lanczos", "trace": True,
            "method": None, "gammas": None, "val_split": None, "bins": 15, "fit_data": None,
            "rules": [], "strict": False, "arch_kwargs": {},
        },
    }  # fmt: skip
    flat = flat_settings(old)
    assert flat["data.data"] == "curvcal:digits"
    assert flat["calibration.seed"] == flat["hessian.seed"] == 3
    assert flat["hessian.method"] == "lanczos" and flat["hessian.trace"] is True
    assert flat["calibration.bins"] == 15 and flat["checkpoint.arch_kwargs"] == {}
    assert flat["check.strict"] is False and flat["check.fit_data"] is None
    # None there meant "chosen by the check", not a value to compare
    assert "calibration.method" not in flat and "calibration.gammas" not in flat
    new = {
        "schema": "2.0",
        "settings": {"calibration": {"seed": 4, "method": "ts"}, "hessian": {"seed": 3}},
    }
    assert setting_differences(new, old) == ["--seed: 3 → 4"]
