"""`curvcal demo`: the main job on the bundled digits example, as a guided tour.

It inspects the bundled checkpoint, predicts the held-out digits once, and judges them by the
CI gate of the bundled policy (``curvcal/assets/demo_policy.toml``, read as ``curvcal check``
reads it; see :mod:`curvcal.pipeline.demo`): Hessian (top-3 eigenvalues by Lanczos, the trace),
calibration (TS and focal TS fitted on half the digits, measured on the other half) and the
verdict.
"""

from __future__ import annotations

from pathlib import Path

import click

from curvcal.commands.common import finish, output_options, start
from curvcal.commands.repeats import Command
from curvcal.report.calibration import calibration_tables
from curvcal.report.check import check_tables
from curvcal.report.demo import PLOT_NAMES, digits_table, plot_files, plot_paths, write_plots
from curvcal.report.hessian import hessian_tables
from curvcal.report.inspect import inspect_tables

TOUR = """\
[bold]What the tables say[/bold]
  checkpoint           what the file holds, read without running any of its code
  held-out digits      accuracy and mean confidence on {n} digits the model never trained on
  Hessian eigenvalues  the sharpest directions of the mean loss; λ1 is λmax (residual, converged)
  Hessian trace        the sum of all eigenvalues: exact (Gauss–Newton) for this ReLU CNN
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


@click.command(cls=Command)
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
    from curvcal.pipeline.demo import DemoRequest, run_demo

    options, reporter = start(
        inputs=[
            ("the bundled checkpoint", demo_checkpoint()),
            ("the bundled data", demo_data()),
            ("the bundled policy", demo_policy()),
        ],
        outputs=[("--plot-dir", path) for path in plot_files(plot_dir)],
    )
    plots = plot_paths(plot_dir, options.force) if plot_dir is not None else None
    run = run_demo(DemoRequest(batch_size, plots or ()), reporter)
    if run is None:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    result = run.check
    assert result.hessian is not None and result.calibration is not None
    if plots is not None:
        write_plots(result.calibration, result.hessian, plots)
        reporter.info(
            f"plots written: {escape(str(plots[0]))}, {escape(str(plots[1]))}", markup=True
        )
    tables = [
        *inspect_tables(run.info)[:1],
        digits_table(run.n_samples, run.accuracy, run.mean_confidence),
        *hessian_tables(result.hessian, run.device),
        *calibration_tables(result.calibration, chart=options.fmt == "table"),
        *check_tables(result, f"check: the bundled policy {run.policy_path.name}")[:1],
    ]
    code = finish(run.report, tables)
    verdict = "all bounds hold" if result.passed else "a bound is broken (exit 1 in curvcal check)"
    reporter.info(
        TOUR.format(n=run.n_samples, verdict=verdict, policy=escape(str(run.policy_path))),
        markup=True,
    )
    return code
