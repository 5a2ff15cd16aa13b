"""`curvcal demo`: the main job on the bundled digits example, as a guided tour."""

from __future__ import annotations

import time

import click

from curvcal.commands.calibration_report import demo_calibration
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.hessian import hessian_tables, measure_hessian
from curvcal.commands.inspect import inspect_tables
from curvcal.curvature.analysis import HessianSettings
from curvcal.report import Table, fmt_float
from curvcal.results import Report

# What the demo asks of the Hessian: `curvcal hessian --top-k 3 --method lanczos --probes 50`.
DEMO_HESSIAN = HessianSettings(top_k=3, method="lanczos", probes=50)


@click.command()
@click.option("--batch-size", default=1024, show_default=True, type=click.IntRange(min=1))
@output_options
def demo(batch_size: int) -> int:
    """Run curvcal on the bundled example (a small CNN and held-out scikit-learn digits)."""
    import torch

    from curvcal.assets import demo_checkpoint, demo_data
    from curvcal.inference import predict_logits
    from curvcal.load.checkpoint import CheckpointOptions, inspect_checkpoint, load_model
    from curvcal.load.data import DataOptions, check_labels, iter_batches, load_dataset
    from curvcal.provenance import environment, file_info

    _options, reporter = start()
    checkpoint = demo_checkpoint()
    reporter.info(f"[bold]1. inspect[/bold] the bundled checkpoint {checkpoint.name}")
    timings: dict[str, float] = {}
    began = time.perf_counter()
    info = inspect_checkpoint(checkpoint)
    timings["inspect"] = time.perf_counter() - began

    reporter.info("[bold]2. predict[/bold] the held-out digits with it")
    began = time.perf_counter()
    loaded = load_model(checkpoint, CheckpointOptions(device="cpu"))
    data = load_dataset(DataOptions(spec="curvcal:digits"))
    check_labels(data, loaded.num_classes)
    with reporter.progress("inference", data.n_samples) as advance:
        logits, labels = predict_logits(
            loaded.module, iter_batches(data.dataset, batch_size), loaded.device, advance
        )
    timings["inference"] = time.perf_counter() - began
    probabilities = torch.softmax(logits.double(), dim=1)
    accuracy = float((logits.argmax(dim=1) == labels).double().mean())
    mean_confidence = float(probabilities.max(dim=1).values.mean())

    reporter.info(
        "[bold]3. hessian[/bold]: top-3 eigenvalues (Lanczos) and Hutchinson trace of the "
        "Hessian of the mean loss"
    )
    began = time.perf_counter()
    curvature, messages = measure_hessian(
        loaded, lambda: iter_batches(data.dataset, batch_size), DEMO_HESSIAN, reporter
    )
    timings["hessian"] = time.perf_counter() - began
    for message in messages:
        reporter.warn(message)

    reporter.info(
        "[bold]4. calibrate[/bold]: fit TS and focal TS on half the digits, measure on the "
        "other half"
    )
    began = time.perf_counter()
    calibration, calibration_tables = demo_calibration(logits, labels)
    timings["calibration"] = time.perf_counter() - began

    results = {
        "checkpoint": info,
        "n_samples": data.n_samples,
        "n_classes": int(logits.shape[1]),
        "accuracy": accuracy,
        "mean_confidence": mean_confidence,
        "hessian": curvature,
        "calibration": calibration,
    }
    report = Report(
        command="demo",
        results=results,
        inputs={
            "checkpoint": file_info(checkpoint),
            "data": {**data.describe(), "file": file_info(demo_data())},
        },
        settings={
            "batch_size": batch_size,
            "device": "cpu",
            "dtype": "float32",
            "hessian": DEMO_HESSIAN,
        },
        timings=timings,
        environment=environment(loaded.device),
        warnings=messages,
    )
    summary = Table(
        title="held-out digits",
        columns=("quantity", "value"),
        rows=(
            ("samples", str(data.n_samples)),
            ("accuracy", fmt_float(accuracy)),
            ("mean confidence", fmt_float(mean_confidence)),
        ),
        caption=_confidence_caption(accuracy, mean_confidence),
    )
    tables = [
        *inspect_tables(info)[:1],
        summary,
        *hessian_tables(curvature, str(loaded.device)),
        *calibration_tables,
    ]
    return finish(report, tables)


def _confidence_caption(accuracy: float, mean_confidence: float) -> str:
    if mean_confidence > accuracy:
        return "mean confidence above accuracy: over-confident on average"
    if mean_confidence < accuracy:
        return "mean confidence below accuracy: under-confident on average"
    return "mean confidence equals accuracy"
