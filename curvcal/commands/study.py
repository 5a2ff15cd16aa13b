"""`curvcal study CKPT... --data SPEC`: curvature and calibration of several checkpoints measured
the same way, one table, and the rank correlations between the two.

A thin shell over :mod:`curvcal.study`: it loads each checkpoint, measures λmax and tr(H) of the
Hessian on ``--curvature-data`` (default ``--data``), calibrates on ``--data`` (maps fitted on a
stratified ``--val-split`` part, every metric on the rest), and hands the rows to the report.
"""

from __future__ import annotations

import dataclasses
import glob
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.checkpoint_options import checkpoint_options as checkpoint_options_decorator
from curvcal.commands.common import finish, output_options, start
from curvcal.commands.data_options import data_options as data_options_decorator
from curvcal.commands.hessian import check_loss_options
from curvcal.errors import CurvcalError, InputError
from curvcal.report import Table, check_output_path, fmt_float

if TYPE_CHECKING:
    from curvcal.load.checkpoint import CheckpointOptions, LoadedModel
    from curvcal.load.data import DataOptions, LoadedData
    from curvcal.study import Correlation, StudyResult, StudyRow

LOSSES = ("ce", "focal", "own")
#: Metadata key of the trace-penalty weight λ a checkpoint was trained with (CE + λ·tr(H)).
PENALTY_METADATA_KEY = "curvcal.trace_penalty"
PLOT_FILES = {"gamma": "lambda_max_vs_gamma.png", "ece": "trace_vs_ece.png"}
DEFAULT_VAL_SPLIT = 0.5


