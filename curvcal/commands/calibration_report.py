"""What ``curvcal calibrate``, ``curvcal metrics`` and ``curvcal demo`` share: the calibration
options, the tables built from a :class:`~curvcal.calibration.analysis.CalibrationAnalysis`,
the reliability plot, the calibrator file and the validation split."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from curvcal.report import Table, check_output_path, fmt_float, write_atomic

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis, CalibrationSettings
    from curvcal.calibration.results import CalibrationMetrics, FocalTemperatureFit

F = TypeVar("F", bound=Callable[..., Any])

STAGE_TITLES = {"uncalibrated": "uncalibrated", "ts": "TS", "focal_ts": "focal TS"}
CHART_WIDTH = 20
DEMO_VAL_SPLIT = 0.5

_OPTION_NAMES = (
    "method",
    "objective",
    "focal_objective",
    "gammas",
    "bins",
    "edges",
    "bootstrap",
    "val_split",
    "seed",
    "plot",
    "dpi",
    "plot_classes",
    "save_calibrator",
)


@dataclass(frozen=True)
class CalibrationOptions:
    """The calibration options as given (``method`` and ``val_split`` are ``None`` when absent;
    each command resolves them)."""

    method: str | None
    objective: str
    focal_objective: str
    gammas: tuple[float, ...] | None
    bins: int
    edges: str
    bootstrap: int
    val_split: float | None
    seed: int
    plot: Path | None
    dpi: int
    plot_classes: int
    save_calibrator: Path | None

    def settings(self, method: str) -> CalibrationSettings:
        from curvcal.calibration.analysis import CalibrationSettings

        extra = {} if self.gammas is None else {"gammas": self.gammas}
        return CalibrationSettings(
            method=method,
            objective=self.objective,
            focal_objective=self.focal_objective,
            bins=self.bins,
            edges=self.edges,
            bootstrap=self.bootstrap,
            seed=self.seed,
            reliability_classes=self.plot_classes if self.plot is not None else 0,
            **extra,
        )

    def check_outputs(self, force: bool) -> None:
        """Refuse, before any work, an output file that exists (without ``--force``) or cannot
        be written, and a plot suffix that names no format."""
        for path in (self.plot, self.save_calibrator):
            if path is not None:
                check_output_path(path, force)
        if self.plot is not None:
            from curvcal.plot import SUFFIXES, require_matplotlib

            if self.plot.suffix.lower() not in SUFFIXES:
                raise click.BadParameter(
                    f"cannot tell the format of {self.plot} (name a .png, .svg or .pdf file)",
                    param_hint="'--plot'",
                )
            require_matplotlib()


def _gamma_list(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        gammas = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(
            f"takes comma-separated numbers such as 0,0.5,1,2; got '{value}'", ctx, param
        ) from None
    if not gammas:
        raise click.BadParameter("needs at least one value", ctx, param)
    if any(not (0 <= g < math.inf) for g in gammas):
        raise click.BadParameter(f"values must be finite and >= 0; got '{value}'", ctx, param)
    return gammas


def calibration_options(fit_help: str) -> Callable[[F], F]:
    """Add the options of a calibration run; the command receives one ``calibration`` keyword
    argument (a :class:`CalibrationOptions`). ``fit_help`` completes the ``--method`` help."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in _OPTION_NAMES}
            return func(*args, calibration=CalibrationOptions(**values), **kwargs)

        decorators = [
            click.option(
                "--method",
                type=click.Choice(("ts", "focal-ts", "both", "none")),
                help=f"Calibration maps to fit: temperature scaling, focal temperature scaling, "
                f"both, or none (metrics only). {fit_help}",
            ),
            click.option(
                "--objective",
                type=click.Choice(("nll", "ece", "adaece")),
                default="nll",
                show_default=True,
                help="What temperature scaling minimises on the fit split.",
            ),
            click.option(
                "--focal-objective",
                type=click.Choice(("ece", "nll", "adaece")),
                default="ece",
                show_default=True,
                help="What focal temperature scaling minimises on the fit split (picks γ and T).",
            ),
            click.option(
                "--gammas",
                callback=_gamma_list,
                metavar="G1,G2,...",
                help="γ grid of focal temperature scaling "
                "[default: 0,0.25,0.5,0.75,1,1.5,2,3,5,7].",
            ),
            click.option(
                "--bins",
                type=click.IntRange(min=1),
                default=15,
                show_default=True,
                help="Bins of ECE, MCE, RMS-CE, AdaECE and classwise ECE.",
            ),
            click.option(
                "--edges",
                type=click.Choice(("left", "right")),
                default="left",
                show_default=True,
                help="Equal-width bin edges: left = (a,b], right = [a,b).",
            ),
            click.option(
                "--bootstrap",
                type=click.IntRange(min=0),
                default=0,
                show_default=True,
                metavar="N",
                help="Bootstrap resamples for 95% intervals of ECE, AdaECE, MCE and NLL.",
            ),
            click.option(
                "--val-split",
                type=click.FloatRange(0, 1, min_open=True, max_open=True),
                metavar="F",
                help="Fit on a stratified fraction F of the samples, evaluate on the rest.",
            ),
            click.option(
                "--seed",
                type=click.IntRange(min=0),
                default=0,
                show_default=True,
                help="Seed of --val-split and of the bootstrap.",
            ),
            click.option(
                "--plot",
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help="Write reliability diagrams (uncalibrated, TS, focal TS) to a .png, "
                ".svg or .pdf file (needs matplotlib).",
            ),
            click.option(
                "--dpi",
                type=click.IntRange(10, 2400),
                default=100,
                show_default=True,
                help="Resolution of --plot (dots per inch; the layout is fixed in inches).",
            ),
            click.option(
                "--plot-classes",
                type=click.IntRange(min=0),
                default=0,
                show_default=True,
                metavar="N",
                help="Add classwise reliability diagrams (p_k against y = k) of the N most "
                "frequent classes to --plot, one row per stage.",
            ),
            click.option(
                "--save-calibrator",
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help="Write the fitted calibrator(s) as JSON (for metrics --apply).",
            ),
        ]
        command: Callable[..., Any] = wrapper
        for decorator in reversed(decorators):
            command = decorator(command)
        return command  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------------------------
