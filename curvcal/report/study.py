"""The tables and plots of a study across checkpoints (``curvcal study``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from curvcal.errors import InputError
from curvcal.inputs import refuse_output
from curvcal.report.hessian import trace_below_lambda_max
from curvcal.report.tables import Table, check_output_path, fmt_float

if TYPE_CHECKING:
    from curvcal.study.summary import Correlation, StudyResult, StudyRow

#: ``--plot DIR`` files, by what they show.
PLOT_FILES = {
    "gamma": "lambda_max_vs_gamma",
    "lambda_ece": "lambda_max_vs_ece",
    "ece": "trace_vs_ece",
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


def _trace_cell(row: StudyRow) -> str:
    curvature = row.curvature
    if curvature.trace_method == "gauss-newton":
        return f"{fmt_float(curvature.trace, 4)} (exact)"
    return f"{fmt_float(curvature.trace, 4)} ± {fmt_float(curvature.trace_standard_error, 2)}"


def study_tables(result: StudyResult) -> list[Table]:
    """The study table (one row per checkpoint), the maps table (one row per checkpoint and
    map, when ``--maps`` is not the default), the column provenance and the correlations."""
    from curvcal.study.summary import hessian_loss_label, row_stages

    stages = row_stages(result.rows)
    default = all(row.calibration.maps is None for row in result.rows)
    columns: list[str] = [
        "checkpoint",
        "trained with",
        "H loss",
        "λmax",
        "tr(H) ± s.e.",
        "accuracy",
        "ECE",
        "AdaECE",
        "NLL",
    ]
    if "ts" in stages:
        columns.append("T")
    if "focal_ts" in stages:
        columns.append("FTS γ, T")
    if default:
        columns += ["ECE after TS", "ECE after FTS"]
    rows = []
    for row in result.rows:
        calibration = row.calibration
        cells = [
            row.checkpoint,
            _trained(row),
            hessian_loss_label(row.curvature.loss, row.curvature.gamma),
            fmt_float(row.curvature.lambda_max, 4)
            + (
                ""
                if row.curvature.lambda_max_convergence == "yes"
                else f" ({row.curvature.lambda_max_convergence})"
            ),
            _trace_cell(row),
            fmt_float(calibration.accuracy, 4),
            fmt_float(calibration.ece, 4),
            fmt_float(calibration.adaece, 4),
            fmt_float(calibration.nll, 4),
        ]
        if "ts" in stages:
            cells.append(fmt_float(calibration.temperature, 4))
        if "focal_ts" in stages:
            cells.append(
                "—"
                if calibration.focal_gamma is None
                else f"{calibration.focal_gamma:g}, {fmt_float(calibration.focal_temperature, 4)}"
            )
        if default:
            cells += [
                fmt_float(calibration.ece_after_ts, 4),
                fmt_float(calibration.ece_after_fts, 4),
            ]
        rows.append(tuple(cells))
    first = result.rows[0]
    above = [
        f"{row.checkpoint}: "
        + trace_below_lambda_max(row.curvature.lambda_max, row.curvature.trace)
        for row in result.rows
        if trace_below_lambda_max(row.curvature.lambda_max, row.curvature.trace)
    ]
    study_table = Table(
        title="curvature and calibration per checkpoint",
        columns=tuple(columns),
        rows=tuple(rows),
        caption=(
            f"λmax, tr(H): Hessian on {first.curvature.n_samples} samples (tr(H) exact by "
            "Gauss–Newton where the logits are linear in each tensor, else its Gauss–Newton "
            "part exact and Hutch++ on the rest, ± its standard error); calibration columns "
            f"on {first.calibration.n_eval} evaluation samples, maps fitted on "
            f"{first.calibration.n_fit} others (see the 'columns' table)"
            + "".join(f"; {note}" for note in above)
        ),
    )
    columns_table = Table(
        title="columns: loss and samples",
        columns=("column", "measured as"),
        rows=tuple(result.columns.items()),
    )
    tables = [study_table]
    if not default:
        tables.append(maps_table(result, stages))
    return [*tables, columns_table, correlation_table(result.correlations, result.measures())]


def maps_table(result: StudyResult, stages: tuple[str, ...]) -> Table:
    """ECE and NLL after each map, one row per checkpoint and map (long, so that any number of
    maps fits 80 columns), the best by NLL marked (``--maps all``)."""
    from curvcal.calibration.registry import MAPS

    rows = []
    for row in result.rows:
        calibration = row.calibration
        scores = calibration.maps or {}
        for stage in stages:
            score = scores.get(stage)
            reason = (calibration.skipped or {}).get(stage)
            if score is None:
                cells = ("—", "—", f"skipped: {reason}" if reason else "not fitted")
            else:
                best = "best by NLL" if calibration.best == stage else ""
                cells = (fmt_float(score.ece, 4), fmt_float(score.nll, 4), best)
            rows.append((row.checkpoint, MAPS[stage].title, *cells))
        if calibration.best == "uncalibrated":
            rows.append((row.checkpoint, "uncalibrated", "", "", "best by NLL"))
    skipped = {
        stage: reason
        for row in result.rows
        for stage, reason in (row.calibration.skipped or {}).items()
        if stage not in stages
    }
    not_fitted = "".join(f"; {MAPS[stage].title} skipped: {why}" for stage, why in skipped.items())
    return Table(
        title="after calibration: each map per checkpoint",
        columns=("checkpoint", "map", "ECE", "NLL", "note"),
        rows=tuple(rows),
        caption=(
            f"ECE and NLL on the {result.rows[0].calibration.n_eval} evaluation samples after "
            "each map, fitted on the others; 'best by NLL' (--maps all): calibrate --method "
            f"all's ranking{not_fitted}"
        ),
    )


def correlation_table(
    correlations: tuple[Correlation, ...], measures: dict[str, str] | None = None
) -> Table:
    """Spearman ρ and p-value of every (curvature, calibration) pair that has one; the pairs
    without one share a line per cause (fewer than 3 checkpoints, a constant measure)."""
    from curvcal.study.spearman import EXACT, EXACT_MAX_N
    from curvcal.study.summary import CALIBRATION_MEASURES, CURVATURE_MEASURES

    calibration_names = CALIBRATION_MEASURES if measures is None else measures
    defined = tuple(
        (
            CURVATURE_MEASURES[c.curvature],
            calibration_names[c.calibration],
            fmt_float(c.rho, 3),
            fmt_float(c.p_value, 2) + ("" if c.p_method == EXACT else " (t approx.)"),
            str(c.n),
        )
        for c in correlations
        if c.rho is not None and c.p_value is not None
    )
    causes: dict[str, tuple[list[str], list[str], int]] = {}
    for c in correlations:
        if c.rho is None or c.p_value is None:
            curvature, calibration, _n = causes.setdefault(c.note or "undefined", ([], [], c.n))
            for names, key, seen in (
                (CURVATURE_MEASURES, c.curvature, curvature),
                (calibration_names, c.calibration, calibration),
            ):
                if names[key] not in seen:
                    seen.append(names[key])
    undefined = tuple(
        (
            "all" if len(curvature) == len(CURVATURE_MEASURES) else ", ".join(curvature),
            "all" if len(calibration) == len(calibration_names) else ", ".join(calibration),
            f"undefined: {note}",
            "—",
            str(n),
        )
        for note, (curvature, calibration, n) in causes.items()
    )
    return Table(
        title="Spearman rank correlation across checkpoints",
        columns=("curvature", "calibration", "ρ", "p-value", "n"),
        rows=defined + undefined,
        caption=(
            "ρ of the average ranks; two-sided p-value exact over all n! pairings of the ranks "
            f"for n ≤ {EXACT_MAX_N} (the smallest possible is 2/n!), else scipy's t "
            "approximation"
        ),
    )


def draw_plots(
    result: StudyResult, paths: dict[str, Path], caption: str | None = None
) -> list[str]:
    """λmax against the training γ (checkpoints trained with ce or a fixed-γ focal loss, when
    they span at least two γ), λmax against ECE and tr(H) against ECE (every checkpoint), each
    with Spearman's ρ and the curvature's error bars: λmax ± its residual bound ‖Hv − λv‖
    (an eigenvalue of H lies that close), tr(H) ± 1.96 standard errors; ``caption`` (the
    checkpoints and the data) above each. Returns a note for each plot left out, saying why."""
    from curvcal.report.plots import scatter_plot

    rows = result.rows
    names = [row.checkpoint.rsplit(".", 1)[0] for row in rows]
    residual = [abs(row.curvature.lambda_max_residual * row.curvature.lambda_max) for row in rows]
    notes = []
    fixed = [i for i, row in enumerate(rows) if row.training_gamma is not None]
    if len({rows[i].training_gamma for i in fixed}) < 2:
        notes.append(
            f"{paths['gamma'].name} not written: it needs checkpoints trained with at least two "
            "focal γ (ce counts as γ = 0) recorded in their metadata; "
            f"{len(fixed)} of {len(rows)} record one"
        )
    else:
        scatter_plot(
            [rows[i].training_gamma or 0.0 for i in fixed],
            [rows[i].curvature.lambda_max for i in fixed],
            [names[i] for i in fixed],
            "training focal γ (ce = 0)",
            "λmax",
            paths["gamma"],
            title="λmax vs focal γ (FLSD-53 and untagged left out)",
            yerr=[residual[i] for i in fixed],
            caption=caption,
        )
    ece = [row.calibration.ece for row in rows]
    scatter_plot(
        [row.curvature.lambda_max for row in rows],
        ece,
        names,
        "λmax (± residual bound)",
        "ECE (uncalibrated)",
        paths["lambda_ece"],
        title="λmax vs ECE",
        xerr=residual,
        note=_rho(result, "lambda_max"),
        caption=caption,
    )
    scatter_plot(
        [row.curvature.trace for row in rows],
        ece,
        names,
        "tr(H) (± 1.96 SE)",
        "ECE (uncalibrated)",
        paths["ece"],
        title="tr(H) vs ECE",
        xerr=[1.96 * row.curvature.trace_standard_error for row in rows],
        note=_rho(result, "trace"),
        caption=caption,
    )
    return notes


def _rho(result: StudyResult, curvature: str) -> str:
    """Spearman's ρ of ``curvature`` against ECE, as the correlation table has it."""
    for item in result.correlations:
        if item.curvature == curvature and item.calibration == "ece":
            if item.rho is None:
                return f"Spearman ρ undefined: {item.note}"
            p = "" if item.p_value is None else f", p = {item.p_value:.3g}"
            return f"Spearman ρ = {item.rho:.3f}{p} (n = {item.n})"
    return "Spearman ρ not measured"


def plot_files(plot_dir: Path | None, fmt: str = "png") -> dict[str, Path]:
    """The files ``--plot DIR`` writes in format ``fmt`` (none without it)."""
    if plot_dir is None:
        return {}
    return {key: plot_dir / f"{name}.{fmt}" for key, name in PLOT_FILES.items()}


def plot_paths(plot_dir: Path | None, force: bool, fmt: str = "png") -> dict[str, Path] | None:
    """The plot files, checked before any work (the folder is created if missing)."""
    if plot_dir is None:
        return None
    from curvcal.report.plots import require_matplotlib

    require_matplotlib()
    if plot_dir.exists() and not plot_dir.is_dir():
        raise InputError("--plot", f"{plot_dir} is not a directory")
    refuse_output(plot_dir, "--plot")  # a folder created inside an input would change it
    plot_dir.mkdir(parents=True, exist_ok=True)
    paths = plot_files(plot_dir, fmt)
    for path in paths.values():
        check_output_path(path, force)
    return paths