@click.command()
@click.argument("checkpoints", nargs=-1, required=True, metavar="CKPT...")
@checkpoint_options_decorator
@data_options_decorator()
@click.option(
    "--curvature-data",
    metavar="SPEC",
    help="Measure the Hessian on this dataset (same data options as --data); default --data.",
)
@click.option(
    "--loss",
    type=click.Choice(LOSSES),
    default="ce",
    show_default=True,
    help="Hessian of: ce, focal (with --gamma), or own: each checkpoint's training loss from "
    "its metadata (ce, focal γ, flsd53).",
)
@click.option("--gamma", type=click.FloatRange(min=0), help="γ of --loss focal.")
@click.option(
    "--method",
    type=click.Choice(("lanczos", "power")),
    default="lanczos",
    show_default=True,
    help="Eigenvalue method for λmax.",
)
@click.option(
    "--tol",
    type=click.FloatRange(min=0, min_open=True),
    default=1e-4,
    show_default=True,
    help="Relative tolerance of λmax.",
)
@click.option("--max-iter", type=click.IntRange(min=1), help="Iteration budget of λmax.")
@click.option(
    "--probes",
    type=click.IntRange(min=4),
    default=50,
    show_default=True,
    help="Hessian-vector products for the Hutch++ estimate of tr(H).",
)
@click.option(
    "--val-split",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=DEFAULT_VAL_SPLIT,
    show_default=True,
    metavar="F",
    help="Fit TS and focal TS on a stratified fraction F of --data, measure on the rest.",
)
@click.option(
    "--gammas",
    metavar="G1,G2,...",
    help="γ grid of focal temperature scaling [default: 0,0.25,0.5,0.75,1,1.5,2,3,5,7].",
)
@click.option(
    "--bins", type=click.IntRange(min=1), default=15, show_default=True, help="ECE/AdaECE bins."
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the Lanczos start, the probes and --val-split.",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=f"Write {PLOT_FILES['gamma']} and {PLOT_FILES['ece']} into DIR (needs matplotlib).",
)
@output_options
def study(
    checkpoints: tuple[str, ...],
    checkpoint_options: CheckpointOptions,
    data_options: DataOptions,
    batch_size: int,
    curvature_data: str | None,
    loss: str,
    gamma: float | None,
    method: str,
    tol: float,
    max_iter: int | None,
    probes: int,
    val_split: float,
    gammas: str | None,
    bins: int,
    seed: int,
    plot_dir: Path | None,
) -> int:
    """λmax and tr(H) against ECE, AdaECE, NLL, temperature and focal TS for several
    checkpoints, with Spearman rank correlations.

    \b
    CKPT... are files or quoted globs ('runs/*.safetensors'). Every checkpoint is measured with
    the same settings: the Hessian of the mean --loss over all of --curvature-data (default
    --data), and calibration on --data, maps fitted on a stratified --val-split part and every
    metric measured on the rest.
    """
    from curvcal.calibration.analysis import CalibrationSettings, analyse_val_split
    from curvcal.inference import predict_logits
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import check_labels, iter_batches, load_dataset, stratified_split
    from curvcal.provenance import environment
    from curvcal.results import Report
    from curvcal.study import (
        CurvatureSettings,
        StudyResult,
        StudyRow,
        calibration_summary,
        measure_curvature,
        rank_correlations,
    )

    output, reporter = start()
    began = time.perf_counter()
    check_loss_options(loss, gamma)
    paths = expand_checkpoints(checkpoints)
    plots = _plot_paths(plot_dir, output.force)
    curvature_settings = CurvatureSettings(
        method=method, tol=tol, max_iter=max_iter, probes=probes, seed=seed
    )
    calibration_settings = CalibrationSettings(method="both", bins=bins, seed=seed)
    if gammas is not None:
        calibration_settings = dataclasses.replace(calibration_settings, gammas=_gamma_grid(gammas))

    trust = checkpoint_options.trust
    data = load_dataset(dataclasses.replace(data_options, trust=trust))
    hessian_data = data
    if curvature_data is not None:
        hessian_data = load_dataset(
            dataclasses.replace(data_options, spec=curvature_data, trust=trust)
        )
    fit_idx, eval_idx = stratified_split(data.labels, val_split, seed)

    rows: list[StudyRow] = []
    inputs: list[dict[str, Any]] = []
    with reporter.progress("checkpoints", len(paths)) as advance:
        for path in paths:
            with naming_the_checkpoint(path):
                loaded = load_model(path, checkpoint_options)
                check_labels(data, loaded.num_classes)
                check_labels(hessian_data, loaded.num_classes)
                trained_loss, trained_gamma, penalty = training_loss(loaded)
                hessian_loss, hessian_gamma = _hessian_loss(loaded, loss, gamma)

                def batches(source: LoadedData = hessian_data) -> Any:
                    return iter_batches(source.dataset, batch_size)

                curvature = measure_curvature(
                    loaded.module, batches, hessian_loss, hessian_gamma, curvature_settings
                )
                logits, labels = predict_logits(
                    loaded.module, iter_batches(data.dataset, batch_size), loaded.device
                )
                analysis = analyse_val_split(
                    logits,
                    labels,
                    fit_idx,
                    eval_idx,
                    "logits",
                    calibration_settings,
                    val_split,
                    f"{path} on --data {data.spec}",
                )
                rows.append(
                    StudyRow(
                        checkpoint=path.name,
                        training_loss=trained_loss,
                        training_gamma=trained_gamma,
                        penalty=penalty,
                        curvature=curvature,
                        calibration=calibration_summary(analysis),
                    )
                )
                inputs.append(loaded.describe())
            advance(1)

    n_fit, n_eval = len(fit_idx), len(eval_idx)
    columns = column_provenance(loss, gamma, hessian_data, data, n_fit, n_eval)
    result = StudyResult(tuple(rows), rank_correlations(rows), columns)
    if plots is not None:
        draw_plots(result, plots)
    report = Report(
        command="study",
        results=result,
        inputs={
            "checkpoints": inputs,
            "data": data.describe(),
            "curvature_data": hessian_data.describe(),
        },
        settings={
            "loss": loss,
            "gamma": gamma,
            "curvature": curvature_settings,
            "calibration": calibration_settings,
            "val_split": val_split,
            "batch_size": batch_size,
            "checkpoint": checkpoint_options,
            "data": data_options,
            "curvature_data": curvature_data,
            "plot": plot_dir,
        },
        timings={"total": time.perf_counter() - began},
        environment=environment(loaded.device),
    )
    return finish(report, study_tables(result))


def expand_checkpoints(arguments: tuple[str, ...]) -> list[Path]:
    """Files named on the command line, a quoted glob expanded in sorted order; each must
    exist and be named once."""
    paths: list[Path] = []
    for argument in arguments:
        if Path(argument).exists():
            paths.append(Path(argument))
            continue
        matches = sorted(glob.glob(argument)) if glob.has_magic(argument) else []
        if not matches:
            raise InputError(argument, "no such checkpoint file (nor a glob matching one)")
        paths.extend(Path(m) for m in matches)
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise InputError(str(path), "is named twice", "give each checkpoint once")
        seen.add(path.resolve())
    return paths