# splits and outputs


def write_outputs(analysis: CalibrationAnalysis, options: CalibrationOptions) -> None:
    """Write the ``--save-calibrator`` and ``--plot`` files that were asked for."""
    if options.save_calibrator is not None:
        from curvcal.load.calibrator import calibrators_json

        write_atomic(options.save_calibrator, calibrators_json(analysis.calibrators()))
    if options.plot is not None:
        from curvcal.plot import reliability_diagram

        panels = reliability_panels(analysis)
        stages = len(analysis.evaluation.present())
        columns = len(panels) if options.plot_classes == 0 else len(panels) // stages
        reliability_diagram(panels, options.plot, dpi=options.dpi, columns=columns)


def reliability_panels(analysis: CalibrationAnalysis) -> list[Any]:
    """One reliability panel per evaluated stage, from the equal-width bins of the metrics;
    with classwise tables, each stage's panel is followed by one panel per class."""
    from curvcal.plot import ReliabilityBin, ReliabilityPanel

    def plot_bins(table: Any) -> list[Any]:
        return [
            ReliabilityBin(
                item.lower,
                item.upper,
                item.count,
                item.confidence if item.count else None,
                item.accuracy if item.count else None,
            )
            for item in table
        ]

    panels = []
    for stage, metrics in analysis.evaluation.present():
        title = STAGE_TITLES[stage]
        panels.append(ReliabilityPanel(title, plot_bins(metrics.ece_bins), metrics.ece))
        for table in metrics.class_bins:
            n = sum(item.count for item in table.bins)
            gap = sum(item.count * abs(item.gap) for item in table.bins if item.count) / n
            panels.append(
                ReliabilityPanel(
                    f"{title}: class {table.class_index}",
                    plot_bins(table.bins),
                    gap,
                    f"p_{table.class_index} (frequency of y = {table.class_index} on the y axis)",
                )
            )
    return panels


# ---------------------------------------------------------------------------------------------
# tables

# (row label, attribute of CalibrationMetrics, key of its bootstrap intervals or None)
_METRIC_ROWS = (
    ("accuracy", "accuracy", None),
    ("mean confidence", "mean_confidence", None),
    ("ECE", "ece", "ece"),
    ("AdaECE", "adaece", "adaece"),
    ("MCE", "mce", "mce"),
    ("RMS-CE", "rms_ce", None),
    ("classwise ECE", "classwise_ece", None),
    ("smooth ECE", "smooth_ece", None),
    ("NLL", "nll", "nll"),
    ("Brier", "brier", None),
)


def calibration_tables(analysis: CalibrationAnalysis, chart: bool = True) -> list[Table]:
    """The metrics table, the reliability chart (when ``chart``), the fits, the γ profile and
    the split, in that order (tables of stages not run are left out)."""
    tables = [metrics_table(analysis)]
    if chart:
        tables.append(reliability_table(analysis))
    if analysis.fits.ts is not None or analysis.fits.focal_ts is not None:
        tables.append(fits_table(analysis))
    if analysis.fits.focal_ts is not None:
        tables.append(profile_table(analysis.fits.focal_ts))
    tables.append(split_table(analysis))
    return tables


