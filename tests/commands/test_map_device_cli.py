"""``--device`` of ``metrics`` and ``calibrate`` as the maps' device, on the CPU: named
explicitly, recorded in the JSON (settings and, per map, environment), refused in one line
(exit 2) when it is no device or is absent, and said once on a device."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.device import CPU_REASONS
from curvcal.console import Reporter
from curvcal.errors import as_option, wording
from curvcal.pipeline.calibration import where_maps_ran
from curvcal.settings.calibration import CalibrationSettings
from tests.console_text import said, times_said


def _logits_file(tmp_path: Path, n: int = 400, k: int = 4) -> Path:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((n, k)) * 3
    labels = np.argmax(logits + rng.standard_normal((n, k)) * 3, axis=1)
    path = tmp_path / "z.npz"
    np.savez(path, logits=logits.astype(np.float32), labels=labels)
    return path


def test_metrics_on_the_cpu_named_records_where_every_map_ran(run_cli, tmp_path: Path) -> None:
    path = _logits_file(tmp_path)
    result = run_cli("metrics", path, "--val-split", "0.5", "--method", "all", "--device",
                     "cpu", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["calibration"]["device"] == "cpu"
    environment = document["environment"]
    assert environment["device"] == "cpu"
    ran = set(document["results"]["fits"])
    assert {"ts", "focal_ts", "histogram", "isotonic"} <= ran
    assert environment["map_devices"] == {**{stage: "cpu" for stage in ran}, "metrics": "cpu"}
    assert not said("run on the CPU", result.stderr)  # nothing to say on the CPU


@pytest.mark.parametrize(
    ("device", "why"),
    [
        ("tpu", "'tpu' is not a device"),
        pytest.param(
            "cuda",
            "cuda requested but CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present"),
        ),
    ],
)
def test_a_device_that_is_none_or_absent_is_refused_in_one_line(
    run_cli, tmp_path: Path, device: str, why: str
) -> None:
    path = _logits_file(tmp_path)
    result = run_cli("metrics", path, "--val-split", "0.5", "--device", device)
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("curvcal: error: --device: ") and why in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_calibrate_has_one_device_the_models_and_the_maps(run_cli) -> None:
    help_text = run_cli("calibrate", "--help").stdout
    assert help_text.count("--device") == 1
    result = run_cli("calibrate", str(demo_checkpoint()), "--data", "curvcal:digits",
                     "--max-samples", "120", "--device", "cpu", "--method", "ts",
                     "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["checkpoint"]["device"] == "cpu"
    assert document["settings"]["calibration"]["device"] == "cpu"
    assert document["environment"]["map_devices"] == {"ts": "cpu", "metrics": "cpu"}


def test_a_run_on_a_device_says_once_which_maps_stay_on_the_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a run on ``cuda:0`` says and records (the analysis is made on the CPU and then
    marked as that device's: the saying reads only the settings and the stages that ran)."""
    rng = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 3, generator=rng) * 3
    labels = torch.randint(0, 3, (300,), generator=rng)
    settings = CalibrationSettings(method="all", device="cpu")
    analysis = analyse_calibration(
        logits[:150], labels[:150], logits[150:], labels[150:], "logits", settings, "fit-data"
    )
    on_device = dataclasses.replace(analysis, settings=settings.replace(device="cuda:0"))
    with wording(as_option):  # as the command line says it
        placed = where_maps_ran(on_device, Reporter(quiet=False))
    stderr = capsys.readouterr().err
    assert placed["ts"] == placed["focal_ts"] == "cuda:0"
    assert placed["metrics"] == "cuda:0" and placed["histogram"] == "cpu"
    assert times_said("these maps run on the CPU", stderr) == 1
    assert said(CPU_REASONS["isotonic"], stderr)
    assert said("--device cuda:0", stderr)
    placed_on_cpu = where_maps_ran(analysis, Reporter(quiet=False))
    assert capsys.readouterr().err == "" and set(placed_on_cpu.values()) == {"cpu"}
