"""`curvcal hessian CKPT --data SPEC`: eigenvalues, trace, density and per-module curvature of the
Hessian of a checkpoint's mean loss over a dataset.

A shell over :func:`curvcal.pipeline.hessian.run_hessian`: it turns the options into a request,
runs it, and hands the result to the report. Under ``torchrun`` every rank measures its shard of
the data, products are summed across ranks, and only rank 0 prints or writes anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from curvcal import choices
from curvcal.commands.checkpoint_options import checkpoint_options as checkpoint_options_decorator
from curvcal.commands.common import finish, output_options, start, typed_options
from curvcal.commands.data_options import data_options as data_options_decorator
from curvcal.commands.repeats import Command
from curvcal.report.hessian import hessian_tables, plot_outputs, plot_paths, write_plots

if TYPE_CHECKING:
    from curvcal.load.checkpoint import CheckpointOptions
    from curvcal.load.data import DataOptions


@click.command(cls=Command)
@click.argument("checkpoint", type=click.Path(path_type=Path))
@checkpoint_options_decorator
@data_options_decorator()
@click.option(
    "--top-k",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="How many of the largest eigenvalues to find.",
)
@click.option(
    "--method",
    type=click.Choice(choices.EIGEN_METHODS),
    help="Eigenvalue method (default: Lanczos with full reorthogonalisation).",
)
@click.option("--smallest", is_flag=True, help="Also find the smallest eigenvalue λmin.")
@click.option(
    "--tol",
    type=click.FloatRange(min=0, min_open=True),
    default=1e-4,
    show_default=True,
    help="Stop when the relative residual and change of each eigenvalue are below this.",
)
@click.option(
    "--max-iter",
    type=click.IntRange(min=1),
    help="Iteration budget per eigenvalue (default: 1000 for power, min(P, max(300, 2·top-k)) Lanczos steps).",
)
@click.option(
    "--max-basis",
    type=click.IntRange(min=3),
    help="Most vectors (P float64 values each) Lanczos' basis holds before it restarts on its "
    "best Ritz vectors (default: what --memory-budget holds, at least 2·top-k + 6); the "
    "density's runs keep theirs only if --density-steps vectors fit.",
)
@click.option(
    "--trace/--no-trace", default=True, show_default=True, help="Estimate the Hessian's trace."
)
@click.option(
    "--trace-method",
    type=click.Choice(choices.TRACE_METHODS),
    default="auto",
    show_default=True,
    help="gauss-newton: exact for networks linear in each parameter tensor (ReLU, convolution, "
    "eval BatchNorm), checked first; gauss-newton+hutchpp / +xtrace: its Gauss–Newton part "
    "exact, Hutch++ or XTrace on the rest (any network, eval mode); Hutch++ or XTrace "
    "(--probes products in all), or Hutchinson's estimator; auto: gauss-newton where it is "
    "exact, else gauss-newton+hutchpp where it can run, else Hutch++.",
)
@click.option(
    "--probes",
    type=click.IntRange(min=2),
    default=100,
    show_default=True,
    help="Trace probes (with --trace-rtol: the most probes drawn); at most 3P for hutchpp, "
    "xtrace and hutchinson (P parameters): 3P products are enough for the exact trace.",
)
@click.option(
    "--trace-rtol",
    type=click.FloatRange(min=0, min_open=True),
    help="Adaptive trace: draw probes until the 95% half-width is below this fraction of "
    "|estimate|.",
)
@click.option(
    "--probe-dist",
    type=click.Choice(choices.PROBE_DISTRIBUTIONS),
    default="rademacher",
    show_default=True,
    help="Distribution of the trace probes.",
)
@click.option("--density", is_flag=True, help="Estimate the eigenvalue density (SLQ).")
@click.option(
    "--density-runs", type=click.IntRange(min=1), default=5, show_default=True, help="SLQ runs."
)
@click.option(
    "--density-steps",
    type=click.IntRange(min=1),
    default=40,
    show_default=True,
    help="Lanczos steps per SLQ run.",
)
@click.option("--per-layer", is_flag=True, help="λmax and trace of each module's Hessian block.")
@click.option(
    "--seed",
    type=click.IntRange(-choices.MAX_SEED - 1, choices.MAX_SEED),
    default=0,
    show_default=True,
    help="Seed of start vectors and probes.",
)
@click.option(
    "--loss",
    type=click.Choice(choices.HESSIAN_LOSSES),
    default="ce",
    show_default=True,
    help="ce, focal (with --gamma), or own: the loss recorded in the checkpoint's metadata.",
)
@click.option("--gamma", type=click.FloatRange(min=0), help="γ of the focal loss.")
@click.option(
    "--params",
    "param_globs",
    metavar="GLOB",
    multiple=True,
    help="Only parameters whose names match this glob ('classifier.*'); repeatable.",
)
@click.option(
    "--hvp",
    type=click.Choice(choices.ENGINES),
    default="auto",
    show_default=True,
    help="Hessian-vector products: torch.func forward-over-reverse, or double backward.",
)
@click.option(
    "--mode",
    type=click.Choice(choices.MODES),
    default="eval",
    show_default=True,
    help="Module mode during the loss (train: BatchNorm batch statistics; refused with dropout).",
)
@click.option(
    "--cache",
    type=click.Choice(choices.CACHES),
    default="auto",
    show_default=True,
    help="Where batches stay between products.",
)
@click.option(
    "--probe-batch",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Vectors sharing one pass over the data (at most; fewer when the memory budget says so).",
)
@click.option(
    "--memory-budget",
    metavar="SIZE",
    default=None,
    help="Memory one pass of products may use: bytes with a unit (4GiB, 512MB) or a share of "
    "the free memory (50%).  [default: 2x a gradient pass or 256 MiB, at most half the free memory]",
)
@click.option(
    "--keep-graphs",
    type=click.Choice(choices.KEEP_GRAPHS),
    default="auto",
    show_default=True,
    help="Keep the gradient graphs between products (the forward and first backward run once; "
    "auto: when they fit in --memory-budget).",
)
@click.option("--strict", is_flag=True, help="Exit 3 when an estimate does not converge.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the top-k spectrum (and the density with --density) to a .png, .svg or .pdf "
    "file; with --per-layer also a bar chart to FILE's name + '-layers' (needs matplotlib).",
)
@output_options
def hessian(
    checkpoint: Path,
    checkpoint_options: CheckpointOptions,
    data_options: DataOptions,
    batch_size: int,
    top_k: int,
    method: str | None,
    smallest: bool,
    tol: float,
    max_iter: int | None,
    max_basis: int | None,
    trace: bool,
    trace_method: str,
    probes: int,
    trace_rtol: float | None,
    probe_dist: str,
    density: bool,
    density_runs: int,
    density_steps: int,
    per_layer: bool,
    seed: int,
    loss: str,
    gamma: float | None,
    param_globs: tuple[str, ...],
    hvp: str,
    mode: str,
    cache: str,
    probe_batch: int,
    memory_budget: str | None,
    keep_graphs: str,
    strict: bool,
    plot: Path | None,
) -> int:
    """Top eigenvalues, trace and more of the Hessian of the mean loss over a dataset.

    The loss is averaged over every sample of --data, in eval mode unless --mode train.
    """
    from curvcal.outputs import arch_inputs, checkpoint_inputs, data_inputs, tokenizer_inputs
    from curvcal.pipeline.hessian import HessianRequest, run_hessian

    _refuse_unused_trace_options(trace, trace_method, per_layer)
    options, reporter = start(
        inputs=[
            *checkpoint_inputs("CHECKPOINT", checkpoint, checkpoint_options.arch),
            *arch_inputs("--arch", checkpoint_options.arch),
            *data_inputs("--data", data_options.spec, data_options.root),
            *tokenizer_inputs("--tokenizer", data_options.tokenizer),
        ],
        outputs=plot_outputs(plot, per_layer),
    )
    plots = plot_paths(plot, per_layer, options.force) if plot is not None else None
    request = HessianRequest(
        checkpoint=checkpoint,
        checkpoint_options=checkpoint_options,
        data_options=data_options,
        batch_size=batch_size,
        top_k=top_k,
        method=method,
        smallest=smallest,
        tol=tol,
        max_iter=max_iter,
        max_basis=max_basis,
        trace=trace,
        trace_method=trace_method,
        probes=probes,
        trace_rtol=trace_rtol,
        probe_dist=probe_dist,
        density=density,
        density_runs=density_runs,
        density_steps=density_steps,
        per_layer=per_layer,
        seed=seed,
        loss=loss,
        gamma=gamma,
        params=tuple(param_globs),
        hvp=hvp,
        mode=mode,
        cache=cache,
        probe_batch=probe_batch,
        memory_budget=memory_budget,
        keep_graphs=keep_graphs,
        strict=strict,
    )
    run = run_hessian(request, reporter)
    if not run.is_main:
        return run.exit_code
    code = finish(run.report, hessian_tables(run.analysis, run.device))
    if plots is not None:
        write_plots(run.analysis, *plots)
    if run.failure is not None:
        raise run.failure
    return code


#: the options that only shape the trace, by parameter name
_TRACE_OPTIONS = {
    "trace_method": "--trace-method",
    "probes": "--probes",
    "trace_rtol": "--trace-rtol",
    "probe_dist": "--probe-dist",
}


def _refuse_unused_trace_options(trace: bool, trace_method: str, per_layer: bool) -> None:
    """Options typed for a trace that will not use them are a mistake to report, not to ignore:
    any trace option with --no-trace, and --probe-dist with the exact Gauss–Newton trace (which
    draws no probe). --per-layer's layer traces use --probes and --probe-dist whatever the
    whole trace does."""
    from curvcal.errors import InputError

    layers_use = ("probes", "probe_dist") if per_layer else ()
    unused = [name for name in _TRACE_OPTIONS if name not in layers_use]
    typed = [_TRACE_OPTIONS[name] for name in typed_options(unused)]
    if not trace and typed:
        raise InputError(
            "--no-trace", f"no trace is computed, so {', '.join(typed)} would do nothing",
            "leave them out, or drop --no-trace",
        )  # fmt: skip
    if trace_method == "gauss-newton" and "--probe-dist" in typed:
        raise InputError(
            "--probe-dist",
            "the gauss-newton trace is exact and draws no probe",
            "leave out --probe-dist, or pick an estimator with --trace-method",
        )