def _cell(metrics: CalibrationMetrics, attribute: str, interval: str | None) -> str:
    value = getattr(metrics, attribute)
    text = fmt_float(value)
    if interval is not None and interval in metrics.intervals:
        low, high = metrics.intervals[interval]
        text += f" [{fmt_float(low)}, {fmt_float(high)}]"
    return text


def conventions(analysis: CalibrationAnalysis) -> str:
    """The line that says how the metrics were computed."""
    settings = analysis.settings
    side = "(a,b]" if settings.edges == "left" else "[a,b)"
    used = analysis.evaluation.uncalibrated.adaece_bins_used
    text = (
        f"ECE top-label, {settings.bins} equal-width bins {side}; AdaECE {settings.bins} "
        f"equal-mass bins ({used} used uncalibrated); classwise ECE: mean over "
        f"{analysis.n_classes} classes; NLL in nats; Brier summed over classes"
    )
    if settings.bootstrap:
        text += f"; [95% bootstrap interval, {settings.bootstrap} resamples, seed {settings.seed}]"
    return text


def metrics_table(analysis: CalibrationAnalysis) -> Table:
    """Rows = metrics, columns = the stages evaluated (all on the evaluation split)."""
    stages = analysis.evaluation.present()
    rows = [
        (label, *(_cell(metrics, attribute, interval) for _, metrics in stages))
        for label, attribute, interval in _METRIC_ROWS
    ]
    if analysis.n_classes == 2:
        rows.append(
            (
                "positive-class ECE (K = 2)",
                *(fmt_float(metrics.positive_class_ece) for _, metrics in stages),
            )
        )
    n_eval = analysis.evaluation.uncalibrated.n_samples
    where = "" if analysis.split.method == "none" else " on the evaluation split"
    return Table(
        title=f"calibration{where} ({n_eval} samples)",
        columns=("metric", *(_stage_title(analysis, stage) for stage, _ in stages)),
        rows=tuple(rows),
        caption=conventions(analysis),
    )


def _stage_title(analysis: CalibrationAnalysis, stage: str) -> str:
    title = STAGE_TITLES[stage]
    return f"{title} (applied)" if stage in analysis.applied else title


def chart(accuracy: float, confidence: float, width: int = CHART_WIDTH) -> str:
    """A bar of ``accuracy`` (█ over ·) with ``┃`` at the ``confidence``, ``width`` cells for
    [0, 1]: a marker right of the bar's end means over-confident."""
    cells = ["█" if i < round(accuracy * width) else "·" for i in range(width)]
    marker = min(width - 1, max(0, math.ceil(confidence * width) - 1))
    cells[marker] = "┃"
    return "".join(cells)


