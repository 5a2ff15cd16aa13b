"""``curvcal demo``: the bundled checkpoint inspected, its held-out digits predicted, and the
bundled policy's check run (Hessian, calibration, verdict) through :func:`run_check`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.results import STATUS_OK, Report

if TYPE_CHECKING:
    from curvcal.console import Reporter
    from curvcal.pipeline.check import CheckResult


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


def run_demo(request: DemoRequest, reporter: Reporter) -> DemoRun:
    """Inspect, predict and check the bundled example, saying each step on ``reporter``."""
    from curvcal.assets import demo_checkpoint, demo_data, demo_policy
    from curvcal.calibration.metrics import accuracy as top1_accuracy
    from curvcal.calibration.metrics import mean_confidence
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.digest import file_info
    from curvcal.load.inspect import inspect_checkpoint
    from curvcal.pipeline.check import run_check
    from curvcal.pipeline.compatibility import check_compatible
    from curvcal.pipeline.runtime import predict
    from curvcal.policy.parse import load_policy
    from curvcal.provenance import environment
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

    checkpoint, policy_path = demo_checkpoint(), demo_policy()
    reporter.info(f"[bold]1. inspect[/bold] the bundled checkpoint {checkpoint.name}")
    timings: dict[str, float] = {}
    began = time.perf_counter()
    info = inspect_checkpoint(checkpoint)
    timings["inspect"] = time.perf_counter() - began

    reporter.info("[bold]2. predict[/bold] the held-out digits with it")
    began = time.perf_counter()
    loaded = load_model(checkpoint, CheckpointSettings(device="cpu"))
    data = load_dataset(DataSettings(data="curvcal:digits"))
    check_compatible(loaded, data, "--data")
    with reporter.progress("inference", data.n_samples) as advance:
        predictions = predict(loaded, data, request.batch_size, advance)
    assert predictions is not None  # one process
    logits, labels = predictions
    timings["inference"] = time.perf_counter() - began
    accuracy = top1_accuracy(logits, labels)
    confidence = mean_confidence(logits, labels)

    reporter.info(
        "[bold]3. calibrate, hessian and check[/bold]: the bundled policy "
        f"{policy_path.name} gates calibration (TS and focal TS fitted on half the digits, "
        "measured on the other half) and curvature (top-3 eigenvalues by Lanczos, and the trace "
        "of the Hessian of the mean loss, exact by Gauss–Newton for this ReLU CNN)"
    )
    began = time.perf_counter()
    policy = load_policy(policy_path)
    with reporter.progress("calibration and Hessian-vector products", None) as advance:
        result = run_check(
            policy,
            checkpoint,
            {"batch_size": request.batch_size},
            on_step=lambda _stage, _n: advance(1),
        )
    timings.update(result.timings)
    timings["check"] = time.perf_counter() - began
    for message in result.warnings:
        reporter.warn(message)
    assert result.hessian is not None and result.calibration is not None

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
        settings={"batch_size": request.batch_size, "device": "cpu", **result.settings},
        timings=timings,
        environment=environment(loaded.device),
        warnings=list(result.warnings),
    )
    return DemoRun(
        info, data.n_samples, accuracy, confidence, result, policy_path, str(loaded.device), report
    )