@contextmanager
def naming_the_checkpoint(path: Path) -> Iterator[None]:
    """Errors raised while measuring one of several checkpoints name it (unless they do)."""
    try:
        yield
    except CurvcalError as error:
        if str(path) in error.message:
            raise
        raise type(error)(str(path), f"{error.what}: {error.why}", error.hint) from None


def training_loss(loaded: LoadedModel) -> tuple[str | None, float | None, float | None]:
    """``(loss, γ, λ)`` from the metadata: ``ce``/``focal``/``flsd53`` (``None`` when not
    recorded), the focal γ (``None`` for FLSD-53 and unknown losses, 0 for ce) and the trace
    penalty λ of a CE + λ·tr(H) training (``None`` without one)."""
    from curvcal.load.checkpoint import GAMMA_METADATA_KEY, LOSS_METADATA_KEY

    meta = loaded.metadata
    raw = (meta.get(LOSS_METADATA_KEY) or "").strip().lower()
    penalty = _number(meta.get(PENALTY_METADATA_KEY))
    if raw == "flsd53":
        return "flsd53", None, penalty
    if raw in ("ce", "cross_entropy", "cross-entropy"):
        return "ce", 0.0, penalty
    if raw == "focal":
        return "focal", _number(meta.get(GAMMA_METADATA_KEY)), penalty
    return None, None, penalty


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _hessian_loss(loaded: LoadedModel, loss: str, gamma: float | None) -> tuple[str, float | None]:
    """The Hessian's loss for this checkpoint: --loss, or with ``own`` its recorded one."""
    from curvcal.load.checkpoint import LOSS_METADATA_KEY, recorded_loss

    if loss != "own":
        return loss, gamma
    if (loaded.metadata.get(LOSS_METADATA_KEY) or "").strip().lower() == "flsd53":
        return "flsd53", None
    return recorded_loss(loaded)