def reliability_table(analysis: CalibrationAnalysis) -> Table:
    """The non-empty equal-width bins of every stage: count, confidence, accuracy, gap, chart."""
    rows = []
    for stage, metrics in analysis.evaluation.present():
        first = True
        for item in metrics.ece_bins:
            if item.count == 0:
                continue
            side = f"({item.lower:.3g}, {item.upper:.3g}]"
            if analysis.settings.edges == "right":
                side = f"[{item.lower:.3g}, {item.upper:.3g})"
            rows.append(
                (
                    _stage_title(analysis, stage) if first else "",
                    side,
                    str(item.count),
                    fmt_float(item.confidence, 3),
                    fmt_float(item.accuracy, 3),
                    fmt_float(item.gap, 2),
                    chart(item.accuracy, item.confidence),
                )
            )
            first = False
    return Table(
        title="reliability (non-empty equal-width bins, evaluation split)",
        columns=("stage", "bin", "n", "confidence", "accuracy", "gap", "accuracy █ confidence ┃"),
        rows=tuple(rows),
        caption="gap = accuracy − confidence; ┃ right of the bar: over-confident",
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def fits_table(analysis: CalibrationAnalysis) -> Table:
    """The fitted maps: parameters, objective and NLL before/after on the fit split."""
    ts, focal = analysis.fits.ts, analysis.fits.focal_ts
    columns: list[tuple[str, dict[str, str]]] = []
    if ts is not None:
        columns.append(
            (
                "TS",
                {
                    "γ": "0",
                    "T": fmt_float(ts.temperature, 5),
                    "objective": ts.objective,
                    "objective before": fmt_float(ts.objective_before),
                    "objective after": fmt_float(ts.objective_after),
                    "NLL before": fmt_float(ts.nll_before),
                    "NLL after": fmt_float(ts.nll_after),
                    "dNLL/d ln T at T": fmt_float(ts.derivative, 2),
                    "T at a bracket end": _yes(ts.at_bracket_end),
                    "T bracket": f"[{fmt_float(ts.bracket[0])}, {fmt_float(ts.bracket[1])}]",
                    "grid step (ln T)": fmt_float(ts.grid_step),
                },
            )
        )
    if focal is not None:
        chosen = next(p for p in focal.profile if p.gamma == focal.gamma)
        columns.append(
            (
                "focal TS",
                {
                    "γ": fmt_float(focal.gamma),
                    "T": fmt_float(focal.temperature, 5),
                    "objective": focal.objective,
                    "objective before": fmt_float(focal.objective_before),
                    "objective after": fmt_float(focal.objective_after),
                    "NLL before": fmt_float(focal.nll_before),
                    "NLL after": fmt_float(focal.nll_after),
                    "dNLL/d ln T at T": "-",
                    "T at a bracket end": _yes(chosen.at_bracket_end),
                    "T bracket": f"[{fmt_float(focal.bracket[0])}, {fmt_float(focal.bracket[1])}]",
                    "grid step (ln T)": fmt_float(focal.grid_step),
                },
            )
        )
    labels = list(columns[0][1])
    return Table(
        title=f"fits (on the fit split, {analysis.split.n_fit} samples)",
        columns=("quantity", *(name for name, _ in columns)),
        rows=tuple((label, *(values[label] for _, values in columns)) for label in labels),
        caption="before/after: on the fit split itself (in-sample); judge the maps by the "
        "evaluation-split metrics",
    )


def profile_table(fit: FocalTemperatureFit) -> Table:
    """T and the objective at every γ of the grid; the chosen γ is marked."""
    rows = tuple(
        (
            fmt_float(point.gamma),
            fmt_float(point.temperature, 5),
            fmt_float(point.objective),
            _yes(point.at_bracket_end),
            "◀" if point.gamma == fit.gamma else "",
        )
        for point in fit.profile
    )
    return Table(
        title="focal TS γ profile (fit split)",
        columns=("γ", "T", fit.objective, "T at a bracket end", "chosen"),
        rows=rows,
        caption="γ is weakly identified: read the whole profile, not only the chosen γ",
    )


_SPLIT_CAPTIONS = {
    "val-split": "a stratified part of the data fitted the maps; the rest evaluated them",
    "fit-data": "the maps were fitted on --fit-data and evaluated on --data",
    "fit-file": "the maps were fitted on the --fit file and evaluated on the logits file",
    "none": "nothing fitted: every sample was evaluated",
}


def split_table(analysis: CalibrationAnalysis) -> Table:
    """Which samples fitted, which evaluated."""
    split = analysis.split
    rows: list[tuple[str, str]] = [
        ("method", split.method),
        ("fit samples", str(split.n_fit)),
        ("evaluation samples", str(split.n_eval)),
    ]
    if split.fraction is not None:
        rows.append(("fraction fitted", fmt_float(split.fraction)))
    if split.seed is not None:
        rows.append(("seed", str(split.seed)))
    caption = _SPLIT_CAPTIONS[split.method]
    if analysis.applied:
        stages = ", ".join(STAGE_TITLES[s] for s in analysis.applied)
        caption = f"saved calibrators applied ({stages}); nothing fitted: every sample evaluated"
    return Table(title="split", columns=("quantity", "value"), rows=tuple(rows), caption=caption)


def settings_record(options: CalibrationOptions, settings: CalibrationSettings) -> dict[str, Any]:
    """The calibration options as the report's ``settings`` records them."""
    return {
        "method": settings.method,
        "objective": settings.objective,
        "focal_objective": settings.focal_objective,
        "gammas": list(settings.gammas),
        "bins": settings.bins,
        "edges": settings.edges,
        "bootstrap": settings.bootstrap,
        "seed": settings.seed,
        "val_split": options.val_split,
        "plot": options.plot,
        "save_calibrator": options.save_calibrator,
    }


def nan_policy_option(func: F) -> F:
    """Add ``--nan-policy error|drop`` (the command receives ``nan_policy``)."""
    decorated: F = click.option(
        "--nan-policy",
        type=click.Choice(("error", "drop")),
        default="error",
        show_default=True,
        help="Rows of logits with a NaN or Inf: stop with an error naming the first, or leave "
        "them out (counted in the report and warned about).",
    )(func)
    return decorated


def dropped_warning(count: int, total: int, source: str) -> str:
    """The warning for rows left out by ``--nan-policy drop``."""
    return f"{source}: left out {count} of {total} rows with a NaN or Inf (--nan-policy drop)"
