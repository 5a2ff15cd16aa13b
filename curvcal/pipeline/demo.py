"""``curvcal demo``: the bundled checkpoint inspected, its held-out digits predicted, and the
bundled policy's gate run on them (Hessian, calibration, verdict), all in one run session.

The model is loaded once and the digits predicted once (:mod:`curvcal.pipeline.session`):
accuracy, mean confidence and the calibration analysis come from the same predictions, and the
Hessian is the session's (the analysis behind ``curvcal hessian``). The measurement settings
are the bundled policy's ``[settings]``, read as ``curvcal check`` reads them, so
``curvcal check`` on the bundled checkpoint and policy judges the same numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.results import STATUS_OK, Report

if TYPE_CHECKING:
    import torch

    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.console import Reporter
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.pipeline.check import CheckResult
    from curvcal.policy.parse import Policy
    from curvcal.settings.calibration import CalibrationSettings
    from curvcal.settings.hessian import HessianSettings


@dataclass(frozen=True)
class DemoRequest:
    """The demo's one knob, and the plot files it will write (recorded in the results)."""

    batch_size: int = 1024
    plots: tuple[Path, ...] = ()


@dataclass(frozen=True)
class DemoRun:
    """The demo's measurements: what the checkpoint holds (``info``), the held-out digits'
    accuracy and mean confidence, the check (with its Hessian and calibration analyses), the
    policy file, the device, and the report of it all."""

    info: Any
    n_samples: int
    accuracy: float
    mean_confidence: float
    check: CheckResult
    policy_path: Path
    device: str
    report: Report


@dataclass(frozen=True)
class _Gate:
    """The bundled policy read as ``curvcal check`` reads it: its evaluation ``settings`` and
    their ``sources``, and the Hessian and calibration settings they make."""

    policy: Policy
    settings: dict[str, Any]
    sources: dict[str, str]
    hessian: HessianSettings
    calibration: CalibrationSettings


def run_demo(request: DemoRequest, reporter: Reporter) -> DemoRun | None:
    """Inspect, predict and check the bundled example in one run session, saying each step on
    ``reporter``. Under torchrun every rank predicts its shard and sums the Hessian's products;
    rank 0 gets the predictions, measures and judges, and returns the run (``None`` on the
    other ranks)."""
    from curvcal.assets import demo_checkpoint, demo_data, demo_policy
    from curvcal.calibration.metrics import accuracy as top1_accuracy
    from curvcal.calibration.metrics import mean_confidence
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.load.checkpoints.inspect import inspect_checkpoint
    from curvcal.pipeline.provenance import environment
    from curvcal.pipeline.session import open_session
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.settings.fields import groups

    checkpoint, policy_path = demo_checkpoint(), demo_policy()
    gate = _read_gate(policy_path, request.batch_size)
    checkpoint_settings = CheckpointSettings(device=gate.settings["device"])
    data_settings = DataSettings(data=gate.settings["data"], batch_size=request.batch_size)
    timings: dict[str, float] = {}
    with open_session(checkpoint_settings, reporter, (data_settings,)) as session:

        def say(text: str) -> None:
            session.reporter.info(text, markup=True)  # the bundled names only: no escape needed

        say(f"[bold]1. inspect[/bold] the bundled checkpoint {checkpoint.name}")
        began = time.perf_counter()
        info = inspect_checkpoint(checkpoint)
        timings["inspect"] = time.perf_counter() - began

        say("[bold]2. predict[/bold] the held-out digits with it")
        loaded = session.model(checkpoint)
        resolved = session.hessian_settings(loaded, gate.hessian)
        data = session.dataset(loaded, data_settings)
        predictions = session.predict(loaded, data, request.batch_size)

        say(
            "[bold]3. calibrate, hessian and check[/bold]: the bundled policy "
            f"{policy_path.name} gates calibration (TS and focal TS fitted on half the digits, "
            "measured on the other half) and curvature (top-3 eigenvalues by Lanczos, and the "
            "trace of the Hessian of the mean loss, exact by Gauss–Newton for this ReLU CNN)"
        )
        began = time.perf_counter()
        curvature = session.hessian(loaded, data, resolved, request.batch_size)
        timings["hessian"] = time.perf_counter() - began
    if predictions is None:  # a rank other than 0 under torchrun: rank 0 reports
        return None
    logits, labels, _dropped = predictions
    accuracy = top1_accuracy(logits, labels)
    confidence = mean_confidence(logits, labels)
    began = time.perf_counter()
    calibration = _calibrate(logits, labels, data, gate.calibration)
    timings["calibration"] = time.perf_counter() - began
    warnings = session.warnings + curvature.notes + curvature.messages
    for message in curvature.messages:  # the session said the rest as they came
        session.reporter.warn(message)
    inputs = {"checkpoint": loaded.describe(), "data": data.describe()}
    result = _judge(gate, curvature.analysis, calibration, warnings, inputs, timings)
    timings = {
        "inspect": timings["inspect"],
        **session.timings,
        "calibration": timings["calibration"],
        "hessian": timings["hessian"],
        "check": timings["calibration"] + timings["hessian"] + timings["judge"],
    }

    results = {
        "checkpoint": info,
        "n_samples": data.n_samples,
        "n_classes": int(logits.shape[1]),
        "accuracy": accuracy,
        "mean_confidence": confidence,
        "hessian": result.hessian,
        "calibration": result.calibration,
        "check": {"policy": str(policy_path), "passed": result.passed, "rows": result.verdict.rows},
        "plots": [str(path) for path in request.plots],
    }
    report = Report(
        command="demo",
        # The demo succeeds whatever the verdict: a failing bound is news about the example,
        # not an error of the run; the verdict is in results.check.passed.
        status=STATUS_OK,
        results=results,
        inputs={
            "checkpoint": loaded.describe(),
            "data": {**data.describe(), "file": file_info(demo_data())},
            "policy": file_info(policy_path),
        },
        settings=groups(
            checkpoint_settings.replace(device=str(session.device)),
            data_settings,
            gate.hessian,
            gate.calibration,
        ),
        timings=timings,
        environment=environment(loaded.device),
        warnings=warnings,
    )
    return DemoRun(
        info, data.n_samples, accuracy, confidence, result, policy_path, str(loaded.device), report
    )


