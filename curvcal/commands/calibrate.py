"""`curvcal calibrate CKPT --data SPEC`: predict, fit calibration maps, measure every stage."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.calibration_options import (
    CalibrationOptions,
    calibration_options,
    dropped_warning,
    nan_policy_option,
    settings_record,
    write_outputs,
)
from curvcal.commands.checkpoint_options import checkpoint_options
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import data_options
from curvcal.errors import EXIT_OK
from curvcal.pipeline.fitness import single_class_warning
from curvcal.report.calibration import calibration_tables
from curvcal.report.tables import check_output_path

if TYPE_CHECKING:
    import torch

    from curvcal.console import Reporter
    from curvcal.load.checkpoint import CheckpointOptions, LoadedModel
    from curvcal.load.data import DataOptions, LoadedData

DEFAULT_VAL_SPLIT = 0.5


@click.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False, path_type=Path))
@checkpoint_options
@data_options()
@click.option(
    "--fit-data",
    metavar="SPEC",
    help="Fit the maps on this dataset (same data options as --data) and evaluate on --data.",
)
@calibration_options("Default: both.")
@click.option(
    "--save-logits",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the logits and labels of all of --data to a .npz, .pt or .safetensors file.",
)
@nan_policy_option
@output_options
def calibrate(
    checkpoint: Path,
    checkpoint_options: CheckpointOptions,
    data_options: DataOptions,
    batch_size: int,
    fit_data: str | None,
    calibration: CalibrationOptions,
    save_logits: Path | None,
    nan_policy: str,
) -> int:
    """Fit temperature scaling and focal temperature scaling on one split of the data and
    measure ECE, AdaECE, NLL, Brier and friends on another.

    \b
    The fit split is --val-split F of --data (stratified, default 0.5, seeded by --seed), or
    all of --fit-data. Every metric is measured on the evaluation split only.
    """
    import torch

    from curvcal.calibration.analysis import analyse_calibration, analyse_val_split
    from curvcal.distributed import init_from_env, launched_by_torchrun, shutdown
    from curvcal.load.checkpoint import load_model, resolve_device
    from curvcal.load.data import load_dataset, stratified_split
    from curvcal.outputs import data_inputs
    from curvcal.pipeline.fitness import check_fitness
    from curvcal.provenance import environment
    from curvcal.results import Report

    written = calibration.outputs()
    if save_logits is not None:
        written.append(("--save-logits", save_logits))
    output, reporter = start(
        inputs=[
            ("CHECKPOINT", checkpoint),
            *data_inputs("--data", data_options.spec),
            *data_inputs("--fit-data", fit_data),
        ],
        outputs=written,
    )
    method = calibration.method or "both"
    if method == "none" and (calibration.val_split is not None or fit_data is not None):
        raise click.UsageError("--method none fits nothing: drop --val-split/--fit-data")
    if fit_data is not None and calibration.val_split is not None:
        raise click.UsageError("give --val-split or --fit-data, not both")
    if method == "none" and calibration.save_calibrator is not None:
        raise click.UsageError("--save-calibrator needs a fit: --method ts, focal-ts or both")
    settings = calibration.settings(method)
    calibration.check_outputs(output.force)
    if save_logits is not None:
        _check_logits_path(save_logits, output.force)
    fraction = None
    if method != "none" and fit_data is None:
        fraction = calibration.val_split or DEFAULT_VAL_SPLIT

    if launched_by_torchrun():
        device = resolve_device(checkpoint_options.device)
        if device.type == "cuda" and device.index is None:
            import os

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timings: dict[str, float] = {}
    began = time.perf_counter()
    loaded = load_model(checkpoint, checkpoint_options)
    context = init_from_env(loaded.device)
    trust = checkpoint_options.trust
    data = load_dataset(dataclasses.replace(data_options, trust=trust))
    n_classes = check_fitness(loaded, data, "--data")
    fit_loaded = None
    if fit_data is not None:
        fit_loaded = load_dataset(dataclasses.replace(data_options, spec=fit_data, trust=trust))
        check_fitness(loaded, fit_loaded, "--fit-data")
    warnings: list[str] = []
    if n_classes == 1:
        warnings.append(single_class_warning(str(checkpoint)))
        reporter.warn(warnings[-1])
    timings["load"] = time.perf_counter() - began

    began = time.perf_counter()
    predictions = _predict(loaded, data, batch_size, reporter, "inference")
    fit_predictions = (
        None
        if fit_loaded is None
        else _predict(loaded, fit_loaded, batch_size, reporter, "inference (fit data)")
    )
    timings["inference"] = time.perf_counter() - began
    if not context.is_main:
        shutdown()
        return EXIT_OK
    assert predictions is not None
    logits, labels = predictions
    if save_logits is not None:
        from curvcal.load.logits import save_logits as write_logits

        write_logits(save_logits, logits, labels)

    began = time.perf_counter()
    source = f"--data {data.spec}"
    dropped = {"data": 0, "fit_data": 0}
    shown = len(warnings)
    logits, labels, dropped["data"] = _finite_rows(logits, labels, nan_policy, source, warnings)
    if fit_predictions is not None:
        fit_logits, fit_labels, dropped["fit_data"] = _finite_rows(
            *fit_predictions, nan_policy, f"--fit-data {fit_data}", warnings
        )
        fit_predictions = (fit_logits, fit_labels)
    for warning in warnings[shown:]:
        reporter.warn(warning)
    if fit_predictions is not None:
        analysis = analyse_calibration(
            *fit_predictions,
            logits,
            labels,
            "logits",
            settings,
            "fit-data",
            None,
            fit_source=f"--fit-data {fit_data}",
            eval_source=source,
        )
    elif fraction is not None:
        fit_idx, eval_idx = stratified_split(labels, fraction, settings.seed)
        analysis = analyse_val_split(
            logits,
            labels,
            fit_idx,
            eval_idx,
            "logits",
            settings,
            fraction,
            f"{source}",
        )
    else:
        analysis = analyse_calibration(
            None, None, logits, labels, "logits", settings, "none", eval_source=source
        )
    timings["calibration"] = time.perf_counter() - began
    began = time.perf_counter()
    write_outputs(analysis, calibration)
    timings["outputs"] = time.perf_counter() - began

    inputs: dict[str, Any] = {
        "checkpoint": loaded.describe(),
        "data": {**data.describe(), "dropped_rows": dropped["data"]},
    }
    if fit_loaded is not None:
        inputs["fit_data"] = {**fit_loaded.describe(), "dropped_rows": dropped["fit_data"]}
    report = Report(
        command="calibrate",
        results=analysis,
        inputs=inputs,
        settings={
            **settings_record(calibration, settings),
            "val_split": fraction,
            "fit_data": fit_data,
            "batch_size": batch_size,
            "checkpoint": checkpoint_options,
            "data": data_options,
            "save_logits": save_logits,
            "world_size": context.world_size,
            "nan_policy": nan_policy,
        },
        timings=timings,
        environment=environment(loaded.device),
        warnings=warnings,
    )
    code = finish(report, calibration_tables(analysis, chart=output.fmt == "table"))
    shutdown()
    return code


def _finite_rows(
    logits: torch.Tensor, labels: torch.Tensor, policy: str, source: str, warnings: list[str]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The model's logits under ``--nan-policy``: rows with a NaN or Inf stop the run (exit 3,
    naming the data and the first such sample) or are left out with a warning."""
    from curvcal.errors import NumericalError
    from curvcal.load.logits import drop_rows, nonfinite_rows

    rows = nonfinite_rows(logits)
    count, total = int(rows.numel()), int(logits.shape[0])
    if count == 0:
        return logits, labels, 0
    if policy == "error" or count == total:
        raise NumericalError(
            source,
            f"the model's logits are NaN or Inf for {count} of {total} samples, the first "
            f"being sample {int(rows[0])}",
            "check the weights and inputs"
            + ("; --nan-policy drop leaves such samples out" if count < total else ""),
        )
    warnings.append(dropped_warning(count, total, source))
    kept_logits, kept_labels = drop_rows(logits, labels, rows)
    return kept_logits, kept_labels, count


