"""Where the calibration maps run (:mod:`curvcal.calibration.device`), on the CPU.

The device path of temperature scaling and focal TS is the CPU's torch code with the tensors on
the device and larger row chunks: run here with the device's chunking, it must land on the
exact optimum (checked against a dense float64 derivative) and on the CPU's numbers. The
setting must reach the kernels as itself, and every map is placed once, with a reason when it
stays on the CPU. ``tests/cuda/test_cuda_maps_on_device.py`` runs the same fits on a device.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from curvcal.calibration import analysis as analysis_module
from curvcal.calibration import inputs, maps
from curvcal.calibration import metrics as metrics_module
from curvcal.calibration import registry as registry_module
from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.device import (
    CPU_REASONS,
    DEVICE_STAGES,
    METRICS,
    cpu_note,
    map_device,
    placement,
    stage_device,
)
from curvcal.calibration.ensemble import fit_ensemble_temperature
from curvcal.calibration.metrics import calibration_metrics
from curvcal.calibration.registry import MAPS
from curvcal.calibration.scaling import fit_focal_temperature, fit_temperature
from curvcal.errors import InputError, as_option, wording
from curvcal.settings.calibration import CalibrationSettings

#: the tolerance the device is held to (float64 on both; the sums' order differs)
DEVICE_ATOL = 1e-9


def _overconfident(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits 2.5·z with labels drawn from softmax(z): the NLL's optimum is near T = 2.5."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=generator, dtype=torch.float64) * 2
    labels = torch.multinomial(torch.softmax(z, dim=1), 1, generator=generator)[:, 0]
    return (2.5 * z).to(torch.float32), labels


def test_every_map_is_placed_once_with_a_reason_when_it_stays_on_the_cpu() -> None:
    assert set(DEVICE_STAGES).isdisjoint(CPU_REASONS)
    assert set(DEVICE_STAGES) | set(CPU_REASONS) == set(MAPS)
    assert all(reason.strip() for reason in CPU_REASONS.values())


def test_a_device_name_is_read_as_torch_reads_it() -> None:
    expected_auto = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert map_device("auto") == expected_auto
    assert map_device(" CPU ") == torch.device("cpu")
    assert map_device("cuda:1") == torch.device("cuda", 1)  # read, not checked for presence
    with pytest.raises(InputError, match="'tpu' is not a device"):
        map_device("tpu")


def test_only_the_maps_with_a_device_kernel_leave_the_cpu() -> None:
    assert stage_device("ts", "cuda:1") == torch.device("cuda", 1)
    assert stage_device("focal_ts", "cuda") == torch.device("cuda")
    assert stage_device("histogram", "cuda:1") == torch.device("cpu")
    assert stage_device(METRICS, "cuda:1") == torch.device("cuda", 1)
    assert placement(["ts", "isotonic"], "cuda:0") == {
        "ts": "cuda:0",
        "isotonic": "cpu",
        "metrics": "cuda:0",
    }
    assert placement(["ts"], "cpu") == {"ts": "cpu", "metrics": "cpu"}


def test_a_run_on_a_device_names_the_maps_that_stay_on_the_cpu_and_why() -> None:
    assert cpu_note(["ts", "histogram"], "cpu") is None
    note = cpu_note(["ts", "histogram", "isotonic", "matrix"], "cuda:0")
    assert note is not None and note.startswith("device cuda:0: ")  # Python names the field
    with wording(as_option):  # the command line names the option
        said_on_command_line = cpu_note(["ts", "histogram"], "cuda:0")
    assert said_on_command_line is not None
    assert said_on_command_line.startswith("--device cuda:0: ")
    assert "histogram" in note and "isotonic" in note and "matrix" in note
    assert CPU_REASONS["histogram"] in note and CPU_REASONS["matrix"] in note
    assert "ts" not in note  # TS runs on the device
    assert cpu_note(["ts", "focal_ts", "ets"], "cuda") is None  # nothing stays: nothing said


def test_the_devices_chunking_lands_on_the_optimum_and_the_cpus_numbers() -> None:
    # the device path differs from the CPU's only in its chunks: 9 chunks here against 1
    assert inputs.chunk_rows(50, torch.device("cuda")) > 12_000 > 8 * inputs.chunk_rows(50)
    logits, labels = _overconfident(12_000, 50)
    cpu_ts = fit_temperature(logits, labels)
    cpu_focal = fit_focal_temperature(logits, labels, gammas=(0.0, 1.0, 2.0))
    cpu_ets = fit_ensemble_temperature(logits, labels)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inputs, "CHUNK_ELEMENTS", inputs.DEVICE_CHUNK_ELEMENTS)
        assert inputs.chunk_rows(50) > 12_000
        ts = fit_temperature(logits, labels, device=torch.device("cpu"))
        focal = fit_focal_temperature(
            logits, labels, gammas=(0.0, 1.0, 2.0), device=torch.device("cpu")
        )
        applied = maps.calibrated_log_probabilities(
            logits, "logits", "z", ts.temperature, 0.0, device=torch.device("cpu")
        )
        ets = fit_ensemble_temperature(logits, labels, device=torch.device("cpu"))
        ets_applied = ets.calibrator.apply(logits, device=torch.device("cpu"))
    # the truth: the NLL's derivative in T vanishes there (dense float64, one pass)
    z = logits.to(torch.float64) / ts.temperature
    p = torch.softmax(z, dim=1)
    slope = float(((p * z).sum(dim=1) - z.gather(1, labels[:, None])[:, 0]).mean())
    assert abs(slope) < 1e-9 and 2.0 < ts.temperature < 3.0
    assert ts.temperature == pytest.approx(cpu_ts.temperature, abs=DEVICE_ATOL)
    assert ts.nll_after == pytest.approx(cpu_ts.nll_after, abs=DEVICE_ATOL)
    assert focal.gamma == cpu_focal.gamma
    assert focal.temperature == pytest.approx(cpu_focal.temperature, abs=DEVICE_ATOL)
    assert focal.objective_after == pytest.approx(cpu_focal.objective_after, abs=DEVICE_ATOL)
    reference = torch.log_softmax(z, dim=1)
    assert torch.allclose(applied, reference, rtol=0, atol=1e-12)
    # ETS: the same T, the same simplex weights, and its map is log Σ w_i q_i (dense)
    assert ets.temperature == pytest.approx(cpu_ets.temperature, abs=DEVICE_ATOL)
    assert ets.weights == pytest.approx(cpu_ets.weights, abs=DEVICE_ATOL)
    w_ts, w_un, w_u = ets.weights
    uncalibrated = torch.softmax(logits.to(torch.float64), dim=1)
    mixed = w_ts * torch.softmax(z, dim=1) + w_un * uncalibrated + w_u / 50
    assert torch.allclose(ets_applied, mixed.log(), rtol=0, atol=1e-12)


def test_the_setting_reaches_the_kernels_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """``settings.device`` arrives at the TS and focal TS fits and at their apply as a device;
    the kernels are spied on and run on the CPU (no CUDA is needed)."""
    seen: list[tuple[str, torch.device | None]] = []

    def spy(name: str, kernel):  # type: ignore[no-untyped-def]
        def run(*args, device=None, **kwargs):  # type: ignore[no-untyped-def]
            seen.append((name, device))
            return kernel(*args, **kwargs)

        return run

    entries = registry_module.MAPS  # each entry's fit, rebuilt around a spy with its own options
    for stage, name, kernel, options in (
        ("ts", "fit ts", fit_temperature, registry_module._ts_options),
        ("focal_ts", "fit focal", fit_focal_temperature, registry_module._focal_ts_options),
    ):
        fit = registry_module._fit_with(spy(name, kernel), options=options)
        monkeypatch.setitem(entries, stage, dataclasses.replace(entries[stage], fit=fit))
    monkeypatch.setattr(
        maps, "calibrated_log_probabilities", spy("apply", maps.calibrated_log_probabilities)
    )
    monkeypatch.setattr(analysis_module, "calibration_metrics", spy("metrics", calibration_metrics))
    logits, labels = _overconfident(400, 4)
    settings = CalibrationSettings(method="both", gammas=(0.0, 1.0), device="cuda:1")
    analysis = analyse_calibration(
        logits[:200], labels[:200], logits[200:], labels[200:], "logits", settings, "fit-data"
    )
    on = torch.device("cuda", 1)
    assert seen == [
        ("metrics", on),  # uncalibrated
        ("fit ts", on),
        ("fit focal", on),
        ("apply", on),
        ("metrics", on),
        ("apply", on),
        ("metrics", on),
    ]
    assert analysis.settings.device == "cuda:1"
    seen.clear()
    analyse_calibration(
        logits[:200],
        labels[:200],
        logits[200:],
        labels[200:],
        "logits",
        dataclasses.replace(settings, device="cpu"),
        "fit-data",
    )
    assert {device for _name, device in seen} == {torch.device("cpu")}


def test_the_metrics_pass_in_device_sized_chunks_gives_the_dense_numbers() -> None:
    logits, labels = _overconfident(3_000, 200, seed=1)  # 3 chunks of the CPU's scan
    cpu = calibration_metrics(logits, labels, bins=10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics_module, "SCAN_ELEMENTS", inputs.DEVICE_CHUNK_ELEMENTS)
        one_chunk = calibration_metrics(logits, labels, bins=10, device=torch.device("cpu"))
    p = torch.softmax(logits.to(torch.float64), dim=1)
    truth = {
        "accuracy": float((p.argmax(dim=1) == labels).to(torch.float64).mean()),
        "mean_confidence": float(p.max(dim=1).values.mean()),
        "nll": float(-p.gather(1, labels[:, None]).log().mean()),
        "brier": float(((p - torch.nn.functional.one_hot(labels, 200)) ** 2).sum(dim=1).mean()),
    }
    for name, value in truth.items():
        assert getattr(one_chunk, name) == pytest.approx(value, rel=1e-12), name
    for name in ("ece", "mce", "adaece", "classwise_ece", "rms_ce", "smooth_ece", "ks_ce"):
        assert getattr(one_chunk, name) == pytest.approx(getattr(cpu, name), abs=DEVICE_ATOL)
