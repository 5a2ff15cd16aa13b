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
from curvcal.console import Reporter
from curvcal.curvature.analysis import HessianSettings, selected_parameter_count
from curvcal.curvature.results import HessianAnalysis
from curvcal.errors import EXIT_NUMERICAL, EXIT_OK, InputError, NumericalError
from curvcal.load.checkpoint import CheckpointOptions, LoadedModel
from curvcal.load.data import DataOptions
from curvcal.report import Table, fmt_float
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
    type=click.Choice(("hutchpp", "xtrace", "hutchinson")),
    default="hutchpp",
    show_default=True,
    help="Hutch++ or XTrace (--probes products in all), or Hutchinson's estimator.",
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
    help="Vectors sharing one pass over the data.",
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
    strict: bool,
    plot: Path | None,
) -> int:
    """Top eigenvalues, trace and more of the Hessian of the mean loss over a dataset.

    The loss is averaged over every sample of --data, in eval mode unless --mode train.
    """
    from curvcal import distributed
    from curvcal.inference import check_model_runs
    from curvcal.load.checkpoint import load_model, recorded_loss, resolve_device
    from curvcal.load.data import check_labels, iter_batches, load_dataset
    from curvcal.provenance import environment

    options, reporter = start()
    began = time.perf_counter()
    plots = plot_paths(plot, per_layer, options.force) if plot is not None else None
    check_loss_options(loss, gamma)
    if trace and trace_method != "hutchinson" and trace_rtol is not None:
        raise InputError(
            "--trace-rtol",
            "the adaptive stop works only with --trace-method hutchinson",
            "add --trace-method hutchinson",
        )
    if trace and trace_method != "hutchinson" and probes < 4:
        raise InputError(
            "--probes", f"--trace-method {trace_method} needs at least 4 products, got {probes}"
        )

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
        )
        _check_parameters(loaded, settings)
        data = load_dataset(dataclasses.replace(data_options, trust=checkpoint_options.trust))
        outputs = check_model_runs(loaded.module, data.dataset[0][0], device, f"--data {data.spec}")
        check_labels(data, loaded.num_classes or outputs)
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
                "--strict", f"{', '.join(failed)} did not converge", _strict_hint(analysis)
            )
        return code
    finally:
        distributed.shutdown()


def _strict_hint(analysis: HessianAnalysis) -> str:
    """What to change, from the limits that stopped the unconverged estimates."""
    stops = {analysis.spectrum.stopped_by}
    if analysis.smallest is not None:
        stops.add(analysis.smallest.stopped_by)
    if "precision" in stops:
        return "the products' rounding floors the residual: loosen --tol, use --dtype float64, or drop --strict"
    return "raise --max-iter (or --probes), loosen --tol/--trace-rtol, or drop --strict"


def check_loss_options(loss: str, gamma: float | None) -> None:
    """``--loss``/``--gamma`` combinations that make sense (shared by hessian and study)."""
    if loss == "own" and gamma is not None:
        raise InputError(
            "--gamma", "cannot be combined with --loss own, which reads γ from the checkpoint"
        )
    if loss == "focal" and gamma is None:
        raise InputError("--loss focal", "needs --gamma γ (γ = 0 is cross-entropy)")
    if loss == "ce" and gamma not in (None, 0.0):
        raise InputError("--gamma", f"{gamma} is only used by --loss focal")


def plot_paths(path: Path, per_layer: bool, force: bool) -> tuple[Path, Path | None]:
    """The spectrum file and, with ``per_layer``, the per-layer file beside it
    (``spectrum.png`` -> ``spectrum-layers.png``), checked before any work."""
    from curvcal.plot import SUFFIXES, require_matplotlib
    from curvcal.report import check_output_path

    if path.suffix.lower() not in SUFFIXES:
        raise InputError(
            "--plot", f"cannot tell the format of {path}", "name a .png, .svg or .pdf file"
        )
    require_matplotlib()
    layers = path.with_name(f"{path.stem}-layers{path.suffix}") if per_layer else None
    for target in (path, layers):
        if target is not None:
            check_output_path(target, force)
    return path, layers


def write_plots(analysis: HessianAnalysis, spectrum_path: Path, layers_path: Path | None) -> None:
    """The top-k eigenvalues (with the SLQ density beside them when measured) and, when asked
    and measured, λmax and trace per module."""
    from curvcal.plot import per_layer_plot, spectrum_plot

    density = analysis.density
    spectrum_plot(
        list(analysis.spectrum.eigenvalues),
        spectrum_path,
        None if density is None else list(density.grid),
        None if density is None else list(density.density),
    )
    if layers_path is not None and analysis.layers:
        per_layer_plot(
            [layer.module or "(root)" for layer in analysis.layers],
            [layer.lambda_max.value for layer in analysis.layers],
            [layer.trace.estimate for layer in analysis.layers],
            layers_path,
        )


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

    with reporter.progress("Hessian-vector products", None) as advance:
        done = [0]

        def on_step(_stage: str, matvecs: int) -> None:
            advance(matvecs - done[0])
            done[0] = matvecs

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
    }


# -- tables ---------------------------------------------------------------------------------------


