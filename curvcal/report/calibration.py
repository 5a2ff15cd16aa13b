"""The tables and the reliability plot of a calibration analysis (``curvcal calibrate``,
``curvcal metrics`` and ``curvcal demo``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.report.tables import Table, fmt_float

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.calibration.ensemble import EnsembleFit
    from curvcal.calibration.linear import LinearFit
    from curvcal.calibration.ranking import Difference, Ranking
    from curvcal.calibration.results import CalibrationMetrics, FocalTemperatureFit

#: Stages of the maps the "binning, isotonic and binary maps" table describes.
ONE_DIMENSIONAL_STAGES = (
    *("histogram", "histogram_ovr", "isotonic", "isotonic_ovr", "platt", "beta"),
    *("bbq", "venn_abers"),
)
CHART_WIDTH = 20


# ---------------------------------------------------------------------------------------------
# plots


def write_reliability_plot(
    analysis: CalibrationAnalysis,
    path: Path,
    dpi: int = 100,
    plot_classes: int = 0,
    class_names: Sequence[str] | None = None,
    caption: str | None = None,
) -> None:
    """Reliability diagrams of every evaluated stage to ``path`` (the format from its suffix) at
    ``dpi``, in a grid of at most the settings' ``plot_columns`` panels to a row; with
    ``plot_classes`` > 0 each stage starts a row: its top-label panel, then one panel per class
    of the classwise tables (named by ``class_names`` when given). ``caption`` (model and data)
    goes above the panels; the histogram scale is the settings' ``plot_counts``."""
    from curvcal.report.plots import reliability_diagram

    panels = reliability_panels(analysis, class_names)
    stages = len(analysis.evaluation.present())
    reliability_diagram(
        panels,
        path,
        dpi=dpi,
        columns=analysis.settings.plot_columns,
        counts=analysis.settings.plot_counts,
        caption=caption,
        group=None if plot_classes == 0 else len(panels) // stages,
    )