def _gamma_grid(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError("--gammas", f"takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise InputError("--gammas", "needs at least one value")
    return values


def _plot_paths(plot_dir: Path | None, force: bool) -> dict[str, Path] | None:
    """The plot files, checked before any work (the folder is created if missing)."""
    if plot_dir is None:
        return None
    from curvcal.plot import require_matplotlib

    require_matplotlib()
    if plot_dir.exists() and not plot_dir.is_dir():
        raise InputError("--plot", f"{plot_dir} is not a directory")
    plot_dir.mkdir(parents=True, exist_ok=True)
    paths = {key: plot_dir / name for key, name in PLOT_FILES.items()}
    for path in paths.values():
        check_output_path(path, force)
    return paths


def column_provenance(
    loss: str,
    gamma: float | None,
    hessian_data: LoadedData,
    data: LoadedData,
    n_fit: int,
    n_eval: int,
) -> dict[str, str]:
    """Which loss and which samples every column of the table comes from."""
    from curvcal.study import hessian_loss_label

    hessian = (
        "each checkpoint's own training loss (column 'H loss')"
        if loss == "own"
        else hessian_loss_label(loss, gamma)
    )
    curvature = (
        f"Hessian of the mean {hessian} over all {hessian_data.n_samples} samples of "
        f"{hessian_data.spec} (eval mode)"
    )
    evaluation = f"evaluation split ({n_eval} of {data.n_samples} samples of {data.spec})"
    fit = f"fitted on the other {n_fit} samples (stratified)"
    return {
        "λmax": f"largest eigenvalue of the {curvature}",
        "tr(H)": f"Hutchinson trace of the {curvature}",
        "accuracy": evaluation,
        "ECE": f"15-bin top-label ECE (bins (a,b]) on the {evaluation}, uncalibrated",
        "AdaECE": f"equal-mass ECE on the {evaluation}, uncalibrated",
        "NLL": f"mean −log p_y on the {evaluation}, uncalibrated",
        "T": f"temperature scaling (NLL objective) {fit}",
        "FTS γ, T": f"focal temperature scaling (ECE objective) {fit}",
        "ECE after TS": f"ECE on the {evaluation} after TS",
        "ECE after FTS": f"ECE on the {evaluation} after focal TS",
    }


def _trained(row: StudyRow) -> str:
    if row.training_loss is None:
        text = "?"
    elif row.training_loss == "focal":
        text = f"focal γ={row.training_gamma:g}" if row.training_gamma is not None else "focal"
    else:
        text = row.training_loss
    if row.penalty:
        text += f" + {row.penalty:g}·tr(H)"
    return text


def study_tables(result: StudyResult) -> list[Table]:
    """The study table (one row per checkpoint), the column provenance and the correlations."""
    from curvcal.study import hessian_loss_label

    rows = tuple(
        (
            row.checkpoint,
            _trained(row),
            hessian_loss_label(row.curvature.loss, row.curvature.gamma),
            fmt_float(row.curvature.lambda_max, 4)
            + ("" if row.curvature.lambda_max_converged else " (unconverged)"),
            f"{fmt_float(row.curvature.trace, 4)} ± {fmt_float(row.curvature.trace_standard_error, 2)}",
            fmt_float(row.calibration.accuracy, 4),
            fmt_float(row.calibration.ece, 4),
            fmt_float(row.calibration.adaece, 4),
            fmt_float(row.calibration.nll, 4),
            fmt_float(row.calibration.temperature, 4),
            f"{row.calibration.focal_gamma:g}, {fmt_float(row.calibration.focal_temperature, 4)}",
            fmt_float(row.calibration.ece_after_ts, 4),
            fmt_float(row.calibration.ece_after_fts, 4),
        )
        for row in result.rows
    )
    first = result.rows[0]
    study_table = Table(
        title="curvature and calibration per checkpoint",
        columns=(
            "checkpoint",
            "trained with",
            "H loss",
            "λmax",
            "tr(H) ± s.e.",
            "accuracy",
            "ECE",
            "AdaECE",
            "NLL",
            "T",
            "FTS γ, T",
            "ECE after TS",
            "ECE after FTS",
        ),
        rows=rows,
        caption=(
            f"λmax, tr(H): Hessian on {first.curvature.n_samples} samples; calibration columns "
            f"on {first.calibration.n_eval} evaluation samples, maps fitted on "
            f"{first.calibration.n_fit} others (see the 'columns' table)"
        ),
    )
    columns_table = Table(
        title="columns: loss and samples",
        columns=("column", "measured as"),
        rows=tuple(result.columns.items()),
    )
    return [study_table, columns_table, correlation_table(result.correlations)]


def correlation_table(correlations: tuple[Correlation, ...]) -> Table:
    """Spearman ρ and p-value of every (curvature, calibration) pair."""
    from curvcal.study import CALIBRATION_MEASURES, CURVATURE_MEASURES

    rows = tuple(
        (
            CURVATURE_MEASURES[c.curvature],
            CALIBRATION_MEASURES[c.calibration],
            fmt_float(c.rho, 3) if c.rho is not None else (c.note or "—"),
            fmt_float(c.p_value, 2) if c.p_value is not None else "—",
            str(c.n),
        )
        for c in correlations
    )
    return Table(
        title="Spearman rank correlation across checkpoints",
        columns=("curvature", "calibration", "ρ", "p-value", "n"),
        rows=rows,
        caption="scipy.stats.spearmanr, two-sided p-value (t approximation: rough for small n)",
    )


def draw_plots(result: StudyResult, paths: dict[str, Path]) -> None:
    """λmax against the training γ (checkpoints trained with ce or a fixed-γ focal loss only)
    and tr(H) against ECE (every checkpoint)."""
    from curvcal.plot import scatter_plot

    fixed = [row for row in result.rows if row.training_gamma is not None]
    scatter_plot(
        [row.training_gamma or 0.0 for row in fixed],
        [row.curvature.lambda_max for row in fixed],
        [row.checkpoint.rsplit(".", 1)[0] for row in fixed],
        "training focal γ (ce = 0)",
        "λmax",
        paths["gamma"],
        title="λmax vs focal γ (FLSD-53 and untagged left out)",
    )
    scatter_plot(
        [row.curvature.trace for row in result.rows],
        [row.calibration.ece for row in result.rows],
        [row.checkpoint.rsplit(".", 1)[0] for row in result.rows],
        "tr(H)",
        "ECE (uncalibrated)",
        paths["ece"],
        title="tr(H) vs ECE",
    )