def hessian_tables(analysis: HessianAnalysis, device: str) -> list[Table]:
    """The tables of a Hessian analysis: eigenvalues, trace, per-module blocks and density
    (when measured), and the run (engine, mode, loss, N, P, device, products, seconds)."""
    tables = [_eigen_table(analysis)]
    if analysis.trace is not None:
        tables.append(_trace_table(analysis))
    if analysis.layers is not None:
        tables.append(_layers_table(analysis))
    if analysis.density is not None:
        tables.append(_density_table(analysis))
    tables.append(_run_table(analysis, device))
    return tables


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "NO"


def _eigen_table(analysis: HessianAnalysis) -> Table:
    spectrum = analysis.spectrum
    rows = [
        (
            str(index + 1),
            fmt_float(value.value, 6),
            fmt_float(value.residual, 2),
            str(value.iterations),
            str(value.matvecs),
            _yes_no(value.converged),
        )
        for index, value in enumerate(spectrum.values)
    ]
    if analysis.smallest is not None:
        low = analysis.smallest.values[0]
        rows.append(
            (
                "min",
                fmt_float(low.value, 6),
                fmt_float(low.residual, 2),
                str(low.iterations),
                str(low.matvecs),
                _yes_no(low.converged),
            )
        )
    caption = (
        f"{spectrum.method}, tol {spectrum.tol:g}; λ1 is λmax, the largest algebraic eigenvalue"
    )
    if spectrum.shift is not None:
        caption += f"; dominant eigenvalue {spectrum.shift:.4g} was negative, so the search was shifted by it"
    return Table(
        title="Hessian eigenvalues",
        columns=("index", "λ", "residual", "iterations", "HVPs", "converged"),
        rows=tuple(rows),
        caption=caption,
    )


def _trace_table(analysis: HessianAnalysis) -> Table:
    trace = analysis.trace
    assert trace is not None
    low, high = trace.ci95
    caption = (
        f"{_TRACE_NAMES.get(trace.method, trace.method)}, {trace.matvecs} products, "
        f"{trace.distribution} probes; standard error {trace.standard_error:.3g}; "
        f"95% interval: {trace.interval}"
    )
    if trace.rtol is not None:
        caption += f"; adaptive (rtol {trace.rtol:g}), stopped by {trace.stopped_by}"
    return Table(
        title="Hessian trace",
        columns=("estimate", "95% CI", "products", "estimator"),
        rows=(
            (
                f"{fmt_float(trace.estimate, 6)} ± {fmt_float(trace.half_width, 3)}",
                f"[{fmt_float(low, 6)}, {fmt_float(high, 6)}]",
                str(trace.matvecs),
                trace.method,
            ),
        ),
        caption=caption,
    )


_TRACE_NAMES = {"hutch++": "Hutch++", "xtrace": "XTrace", "hutchinson": "Hutchinson"}


def _layers_table(analysis: HessianAnalysis) -> Table:
    rows = tuple(
        (
            layer.module,
            f"{layer.n_params:,}",
            fmt_float(layer.lambda_max.value, 6),
            fmt_float(layer.trace.estimate, 6)
            + (
                ""
                if layer.trace.method == "exact"
                else f" ± {fmt_float(layer.trace.half_width, 3)}"
            ),
            _yes_no(layer.lambda_max.converged),
        )
        for layer in analysis.layers or []
    )
    return Table(
        title="per-module Hessian blocks",
        columns=("module", "params", "λmax", "trace", "converged"),
        rows=rows,
        caption="each block is the Hessian with respect to the module's own parameters; "
        "traces of blocks up to --probes parameters are exact",
    )


def _density_table(analysis: HessianAnalysis) -> Table:
    density = analysis.density
    assert density is not None
    return Table(
        title="eigenvalue density (SLQ)",
        columns=("grid min", "grid max", "runs", "steps", "bandwidth"),
        rows=(
            (
                fmt_float(density.grid[0], 6),
                fmt_float(density.grid[-1], 6),
                str(density.runs),
                str(density.steps),
                fmt_float(density.bandwidth, 3),
            ),
        ),
        caption="the density itself is in the JSON result (results.density)",
    )


def _run_table(analysis: HessianAnalysis, device: str) -> Table:
    op = analysis.operator
    loss = op["loss"] if op["loss"] == "ce" else f"{op['loss']} (γ = {op['gamma']:g})"
    engine = op["engine"] + (" (fallback)" if op.get("engine_fallback") else "")
    rows = [
        ("loss", f"{loss}, mean over all samples = {fmt_float(op['mean_loss'], 6)}"),
        ("mode", op["mode"]),
        ("engine", engine),
        ("samples (N)", f"{op['n_samples']:,}"),
        ("parameters (P)", f"{op['n_params']:,}"),
        (
            "device",
            device + (f" × {op['world_size']} processes" if op.get("world_size", 1) > 1 else ""),
        ),
        ("Hessian-vector products", f"{op['n_matvecs']:,}"),
        ("passes over the data", f"{op['n_data_passes']:,}"),
        ("seconds", fmt_float(sum(analysis.timings.values()), 3)),
    ]
    return Table(title="run", columns=("item", "value"), rows=tuple(rows))