def stage_detail(calibrator: Any) -> str | None:
    """The scalar parameters a map was fitted to, as a title line (``γ = 1.5, T = 2.31``):
    any map whose saved form names a ``gamma`` or a ``temperature``; ``None`` for others."""
    if calibrator is None:
        return None
    try:
        saved = calibrator.to_dict()
    except (AttributeError, TypeError, ValueError):
        return None
    parts = []
    for key, symbol in (("gamma", "γ"), ("temperature", "T")):
        value = saved.get(key) if isinstance(saved, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key == "gamma" and value == 0 and "focal" not in str(saved.get("method")):
                continue  # plain temperature scaling records γ = 0
            parts.append(f"{symbol} = {value:.3g}")
    return ", ".join(parts) or None


def reliability_panels(
    analysis: CalibrationAnalysis, class_names: Sequence[str] | None = None
) -> list[Any]:
    """One reliability panel per evaluated stage, from the equal-width bins of the metrics,
    whatever maps were run: titled by stage (``(applied)`` for a map read with ``--apply``), the
    map's T and γ when it has them, the bootstrap intervals of the bins and of the ECE when
    measured and the smooth curve when measured; with classwise tables, each stage's panel is
    followed by one panel per class, named by ``class_names`` when given."""
    from curvcal.report.plots import ReliabilityBin, ReliabilityPanel, SmoothCurve

    def plot_bins(table: Any, intervals: Sequence[Any] = ()) -> list[Any]:
        spans = list(intervals) if len(intervals) == len(table) else [None] * len(table)
        return [
            ReliabilityBin(
                item.lower,
                item.upper,
                item.count,
                item.confidence if item.count else None,
                item.accuracy if item.count else None,
                None if span is None or not item.count else (float(span[0]), float(span[1])),
            )
            for item, span in zip(table, spans, strict=True)
        ]

    calibrators = analysis.calibrators()
    panels = []
    for stage, metrics in analysis.evaluation.present():
        title = stage_title(stage)
        if stage in analysis.applied:
            title += " (applied)"
        curve = metrics.smooth_curve
        panels.append(
            ReliabilityPanel(
                title,
                plot_bins(metrics.ece_bins, metrics.bin_intervals),
                metrics.ece,
                detail=stage_detail(calibrators.get(stage)),
                ece_interval=metrics.intervals.get("ece"),
                curve=None
                if curve is None
                else SmoothCurve(curve.confidence, curve.accuracy, curve.density),
            )
        )
        for table in metrics.class_bins:
            index = table.class_index
            name = (
                class_names[index]
                if class_names is not None and index < len(class_names)
                else f"class {index}"
            )
            n = sum(item.count for item in table.bins)
            gap = sum(item.count * abs(item.gap) for item in table.bins if item.count) / n
            panels.append(
                ReliabilityPanel(
                    f"{title}: {name}",
                    plot_bins(table.bins),
                    gap,
                    f"p({name})\nvs. frequency of y = {name}",
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
    ("classwise ECE", "classwise_ece", "classwise_ece"),
    ("smooth ECE", "smooth_ece", "smooth_ece"),
    ("KS calibration error", "ks_ce", None),
    ("Kuiper", "kuiper", None),
    ("MMCE", "mmce", None),
    ("NLL", "nll", "nll"),
    ("Brier", "brier", None),
    ("AURC", "aurc", None),
    ("E-AURC", "e_aurc", None),
)


def calibration_tables(analysis: CalibrationAnalysis, chart: bool = True) -> list[Table]:
    """The metrics table, the reliability chart (when ``chart``), the fits, the γ profile and
    the split, in that order (tables of stages not run are left out). With ``--method all``,
    the summary (:func:`summary_tables`: one ranked table and the maps
    skipped) comes first and every other table is a ``detail`` table (shown with
    ``--verbose``)."""
    if analysis.ranking is not None and analysis.settings.method == "all":
        details = [metrics_table(analysis), *_detail_tables(analysis, chart)]
        return [
            *summary_tables(analysis, analysis.ranking),
            *(replace(table, detail=True) for table in details),
        ]
    return [metrics_table(analysis), *_detail_tables(analysis, chart)]


def _detail_tables(analysis: CalibrationAnalysis, chart: bool) -> list[Table]:
    tables: list[Table] = []
    if chart:
        tables.append(reliability_table(analysis))
    if analysis.fits.ts is not None or analysis.fits.focal_ts is not None:
        tables.append(fits_table(analysis))
    if analysis.fits.focal_ts is not None:
        tables.append(profile_table(analysis.fits.focal_ts))
    linear = [
        (stage, fit)
        for stage, fit in analysis.fits.present()
        if stage in ("vector", "matrix", "dirichlet", "dirichlet_l2")
    ]
    if linear:
        tables.append(
            linear_fits_table(
                [fit for _, fit in linear],
                analysis.split.n_fit,
                [stage_title(stage) for stage, _ in linear],
            )
        )
    if analysis.fits.laplace is not None:
        tables.append(laplace_fit_table(analysis.fits.laplace))
    one_dimensional = [
        (stage, fit) for stage, fit in analysis.fits.present() if stage in ONE_DIMENSIONAL_STAGES
    ]
    if one_dimensional:
        tables.append(one_dimensional_fits_table(one_dimensional, analysis.split.n_fit))
    if analysis.fits.ets is not None:
        tables.append(ensemble_fit_table(analysis.fits.ets, analysis.split.n_fit))
    if analysis.ranking is not None:
        tables.extend(ranking_tables(analysis.ranking))
    tables.append(split_table(analysis))
    return tables


#: Each row of :data:`_METRIC_ROWS` by the attribute it shows.
_METRIC_ROW = {row[1]: row for row in _METRIC_ROWS}
#: The columns of the ``--method all`` summary: the rows of these metrics, in this order.
SUMMARY_COLUMNS = tuple(_METRIC_ROW[name] for name in ("nll", "ece", "adaece", "brier", "accuracy"))


def summary_tables(analysis: CalibrationAnalysis, ranking: Ranking) -> list[Table]:
    """The summary of many maps (``--method all``): one table, a row per evaluated stage
    (uncalibrated first, then the maps in rank order of the settings' ``rank_by`` score) with
    its rank (marked ``≈`` when the paired interval of its difference from the best contains 0)
    and its NLL, ECE, AdaECE, Brier score and accuracy on the evaluation split, each with its 95%
    interval on a second line where intervals were measured; then the maps that did not
    apply, with the reason (a table of their own: never cut from a caption)."""
    score = analysis.settings.rank_by
    name = _METRIC_ROW[score][0]
    metrics = dict(analysis.evaluation.present())
    ordered = sorted(
        ranking.stages, key=lambda item: (item.stage != "uncalibrated", item.rank[score])
    )
    rows = []
    for item in ordered:
        stage_metrics = metrics[item.stage]
        rows.append(
            (
                _rank_cell(
                    item.rank[score], item.vs_best[score], item.stage == ranking.best[score]
                ),
                _stage_title(analysis, item.stage),
                *(_summary_cell(stage_metrics, a, key) for _, a, key in SUMMARY_COLUMNS),
            )
        )
    n_eval = analysis.evaluation.uncalibrated.n_samples
    settings = analysis.settings
    side = "(a,b]" if settings.edges == "left" else "[a,b)"
    more = "more tables: --verbose"
    if ranking.n_bootstrap:
        how = (
            f"≈: not told apart from rank 1 (the paired {ranking.interval_level:.0%} interval of "
            f"Δ{name} to it holds 0); {more}; [95% interval, {settings.bootstrap} bootstrap "
            f"resamples, seed {settings.seed}]"
        )
    else:
        how = f"no intervals: pass --bootstrap N to see which differences are real; {more}"
    caption = (
        f"{how}; NLL in nats; ECE top-label, {settings.bins} equal-width bins {side}; AdaECE "
        f"{settings.bins} equal-mass bins; Brier summed over classes"
    )
    tables = [
        Table(
            title=(
                f"{len(rows) - 1} maps ranked by {name} on the evaluation split, uncalibrated "
                f"first (N = {n_eval}; fitted on {analysis.split.n_fit})"
            ),
            columns=(
                "rank",
                "map",
                *(title for title, _, _ in SUMMARY_COLUMNS),
            ),
            rows=tuple(rows),
            caption=caption,
        )
    ]
    if ranking.skipped:
        tables.append(
            Table(
                title="maps not fitted",
                columns=("map", "why"),
                rows=tuple((stage_title(skip.stage), skip.reason) for skip in ranking.skipped),
            )
        )
    return tables


def _rank_cell(rank: int, difference: Difference, best: bool) -> str:
    """A rank, marked ``≈`` when the paired interval of the difference from the best holds 0."""
    return f"{rank} ≈" if not best and difference.distinguishable is False else str(rank)


def _summary_cell(metrics: CalibrationMetrics, attribute: str, interval: str | None) -> str:
    """A value (4 significant digits) and, on a second line, its interval
    (:func:`interval_text`)."""
    text = fmt_float(getattr(metrics, attribute))
    if interval is not None and interval in metrics.intervals:
        text += "\n" + interval_text(*metrics.intervals[interval])
    return text


def interval_text(low: float, high: float) -> str:
    """``[low, high]`` with both ends to the decimal places that give the interval's width two
    significant digits (``[0.82, 0.95]``; at most 6 places): the ends are estimates, and more
    digits than their spread would be noise. Non-finite or zero-width: 3 significant digits."""
    width = high - low
    if not (math.isfinite(low) and math.isfinite(high)) or width <= 0:
        return f"[{fmt_float(low, 3)}, {fmt_float(high, 3)}]"
    places = min(6, max(0, 1 - math.floor(math.log10(width))))
    return f"[{low:.{places}f}, {high:.{places}f}]"


def stage_title(stage: str) -> str:
    """A stage's column title: the registry entry's title (``TS``, ``Platt``, ``histogram
    OvR``), else its key with spaces for underscores (``uncalibrated``)."""
    from curvcal.calibration.registry import MAPS

    return MAPS[stage].title if stage in MAPS else stage.replace("_", " ")


def _difference(difference: Difference) -> str:
    text = fmt_float(difference.value, 3)
    if difference.interval is not None:
        low, high = difference.interval
        text += f" [{fmt_float(low, 3)}, {fmt_float(high, 3)}]"
    return text


def _mark(stage: str, best: str, difference: Difference) -> str:
    if stage == best:
        return "best"
    if difference.distinguishable is None:
        return "-"
    return "worse" if difference.distinguishable else "≈ best"


def ranking_tables(ranking: Ranking) -> list[Table]:
    """Every stage ranked on the evaluation split, once by NLL (the proper score, with the
    Brier score beside it) and once by ECE: its score, its difference from the best with its
    interval (:mod:`curvcal.calibration.ranking`), whether that interval contains 0 (``≈ best``: not
    distinguishable from the best) and its difference from uncalibrated; a map that does not
    apply is a row of its own, last, with the reason it was skipped."""
    if ranking.n_bootstrap:
        how = (
            f"Δ = map − best (or − uncalibrated) [{ranking.interval_level:.0%} paired interval, "
            f"{ranking.n_bootstrap} resamples of the evaluation rows, seed {ranking.seed}: NLL Δ "
            "by Student's t over the rows, ECE Δ ± the bound of both plug-ins' errors]; ≈ best: "
            "the interval contains 0"
        )
    else:
        how = "Δ = map − best; no intervals: pass --bootstrap N to see which differences are real"
    side = "(a,b]" if ranking.edges == "left" else "[a,b)"
    units = {
        "nll": "NLL in nats; Brier summed over classes",
        "ece": f"ECE top-label, {ranking.n_bins} equal-width bins {side}",
    }
    tables = []
    for score, name in (("nll", "NLL"), ("ece", "ECE")):
        rows = []
        for item in sorted(ranking.stages, key=lambda r: r.rank[score]):
            best = item.stage == ranking.best[score]
            to_uncalibrated = item.vs_uncalibrated
            rows.append(
                (
                    str(item.rank[score]),
                    stage_title(item.stage),
                    fmt_float(getattr(item, score)),
                    "-" if best else _difference(item.vs_best[score]),
                    _mark(item.stage, ranking.best[score], item.vs_best[score]),
                    "-" if to_uncalibrated is None else _difference(to_uncalibrated[score]),
                    *((fmt_float(item.brier),) if score == "nll" else ()),
                )
            )
        for skip in ranking.skipped:  # said where the ranking is read, never cut from a caption
            rows.append(
                (
                    "-",
                    stage_title(skip.stage),
                    "-",
                    "-",
                    f"skipped: {skip.reason}",
                    "-",
                    *(("-",) if score == "nll" else ()),
                )
            )
        tables.append(
            Table(
                title=f"which map to trust: ranked by {name} on the evaluation split",
                columns=(
                    "rank",
                    "map",
                    name,
                    f"Δ{name} to best",
                    "vs best",
                    f"Δ{name} to uncalibrated",
                    *(("Brier",) if score == "nll" else ()),
                ),
                rows=tuple(rows),
                caption=f"{how}; {units[score]}",
            )
        )
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
        f"{analysis.n_classes} classes; NLL in nats; Brier summed over classes; KS, Kuiper, "
        "MMCE (Laplacian kernel, width 0.4, root form) binning-free; AURC: mean selective risk "
        "over coverages k/N, ties spread evenly"
    )
    if settings.bootstrap:
        text += (
            f"; [95% interval of the population value: estimate ± the 95% quantile of its "
            f"error over {settings.bootstrap} bootstrap resamples (seed {settings.seed}); "
            "MCE by Hoeffding per bin; NLL percentile]"
        )
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
    title = stage_title(stage)
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


def _fit_split_table(
    what: str,
    n_fit: int,
    columns: tuple[str, ...],
    rows: tuple[tuple[str, ...], ...],
    caption: str,
    scope: str = "",
) -> Table:
    """A table of maps fitted on the fit split: the title says so and how many samples it
    holds (after ``scope``, what part of the model was fitted), the caption ends by saying
    that the NLL before/after are in-sample."""
    return Table(
        title=f"{what} ({scope}on the fit split, {n_fit} samples)",
        columns=columns,
        rows=rows,
        caption=f"{caption}; before/after: in-sample",
    )


def linear_fits_table(fits: list[LinearFit], n_fit: int, titles: list[str] | None = None) -> Table:
    """Vector, matrix and Dirichlet scaling fits (columns ``titles``, default the method's
    stage title): what was fitted, the regulariser, NLL before/after on the fit split and
    whether the fit converged."""
    rows = (
        ("scores scaled", *(fit.input for fit in fits)),
        ("parameters", *(str(fit.n_parameters) for fit in fits)),
        ("regulariser", *(fit.regulariser for fit in fits)),
        ("λ chosen by", *(_strength_source(fit) for fit in fits)),
        ("L2 off-diagonal", *(fmt_float(fit.l2_off_diagonal) for fit in fits)),
        ("L2 intercept", *(fmt_float(fit.l2_bias) for fit in fits)),
        ("NLL before", *(fmt_float(fit.nll_before) for fit in fits)),
        ("NLL after", *(fmt_float(fit.nll_after) for fit in fits)),
        ("iterations", *(str(fit.iterations) for fit in fits)),
        ("max |gradient|", *(fmt_float(fit.gradient_max, 2) for fit in fits)),
        ("converged", *(_yes(fit.converged) for fit in fits)),
    )
    return _fit_split_table(
        "linear maps",
        n_fit,
        ("quantity", *(titles or [stage_title(fit.method) for fit in fits])),
        rows,
        f"L-BFGS in float64 from the identity map; converged: max |gradient| < "
        f"{fmt_float(fits[0].gradient_tol, 2)}",
    )


def laplace_fit_table(fit: Any) -> Table:
    """The last-layer Laplace fit: the layer, the GGN structure, the prior precision chosen by
    the marginal likelihood or the held-out NLL, and the predictive."""
    predictive = fit.predictive + (f" ({fit.samples} draws)" if fit.predictive == "mc" else "")
    bracket = f"[{fmt_float(fit.prior_bracket[0], 2)}, {fmt_float(fit.prior_bracket[1], 2)}]"
    by_nll = fit.prior_rule == "nll"
    rule = f"held-out NLL ({fit.prior_folds} folds)" if by_nll else "marginal likelihood"
    rows = (
        ("last layer", f"{fit.layer} ({fit.n_features} features, bias: {_yes(fit.has_bias)})"),
        ("parameters", str(fit.n_parameters)),
        ("GGN", "full" if fit.structure == "full" else "Kronecker-factored (KFAC)"),
        ("prior precision δ", f"{fmt_float(fit.prior_precision)} (by {rule})"),
        ("δ at a bracket end", f"{_yes(fit.at_bracket_end)} {bracket}"),
        *((("held-out NLL at δ", fmt_float(fit.heldout_nll)),) if by_nll else ()),
        ("log marginal likelihood", fmt_float(fit.log_marginal_likelihood)),
        ("log likelihood at the MAP", fmt_float(fit.log_likelihood)),
        ("predictive", predictive),
        ("NLL before", fmt_float(fit.nll_before)),
        ("NLL after", fmt_float(fit.nll_after)),
    )
    return _fit_split_table(
        "Laplace",
        fit.n_samples,
        ("quantity", "value"),
        rows,
        (
            "δ minimises the predictive's NLL on held-out folds of the fit split (grid, then "
            "Brent in log δ; posterior from the whole fit split)"
            if by_nll
            else "δ maximises the Laplace log marginal likelihood"
        )
        + " (scalar prior, GGN of the summed cross-entropy)",
        scope="last layer, ",
    )


def one_dimensional_fits_table(fits: list[tuple[str, Any]], n_fit: int) -> Table:
    """Histogram binning, isotonic regression, Platt scaling and beta calibration fits: what
    each was fitted on, its shape, NLL before/after on the fit split."""
    rows = (
        ("fitted on", *(_fitted_on(fit) for _, fit in fits)),
        ("shape", *(_shape(fit) for _, fit in fits)),
        ("parameters", *(str(_parameters(fit)) for _, fit in fits)),
        ("NLL before", *(fmt_float(fit.nll_before) for _, fit in fits)),
        ("NLL after", *(fmt_float(fit.nll_after) for _, fit in fits)),
        (
            "converged",
            *(_yes(fit.converged) if hasattr(fit, "converged") else "-" for _, fit in fits),
        ),
    )
    return _fit_split_table(
        "binning, isotonic and binary maps",
        n_fit,
        ("quantity", *(stage_title(stage) for stage, _ in fits)),
        rows,
        "top-label: the top class gets f(confidence), the others share the rest in "
        "proportion; OvR: f_k(p_k) renormalised",
    )


def _fitted_on(fit: Any) -> str:
    if fit.method in ("platt", "beta", "venn-abers"):
        return str(fit.input)
    return "each p_k vs rest" if fit.method.endswith("-ovr") else "top-label confidence"


def _shape(fit: Any) -> str:
    if fit.method.startswith("histogram"):
        used = sum(fit.bins_used)
        per = " per class" if fit.method.endswith("-ovr") else ""
        return f"{fit.n_bins} {fit.scheme} bins{per} ({used} used, {fit.empty_bins} empty)"
    if fit.method.startswith("isotonic"):
        return f"{sum(fit.points)} points"
    if fit.method == "bbq":
        return (
            f"{fit.n_models} equal-mass binnings of {fit.min_bins}-{fit.max_bins} bins "
            f"({fit.models_kept} kept, largest weight {fit.largest_weight:.3g})"
        )
    if fit.method == "venn-abers":
        return f"{sum(fit.knots)} steps, p1 − p0 mean {fit.width_mean:.3g}"
    text = ", ".join(f"{name} = {value:.4g}" for name, value in fit.coefficients.items())
    return text + (f" ({fit.fixed} fixed at 0: a, b >= 0)" if fit.fixed else "")


def _parameters(fit: Any) -> int:
    if fit.method == "platt":
        return 2
    if fit.method == "beta":
        return 2 if fit.fixed else 3
    return int(fit.n_parameters)


def ensemble_fit_table(fit: EnsembleFit, n_fit: int) -> Table:
    """Ensemble temperature scaling: T, the three weights, NLL before, after TS alone and
    after the ensemble, on the fit split."""
    rows = (
        ("T (TS on NLL)", fmt_float(fit.temperature)),
        ("weight of TS", fmt_float(fit.weights[0])),
        ("weight of uncalibrated", fmt_float(fit.weights[1])),
        ("weight of uniform", fmt_float(fit.weights[2])),
        ("NLL before", fmt_float(fit.nll_before)),
        ("NLL after TS", fmt_float(fit.nll_ts)),
        ("NLL after", fmt_float(fit.nll_after)),
    )
    return _fit_split_table(
        "ensemble temperature scaling",
        n_fit,
        ("quantity", "ETS"),
        rows,
        "T fitted first, then the weights (≥ 0, sum 1) by NLL with T fixed",
    )


def _strength_source(fit: LinearFit) -> str:
    if fit.method == "vector":
        return "-"
    if not fit.cv_folds:
        return "fixed (too few samples for CV)"
    return f"{fit.cv_folds}-fold CV over {len(fit.cv_strengths)} values"


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
        stages = ", ".join(stage_title(s) for s in analysis.applied)
        caption = f"saved calibrators applied ({stages}); nothing fitted: every sample evaluated"
    return Table(title="split", columns=("quantity", "value"), rows=tuple(rows), caption=caption)
