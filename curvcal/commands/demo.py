"""`curvcal demo`: the main job on the bundled digits example, as a guided tour."""

from __future__ import annotations

import time

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.inspect import inspect_tables
from curvcal.report import Table, fmt_float
from curvcal.results import Report


@click.command()
@click.option("--batch-size", default=256, show_default=True, type=click.IntRange(min=1))
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

    results = {
        "checkpoint": info,
        "n_samples": data.n_samples,
        "n_classes": int(logits.shape[1]),
        "accuracy": accuracy,
        "mean_confidence": mean_confidence,
    }
    report = Report(
        command="demo",
        results=results,
        inputs={
            "checkpoint": file_info(checkpoint),
            "data": {**data.describe(), "file": file_info(demo_data())},
        },
        settings={"batch_size": batch_size, "device": "cpu"},
        timings=timings,
        environment=environment(loaded.device),
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
    tables = [*inspect_tables(info)[:1], summary]

    from curvcal.commands.calibration_report import demo_calibration

    reporter.info("[bold]calibrate[/bold]: fit TS and focal TS on half, measure on the other half")
    began = time.perf_counter()
    results["calibration"], calibration_tables = demo_calibration(logits, labels)
    timings["calibration"] = time.perf_counter() - began
    return finish(report, [*tables, *calibration_tables])


def _confidence_caption(accuracy: float, mean_confidence: float) -> str:
    if mean_confidence > accuracy:
        return "mean confidence above accuracy: over-confident on average"
    if mean_confidence < accuracy:
        return "mean confidence below accuracy: under-confident on average"
    return "mean confidence equals accuracy"