def _check_logits_path(path: Path, force: bool) -> None:
    from curvcal.load.tensorfile import is_tensor_file

    if not is_tensor_file(path):
        raise click.BadParameter(
            f"cannot tell the format of {path} (name a .npz, .pt or .safetensors file)",
            param_hint="'--save-logits'",
        )
    check_output_path(path, force)


def _predict(
    loaded: LoadedModel, data: LoadedData, batch_size: int, reporter: Reporter, label: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Logits and labels of all of ``data``: this rank's shard, gathered on rank 0 (``None``
    on the other ranks); in one process, all samples in one pass."""
    from curvcal.distributed import current, gather_rows, shard_indices
    from curvcal.errors import InputError
    from curvcal.load.data import iter_batches
    from curvcal.pipeline.inference import predict_logits

    context = current()
    indices = shard_indices(data.n_samples, context.rank, context.world_size)
    if context.active and data.n_samples < context.world_size:
        raise InputError(
            f"--data {data.spec}",
            f"{data.n_samples} samples for {context.world_size} processes",
            "run fewer processes",
        )
    with reporter.progress(label, len(indices)) as advance:
        logits, labels = predict_logits(
            loaded.module, iter_batches(data.dataset, batch_size, indices), loaded.device, advance
        )
    all_logits = gather_rows(logits, data.n_samples)
    all_labels = gather_rows(labels, data.n_samples)
    if all_logits is None or all_labels is None:
        return None
    return all_logits, all_labels