def _read_gate(policy_path: Path, batch_size: int) -> _Gate:
    """The bundled policy and the settings ``curvcal check --batch-size N`` would measure it
    with (the same reading: :func:`~curvcal.policy.settings.resolve_settings`, then the Hessian
    and calibration settings as :mod:`curvcal.pipeline.check` makes them)."""
    from curvcal.pipeline.check import _calibration_settings, _hessian_settings
    from curvcal.policy.parse import load_policy
    from curvcal.policy.settings import (
        Locator,
        calibration_method,
        check_choices,
        needs,
        resolve_settings,
    )

    policy = load_policy(policy_path)
    settings, sources = resolve_settings(policy, {"batch_size": batch_size})
    where = Locator(policy, sources)
    check_choices(settings, where)
    need = needs(policy.rules)
    method = calibration_method(settings, need, where)
    return _Gate(
        policy,
        settings,
        sources,
        _hessian_settings(settings, need, where),
        _calibration_settings(settings, method, where),
    )


def _calibrate(
    logits: torch.Tensor, labels: torch.Tensor, data: LoadedData, settings: CalibrationSettings
) -> CalibrationAnalysis:
    """The calibration analysis of the predictions as ``curvcal check`` runs it: maps fitted
    on the stratified ``val_split`` of the digits, every stage measured on the other part."""
    from curvcal.pipeline.calibration import analyse

    return analyse(
        logits, labels, "logits", settings, f"data {data.spec}", fraction=settings.val_split
    )


def _judge(
    gate: _Gate,
    hessian: HessianAnalysis,
    calibration: CalibrationAnalysis,
    warnings: list[str],
    inputs: dict[str, Any],
    timings: dict[str, float],
) -> CheckResult:
    """The bundled policy's verdict on the measured values, read through the same table as
    ``curvcal check`` and ``compare`` read them (no baseline)."""
    from curvcal.pipeline.check import CheckResult
    from curvcal.policy.baseline import measured_values
    from curvcal.policy.evaluate import evaluate

    began = time.perf_counter()
    values = measured_values(hessian, calibration)
    gated = {rule.key for rule in gate.policy.rules}
    verdict = evaluate(gate.policy.rules, values, None)
    timings["judge"] = time.perf_counter() - began
    return CheckResult(
        verdict=verdict,
        values={key: value for key, value in values.items() if key in gated},
        hessian=hessian,
        calibration=calibration,
        settings=gate.settings,
        sources=gate.sources,
        nonfinite=tuple(sorted(k for k in gated if k in values and values[k].value is None)),
        unconverged=tuple(hessian.unconverged),
        warnings=tuple(warnings),
        inputs=inputs,
        timings=dict(timings),
    )


__all__ = ["DemoRequest", "DemoRun", "run_demo"]
