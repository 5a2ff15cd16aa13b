"""`curvcal demo`: the main job on the bundled digits example, as a guided tour.

It inspects the bundled checkpoint, measures it on the held-out digits, and runs the CI gate of
the bundled policy (``curvcal/assets/demo_policy.toml``) through the same library function as
``curvcal check``: Hessian (top-3 eigenvalues by Lanczos, Hutchinson trace), calibration (TS and
focal TS fitted on half the digits, measured on the other half) and the verdict.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from curvcal.commands.calibration_report import calibration_tables, reliability_panels
from curvcal.commands.check import check_tables
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.hessian import hessian_tables
from curvcal.commands.inspect import inspect_tables
from curvcal.errors import InputError
from curvcal.report import Table, fmt_float
from curvcal.results import STATUS_OK, Report

PLOT_NAMES = ("reliability.png", "spectrum.png")

TOUR = """\
[bold]What the tables say[/bold]
  checkpoint           what the file holds, read without running any of its code
  held-out digits      accuracy and mean confidence on {n} digits the model never trained on
  Hessian eigenvalues  the sharpest directions of the mean loss; λ1 is λmax (residual, converged)
  Hessian trace        the sum of all eigenvalues, a Hutch++ estimate with its 95 % interval
  calibration          ECE and friends before and after temperature scaling (TS) and focal TS,
                       measured on the half of the digits the maps were not fitted on
  fits / γ profile     the fitted T (and γ) and how the objective varies with γ
  check                every bound of the bundled policy, pass or FAIL: {verdict}
[bold]On your own model[/bold] (any torchvision model, state dict or safetensors file)
  curvcal inspect model.pt
  curvcal hessian model.pt --arch tv:resnet18 --data tv:cifar10:test --top-k 3 --plot spectrum.png -o hessian.json
  curvcal calibrate model.pt --arch tv:resnet18 --data tv:cifar10:test --plot reliability.png -o calibration.json
  curvcal check model.pt --policy curvcal.toml --baseline release.json --format markdown -o check.json
Start a policy from {policy}; examples/ci/ has a GitHub Actions job that runs the gate."""


@click.command()
@click.option("--batch-size", default=1024, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--plot-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=f"Write {' and '.join(PLOT_NAMES)} into this folder, created if missing (needs matplotlib).",
)
@output_options
def demo(batch_size: int, plot_dir: Path | None) -> int:
    """Run curvcal on the bundled example (a small CNN and held-out scikit-learn digits)."""
    from rich.markup import escape

    from curvcal.assets import demo_checkpoint, demo_data, demo_policy
    from curvcal.calibration.metrics import accuracy as top1_accuracy
    from curvcal.calibration.metrics import mean_confidence
    from curvcal.check import load_policy
    from curvcal.gate import run_check
    from curvcal.inference import predict_logits
    from curvcal.load.checkpoint import CheckpointOptions, inspect_checkpoint, load_model
    from curvcal.load.data import DataOptions, check_labels, iter_batches, load_dataset
    from curvcal.provenance import environment, file_info

    options, reporter = start()
    plots = _plot_paths(plot_dir, options.force) if plot_dir is not None else None
    checkpoint, policy_path = demo_checkpoint(), demo_policy()
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
    accuracy = top1_accuracy(logits, labels)
    confidence = mean_confidence(logits, labels)

    reporter.info(
        "[bold]3. calibrate, hessian and check[/bold]: the bundled policy "
        f"{policy_path.name} gates calibration (TS and focal TS fitted on half the digits, "
        "measured on the other half) and curvature (top-3 eigenvalues by Lanczos, Hutchinson "
        "trace of the Hessian of the mean loss)"
    )
    began = time.perf_counter()
    policy = load_policy(policy_path)
    with reporter.progress("calibration and Hessian-vector products", None) as advance:
        result = run_check(
            policy,
            checkpoint,
            {"batch_size": batch_size},
            on_step=lambda _stage, _n: advance(1),
        )
    timings.update(result.timings)
    timings["check"] = time.perf_counter() - began
    for message in result.warnings:
        reporter.warn(message)
    assert result.hessian is not None and result.calibration is not None

    if plots is not None:
        from curvcal.plot import reliability_diagram, spectrum_plot

        reliability_diagram(reliability_panels(result.calibration), plots[0])
        spectrum_plot(list(result.hessian.spectrum.eigenvalues), plots[1])
        reporter.info(f"plots written: {escape(str(plots[0]))}, {escape(str(plots[1]))}")

    results = {
        "checkpoint": info,
        "n_samples": data.n_samples,
        "n_classes": int(logits.shape[1]),
        "accuracy": accuracy,
        "mean_confidence": confidence,
        "hessian": result.hessian,
        "calibration": result.calibration,
        "check": {"policy": str(policy_path), "passed": result.passed, "rows": result.verdict.rows},
        "plots": [str(path) for path in plots] if plots is not None else [],
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
        settings={"batch_size": batch_size, "device": "cpu", **result.settings},
        timings=timings,
        environment=environment(loaded.device),
        warnings=list(result.warnings),
    )
    summary = Table(
        title="held-out digits",
        columns=("quantity", "value"),
        rows=(
            ("samples", str(data.n_samples)),
            ("accuracy", fmt_float(accuracy)),
            ("mean confidence", fmt_float(confidence)),
        ),
        caption=_confidence_caption(accuracy, confidence),
    )
    tables = [
        *inspect_tables(info)[:1],
        summary,
        *hessian_tables(result.hessian, str(loaded.device)),
        *calibration_tables(result.calibration, chart=options.fmt == "table"),
        *check_tables(result, f"check: the bundled policy {policy_path.name}")[:1],
    ]
    code = finish(report, tables)
    verdict = "all bounds hold" if result.passed else "a bound is broken (exit 1 in curvcal check)"
    reporter.info(TOUR.format(n=data.n_samples, verdict=verdict, policy=escape(str(policy_path))))
    return code


def _plot_paths(plot_dir: Path, force: bool) -> tuple[Path, Path]:
    """The demo's plot files in ``plot_dir``, checked before any work."""
    from curvcal.plot import require_matplotlib
    from curvcal.report import check_output_path

    require_matplotlib()
    if plot_dir.exists() and not plot_dir.is_dir():
        raise InputError("--plot-dir", f"{plot_dir} exists and is not a folder")
    try:
        plot_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError("--plot-dir", f"cannot create {plot_dir}: {error.strerror}") from error
    paths = (plot_dir / PLOT_NAMES[0], plot_dir / PLOT_NAMES[1])
    for path in paths:
        check_output_path(path, force)
    return paths


def _confidence_caption(accuracy: float, mean_confidence: float) -> str:
    if mean_confidence > accuracy:
        return "mean confidence above accuracy: over-confident on average"
    if mean_confidence < accuracy:
        return "mean confidence below accuracy: under-confident on average"
    return "mean confidence equals accuracy"
