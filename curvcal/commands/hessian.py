"""`curvcal hessian CKPT --data SPEC`: eigenvalues, trace, density and per-module curvature of the
Hessian of a checkpoint's mean loss over a dataset.

A thin shell over :func:`curvcal.curvature.analysis.analyse_hessian`: it resolves the options,
loads the model and the data, runs the analysis with a progress bar, and hands the result to the
report. Under ``torchrun`` every rank measures its shard of the data, products are summed across
ranks, and only rank 0 prints or writes anything.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import torch

from curvcal.commands.checkpoint_options import checkpoint_options as checkpoint_options_decorator
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import data_options as data_options_decorator
from curvcal.commands.loss_options import check_loss_options
from curvcal.console import Reporter
from curvcal.curvature.analysis import HessianSettings, selected_parameter_count
from curvcal.curvature.results import HessianAnalysis
from curvcal.errors import EXIT_NUMERICAL, EXIT_OK, InputError, NumericalError
from curvcal.load.checkpoint import CheckpointOptions, LoadedModel
from curvcal.load.data import DataOptions
from curvcal.report.hessian import hessian_tables, write_plots
from curvcal.results import STATUS_ERROR, STATUS_OK, Report

LOSSES = ("ce", "focal", "own")
# HessianSettings field -> the option that sets it, for messages.
_OPTION_OF = {
    "criterion": "--loss",
    "distribution": "--probe-dist",
    "engine": "--hvp",
}


@click.command()
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
    type=click.Choice(("power", "lanczos")),
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
    help="Iteration budget per eigenvalue (default: 1000 for power, min(P, 300) Lanczos steps).",
)
@click.option(
    "--trace/--no-trace", default=True, show_default=True, help="Estimate the Hessian's trace."
)
@click.option(
    "--trace-method",
    type=click.Choice(("hutchinson", "hutchpp")),
    default="hutchinson",
    show_default=True,
    help="Hutchinson's estimator, or Hutch++ (--probes products in all).",
)
@click.option(
    "--probes",
    type=click.IntRange(min=2),
    default=100,
    show_default=True,
    help="Trace probes (with --trace-rtol: the most probes drawn).",
)
@click.option(
    "--trace-rtol",
    type=click.FloatRange(min=0, min_open=True),
    help="Adaptive trace: draw probes until the 95% half-width is below this fraction of "
    "|estimate|.",
)
@click.option(
    "--probe-dist",
    type=click.Choice(("rademacher", "gaussian")),
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
    "--seed", type=int, default=0, show_default=True, help="Seed of start vectors and probes."
)
@click.option(
    "--loss",
    type=click.Choice(LOSSES),
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
    type=click.Choice(("auto", "func", "autograd")),
    default="auto",
    show_default=True,
    help="Hessian-vector products: torch.func forward-over-reverse, or double backward.",
)
@click.option(
    "--mode",
    type=click.Choice(("eval", "train")),
    default="eval",
    show_default=True,
    help="Module mode during the loss (train: BatchNorm batch statistics; refused with dropout).",
)
@click.option(
    "--cache",
    type=click.Choice(("auto", "device", "host", "none")),
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
    strict: bool,
    plot: Path | None,
) -> int:
    """Top eigenvalues, trace and more of the Hessian of the mean loss over a dataset.

    The loss is averaged over every sample of --data, in eval mode unless --mode train.
    """
    from curvcal import distributed
    from curvcal.fitness import check_fitness
    from curvcal.load.checkpoint import load_model, recorded_loss, resolve_device
    from curvcal.load.data import iter_batches, load_dataset
    from curvcal.outputs import data_inputs
    from curvcal.provenance import environment

    options, reporter = start(
        inputs=[("CHECKPOINT", checkpoint), *data_inputs("--data", data_options.spec)],
        outputs=plot_outputs(plot, per_layer),
    )
    began = time.perf_counter()
    plots = plot_paths(plot, per_layer, options.force) if plot is not None else None
    check_loss_options(loss, gamma)
    if trace and trace_method == "hutchpp" and trace_rtol is not None:
        raise InputError(
            "--trace-rtol", "the adaptive stop works only with --trace-method hutchinson"
        )
    if trace and trace_method == "hutchpp" and probes < 4:
        raise InputError("--probes", f"Hutch++ needs at least 4 products, got {probes}")

    device = resolve_device(checkpoint_options.device)
    if checkpoint_options.device.strip().lower() in ("auto", "cuda"):
        device = distributed.local_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    context = distributed.init_from_env(device)
    if not context.is_main:
        reporter = Reporter(quiet=True)
    try:
        checkpoint_options = dataclasses.replace(checkpoint_options, device=str(device))
        loaded = load_model(checkpoint, checkpoint_options)
        criterion, gamma_value = (
            recorded_loss(loaded) if loss == "own" else (loss, float(gamma or 0.0))
        )
        settings = _settings(
            top_k=top_k,
            method=method,
            smallest=smallest,
            tol=tol,
            max_iter=max_iter,
            trace=trace,
            trace_method=trace_method,
            probes=probes,
            trace_rtol=trace_rtol,
            distribution=probe_dist,
            density=density,
            density_runs=density_runs,
            density_steps=density_steps,
            per_layer=per_layer,
            seed=seed,
            criterion=criterion,
            gamma=gamma_value,
            params=tuple(param_globs),
            engine=hvp,
            mode=mode,
            cache=cache,
            probe_batch=probe_batch,
            memory_budget=memory_budget,
        )
        _check_parameters(loaded, settings)
        data = load_dataset(dataclasses.replace(data_options, trust=checkpoint_options.trust))
        check_fitness(loaded, data, "--data")
        if data.n_samples < context.world_size:
            raise InputError(
                f"--data {data.spec}",
                f"{data.n_samples} samples cannot be shared among {context.world_size} processes",
                "use fewer processes",
            )
        indices = (
            distributed.shard_indices(data.n_samples, context.rank, context.world_size)
            if context.active
            else None
        )
        loaded_seconds = time.perf_counter() - began

        def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            return iter_batches(data.dataset, batch_size, indices)

        analysis, messages = measure_hessian(
            loaded,
            batches,
            settings,
            reporter,
            all_reduce=distributed.all_reduce_sum if context.active else None,
        )
        analysis = dataclasses.replace(
            analysis, operator={**analysis.operator, "world_size": context.world_size}
        )
        failed = analysis.unconverged
        status = STATUS_ERROR if (strict and failed) else STATUS_OK
        if not context.is_main:
            return EXIT_NUMERICAL if status == STATUS_ERROR else EXIT_OK
        if not strict:
            for message in messages:
                reporter.warn(message)
        report = Report(
            command="hessian",
            results=analysis,
            status=status,
            inputs={"checkpoint": loaded.describe(), "data": data.describe()},
            settings={
                **_checkpoint_settings(checkpoint_options),
                **_data_settings(data_options, batch_size),
                "loss": loss,
                **_hessian_settings(settings),
                "strict": strict,
                "world_size": context.world_size,
            },
            timings={
                "load": loaded_seconds,
                **analysis.timings,
                "total": time.perf_counter() - began,
            },
            environment=environment(loaded.device),
            warnings=messages,
        )
        code = finish(report, hessian_tables(analysis, str(loaded.device)))
        if plots is not None:
            write_plots(analysis, *plots)
        if status == STATUS_ERROR:
            raise NumericalError(
                "--strict",
                f"{', '.join(failed)} did not converge",
                "raise --max-iter (or --probes), loosen --tol/--trace-rtol, or drop --strict",
            )
        return code
    finally:
        distributed.shutdown()


def plot_outputs(path: Path | None, per_layer: bool) -> list[tuple[str, Path]]:
    """The files ``--plot`` writes, as ``(option, path)``: the spectrum and, with
    ``per_layer``, the per-layer chart beside it."""
    if path is None:
        return []
    written = [("--plot", path)]
    if per_layer:
        written.append(("--plot (per-layer chart)", _layers_path(path)))
    return written


def _layers_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}-layers{path.suffix}")


def plot_paths(path: Path, per_layer: bool, force: bool) -> tuple[Path, Path | None]:
    """The spectrum file and, with ``per_layer``, the per-layer file beside it
    (``spectrum.png`` -> ``spectrum-layers.png``), checked before any work."""
    from curvcal.report.plots import SUFFIXES, require_matplotlib
    from curvcal.report.tables import check_output_path

    if path.suffix.lower() not in SUFFIXES:
        raise InputError(
            "--plot", f"cannot tell the format of {path}", "name a .png, .svg or .pdf file"
        )
    require_matplotlib()
    layers = _layers_path(path) if per_layer else None
    for target in (path, layers):
        if target is not None:
            check_output_path(target, force)
    return path, layers


def _settings(**values: Any) -> HessianSettings:
    """HessianSettings from the options, with errors naming the option at fault."""
    try:
        return HessianSettings(**values)
    except InputError as error:
        option = _OPTION_OF.get(error.what, "--" + error.what.replace("_", "-"))
        raise InputError(option, error.why, error.hint) from None


def _check_parameters(loaded: LoadedModel, settings: HessianSettings) -> None:
    """--params patterns that match nothing and a --top-k above P, before the data is read."""
    for pattern in settings.params:
        if selected_parameter_count(loaded.module, (pattern,)) == 0:
            names = [n for n, p in loaded.module.named_parameters() if p.requires_grad]
            shown = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
            raise InputError(
                "--params", f"{pattern!r} matches no trainable parameter", f"names are: {shown}"
            )
    n_params = selected_parameter_count(loaded.module, settings.params)
    if n_params == 0:
        raise InputError(str(loaded.path), "the model has no trainable parameters")
    if settings.top_k > n_params:
        raise InputError(
            "--top-k",
            f"{settings.top_k} eigenvalues asked of a Hessian with {n_params} parameters",
            f"use --top-k {n_params} or less",
        )


def measure_hessian(
    loaded: LoadedModel,
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    settings: HessianSettings,
    reporter: Reporter,
    *,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[HessianAnalysis, list[str]]:
    """Run the analysis with a progress count of Hessian-vector products on stderr.

    Returns the analysis and the warnings it raised (convergence, engine fallback) as messages;
    other warnings are passed on untouched.
    """
    from curvcal.curvature.analysis import analyse_hessian_with_messages
    from curvcal.curvature.forecast import forecast_for

    forecast = forecast_for(
        loaded.module, settings, lambda text: reporter.info(f"curvcal: note: {text}")
    )
    with reporter.progress("Hessian-vector products", None) as advance:
        done = [0]

        def on_step(stage: str, matvecs: int) -> None:
            advance(matvecs - done[0])
            done[0] = matvecs
            forecast(stage, matvecs)

        return analyse_hessian_with_messages(
            loaded.module, batches, settings, all_reduce=all_reduce, on_step=on_step
        )


def _checkpoint_settings(options: CheckpointOptions) -> dict[str, Any]:
    return {
        "arch": options.arch,
        "arch_kwargs": dict(options.arch_kwargs),
        "num_classes": options.num_classes,
        "state_dict_key": options.state_dict_key,
        "trust_checkpoint": options.trust,
        "allow_globals": list(options.allow_globals),
        "device": options.device,
        "dtype": options.dtype,
    }


def _data_settings(options: DataOptions, batch_size: int) -> dict[str, Any]:
    return {
        "data": options.spec,
        "data_root": options.root,
        "download": options.download,
        "mean": options.mean,
        "std": options.std,
        "resize": options.resize,
        "crop": options.crop,
        "max_samples": options.max_samples,
        "subset_seed": options.subset_seed,
        "x_key": options.x_key,
        "y_key": options.y_key,
        "batch_size": batch_size,
    }


def _hessian_settings(settings: HessianSettings) -> dict[str, Any]:
    return {
        "top_k": settings.top_k,
        "method": settings.method,
        "smallest": settings.smallest,
        "tol": settings.tol,
        "max_iter": settings.max_iter,
        "trace": settings.trace,
        "trace_method": settings.trace_method,
        "probes": settings.probes,
        "trace_rtol": settings.trace_rtol,
        "probe_dist": settings.distribution,
        "density": settings.density,
        "density_runs": settings.density_runs,
        "density_steps": settings.density_steps,
        "per_layer": settings.per_layer,
        "seed": settings.seed,
        "criterion": settings.criterion,
        "gamma": settings.gamma,
        "params": list(settings.params),
        "hvp": settings.engine,
        "mode": settings.mode,
        "cache": settings.cache,
        "probe_batch": settings.probe_batch,
        "memory_budget": settings.memory_budget,
    }
