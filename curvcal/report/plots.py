"""Figures: reliability diagrams, Hessian spectra, per-layer curvature, study scatter plots.

Needs matplotlib (the ``plot`` extra: ``pip install 'curvcal[plot]'``); it is imported only when
a plot is drawn. Every function takes plain numbers, writes one file whose format follows its
suffix (``.png``, ``.svg`` or ``.pdf``) and returns the :class:`~matplotlib.figure.Figure`.
Colours, fonts, the canvas and the writer are :mod:`curvcal.report.style`'s, the same for every
figure; the same numbers give the same bytes.

Figure sizes (inches; pixels are inches × :data:`DPI`):

* reliability diagram: 3.6 × 4 per panel, side by side or ``columns`` to a row (360·C × 400·R
  px for C columns and R rows at the default :data:`DPI`; ``dpi`` scales the pixels, not the
  layout);
* spectrum: 4 × 3.2, or 8 × 3.2 with a density panel (400 or 800 × 320 px), 0.3 taller with a
  caption;
* per-layer: (2 + 3.5·A + 0.055·max(0, C − 24)) × max(2.5, 1 + 0.25·L) for A = 1 or 2 bar
  charts, L layers and C characters in the longest name (at most :data:`LONGEST_NAME`);
* scatter: 6.4 × 4 (640 × 400 px), the key of the numbered points on the right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError
from curvcal.report.style import (
    BOX,
    DPI,
    ERROR,
    GAP,
    GUIDE,
    MAIN,
    OPTION,
    SECOND,
    SUFFIXES,
    drawing,
    file_format,
    number_labels,
    require_matplotlib,
    save,
    writes_numbers,
)
from curvcal.settings.calibration import PLOT_COLUMNS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "OPTION",
    "SUFFIXES",
    "ReliabilityBin",
    "ReliabilityPanel",
    "SmoothCurve",
    "per_layer_plot",
    "reliability_diagram",
    "require_matplotlib",
    "scatter_plot",
    "spectrum_plot",
]

#: Bins holding fewer samples than this are drawn faded, with a note.
SPARSE_BIN = 10
#: ``counts="auto"`` draws the histogram on a log scale when one bin holds more than this.
CROWDED_BIN = 0.5
#: The density of a spectrum is drawn down to this fraction of its maximum (lower values at
#: it), so that the log axis spans the bulk and the outliers' tails, as PyHessian's figures.
DENSITY_FLOOR = 1e-8
#: The density plot labels this many of the largest eigenvalues with their values.
MARKED = 3
#: The smooth reliability curve is drawn where its kernel density is at least this fraction of
#: its maximum (elsewhere no sample is near and the curve says nothing).
CURVE_SUPPORT = 1e-3


@dataclass(frozen=True)
class ReliabilityBin:
    """One confidence bin: edges, number of samples, and (for a non-empty bin) the mean
    confidence and the accuracy of its samples, all in [0, 1]; ``interval``: a (bootstrap)
    interval of the accuracy, drawn as an error bar."""

    lower: float
    upper: float
    count: int
    confidence: float | None
    accuracy: float | None
    interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class SmoothCurve:
    """A smooth reliability curve: accuracy against confidence on a grid, with the kernel
    density of the confidences (the curve is drawn where the density is not negligible)."""

    confidence: Sequence[float]
    accuracy: Sequence[float]
    density: Sequence[float]


@dataclass(frozen=True)
class ReliabilityPanel:
    """One model's reliability diagram: a title (``uncalibrated``, ``TS (applied)``), an
    optional ``detail`` line (the map's parameters, ``T = 2.31``), its bins and, when known, its
    ECE with its interval (shown in the panel) and a smooth ``curve``; ``xlabel`` names what was
    binned (``p_k`` for a classwise panel)."""

    title: str
    bins: Sequence[ReliabilityBin]
    ece: float | None = None
    xlabel: str = "confidence"
    detail: str | None = None
    ece_interval: tuple[float, float] | None = None
    curve: SmoothCurve | None = None


def reliability_diagram(
    panels: Sequence[ReliabilityPanel],
    path: Path,
    dpi: int = DPI,
    columns: int | None = PLOT_COLUMNS,
    counts: str = "auto",
    caption: str | None = None,
    group: int | None = None,
) -> Figure:
    """Reliability diagrams in a grid of ``columns`` panels to a row (``None``: all in one
    row); with ``group``, each run of ``group`` panels starts a row of its own and wraps at
    ``columns``. Each panel is :data:`PANEL_WIDTH` × :data:`PANEL_HEIGHT` inches.

    Top: accuracy per bin as bars over the bin's width, the gap to the bin's mean confidence
    hatched in red (never blended with the bar), the diagonal (perfect calibration), error
    bars where the bins carry intervals and the smooth curve where the panel has one; bins with
    fewer than :data:`SPARSE_BIN` samples are drawn faded and counted in a note. The ECE box
    sits in the upper-left corner unless a bar reaches it, else in the lower-right.
    Bottom: the fraction of samples per bin with each bin's count, on the same y axis in every
    panel, at most 1: linear (``counts="fraction"``), log (``"log"``), or log when one bin
    holds more than :data:`CROWDED_BIN` of its panel (``"auto"``). Titles carry n; the legend
    (headed by the ``caption``: model and data) sits above the panels. Empty bins are left blank.
    """
    if not panels:
        raise ValueError("reliability_diagram needs at least one panel")
    if counts not in ("auto", "fraction", "log"):
        raise ValueError(f"counts must be auto, fraction or log, got {counts!r}")
    for panel in panels:
        _check_bins(panel)
    _check_dpi(dpi)
    fmt = file_format(path)
    places = grid_places(len(panels), columns, group)
    per_row = max(column for _, column in places) + 1
    rows = max(row for row, _ in places) + 1
    height = PANEL_HEIGHT * rows  # the caption heads the legend: no extra height
    _check_pixels(PANEL_WIDTH * per_row, height, dpi, fmt, len(panels))
    scale = _histogram_scale(panels, counts)
    with drawing(dpi) as new_figure:
        figure = new_figure(PANEL_WIDTH * per_row, height)
        grid = figure.add_gridspec(2 * rows, per_row, height_ratios=(3, 1) * rows)
        for panel, (row, column) in zip(panels, places, strict=True):
            top = figure.add_subplot(grid[2 * row, column])
            bottom = figure.add_subplot(grid[2 * row + 1, column], sharex=top)
            _reliability(top, bottom, panel, scale, first=column == 0)
        handles = _legend_handles(
            intervals=any(_has_intervals(panel) for panel in panels),
            curve=any(panel.curve is not None for panel in panels),
        )
        figure.legend(
            handles=handles,
            loc="outside upper center",
            ncols=min(len(handles), 3),
            title=caption,  # the caption heads the legend: one block above the panels
        )
        save(figure, path, fmt, dpi)
    return figure


#: A reliability panel's size in inches (360 × 400 px at the default :data:`DPI`: readable at
#: 100% zoom).
PANEL_WIDTH = 3.6
PANEL_HEIGHT = 4.0


def grid_places(
    count: int, columns: int | None = None, group: int | None = None
) -> list[tuple[int, int]]:
    """The (row, column) of each of ``count`` panels: ``columns`` to a row (all in one row when
    ``None``); with ``group``, each run of ``group`` panels starts a new row."""
    if count < 1:
        raise ValueError("a grid needs at least one panel")
    if columns is not None and columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    if group is not None and group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    run = count if group is None else group
    per_row = run if columns is None else min(columns, run)
    rows_per_run = math.ceil(run / per_row)
    places = []
    for index in range(count):
        run_index, within = divmod(index, run)
        row, column = divmod(within, per_row)
        places.append((run_index * rows_per_run + row, column))
    return places


@dataclass(frozen=True)
class _Scale:
    """The histogram's y axis, shared by every panel."""

    log: bool
    low: float
    high: float

    def position(self, value: float) -> float:
        """Where ``value`` sits on the axis, 0 (bottom) to 1 (top)."""
        if self.log:
            return (math.log(value) - math.log(self.low)) / (
                math.log(self.high) - math.log(self.low)
            )
        return (value - self.low) / (self.high - self.low)


def _histogram_scale(panels: Sequence[ReliabilityPanel], counts: str) -> _Scale:
    fractions = [
        item.count / total
        for panel in panels
        if (total := sum(item.count for item in panel.bins))
        for item in panel.bins
        if item.count
    ]
    largest = max(fractions, default=1.0)
    log = counts == "log" or (counts == "auto" and largest > CROWDED_BIN)
    if log:
        smallest = min(fractions, default=1.0)
        return _Scale(True, min(smallest, 1.0) / 2.0, 1.0)
    return _Scale(False, 0.0, min(1.0, 1.3 * largest))


def _has_intervals(panel: ReliabilityPanel) -> bool:
    return any(item.interval is not None for item in panel.bins)


def _legend_handles(intervals: bool = False, curve: bool = False) -> list[Any]:
    """Legend entries drawn afresh (a faded first bar must not fade the legend)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [
        Patch(facecolor=MAIN, edgecolor="black", linewidth=0.5, label="accuracy"),
        Patch(facecolor="none", edgecolor=GAP, hatch="////", label="gap to mean confidence"),
        Line2D([0, 1], [0, 0], linestyle="--", color=GUIDE, label="perfect calibration"),
    ]
    if intervals:
        handles.append(
            Line2D([0], [0], color=ERROR, marker="_", markersize=6, label="95% bootstrap interval")
        )
    if curve:
        handles.append(Line2D([0, 1], [0, 0], color=SECOND, linewidth=1.8, label="smooth curve"))
    return handles


def _check_dpi(dpi: int) -> None:
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 10 <= dpi <= 2400:
        raise InputError("--dpi", f"dots per inch must be an integer in 10..2400, got {dpi!r}")


#: The largest raster image drawn: 2**28 pixels (1 GiB as RGBA), at most 2**16 - 1 a side
#: (matplotlib's Agg renderer's own limit).
MAX_PIXELS = 2**28
MAX_SIDE = 2**16 - 1


def _check_pixels(width: float, height: float, dpi: int, fmt: str, panels: int) -> None:
    """Refuse a raster figure too large to allocate, before matplotlib tries (an
    out-of-memory kill otherwise); vector formats have no pixels."""
    if fmt in ("svg", "pdf"):
        return
    columns, lines = round(width * dpi), round(height * dpi)
    if columns * lines > MAX_PIXELS or max(columns, lines) > MAX_SIDE:
        raise InputError(
            "--dpi",
            f"{panels} reliability panels at {dpi} dpi make a {columns:,} x {lines:,}-pixel "
            f"image, more than curvcal draws ({MAX_PIXELS:,} pixels, {MAX_SIDE:,} a side)",
            "lower --dpi or --plot-classes, or write a .svg or .pdf file",
        )


def _check_bins(panel: ReliabilityPanel) -> None:
    if not panel.bins:
        raise ValueError(f"reliability panel {panel.title!r} has no bins")
    for item in panel.bins:
        if not 0.0 <= item.lower < item.upper <= 1.0 or item.count < 0:
            raise ValueError(f"reliability panel {panel.title!r}: bad bin {item}")
        if item.count > 0 and (item.confidence is None or item.accuracy is None):
            raise ValueError(f"reliability panel {panel.title!r}: non-empty bin without values")
        if item.interval is not None and not item.interval[0] <= item.interval[1]:
            raise ValueError(f"reliability panel {panel.title!r}: bad interval in {item}")


def _reliability(
    top: Axes, bottom: Axes, panel: ReliabilityPanel, scale: _Scale, first: bool
) -> None:
    filled = [item for item in panel.bins if item.count > 0]
    total = sum(item.count for item in panel.bins)
    lefts = [item.lower for item in filled]
    widths = [item.upper - item.lower for item in filled]
    accuracy = [float(item.accuracy or 0.0) for item in filled]
    confidence = [float(item.confidence or 0.0) for item in filled]
    sparse = [item.count < SPARSE_BIN for item in filled]
    bars = top.bar(
        lefts, accuracy, widths, align="edge", color=MAIN, edgecolor="black", linewidth=0.5
    )
    # Hatched and unfilled: over a bar (under-confidence) it reads as red on blue, never purple.
    gaps = top.bar(
        lefts,
        [c - a for c, a in zip(confidence, accuracy, strict=True)],
        widths,
        bottom=accuracy,
        align="edge",
        facecolor="none",
        edgecolor=GAP,
        linewidth=0.8,
        hatch="////",
    )
    for bar, gap, faint in zip(bars, gaps, sparse, strict=True):
        if faint:  # a handful of samples: the bar says little
            bar.set_alpha(0.3)
            gap.set_alpha(0.3)
    with_interval = [item for item in filled if item.interval is not None]
    if with_interval:
        centres = [(item.lower + item.upper) / 2 for item in with_interval]
        values = [float(item.accuracy or 0.0) for item in with_interval]
        below = [v - item.interval[0] for v, item in zip(values, with_interval, strict=True)]  # type: ignore[index]
        above = [item.interval[1] - v for v, item in zip(values, with_interval, strict=True)]  # type: ignore[index]
        top.errorbar(
            centres,
            values,
            yerr=[[max(b, 0.0) for b in below], [max(a, 0.0) for a in above]],
            fmt="none",
            ecolor=ERROR,
            elinewidth=0.8,
            capsize=2.0,
        )
    if panel.curve is not None:
        _smooth_curve(top, panel.curve)
    top.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color=GUIDE)
    title = panel.title + "\n" + (f"{panel.detail}, " if panel.detail else "") + f"n = {total:,}"
    top.set(xlim=(0.0, 1.0), ylim=(0.0, 1.0), title=title)
    if panel.ece is not None and math.isfinite(panel.ece):
        _ece_box(top, panel, filled, accuracy, confidence, sparse)
    top.tick_params(labelbottom=False)
    fractions = [item.count / total for item in filled] if total else []
    histogram = bottom.bar(
        lefts, fractions, widths, align="edge", color=GUIDE, edgecolor="black", linewidth=0.5
    )
    if scale.log:
        bottom.set_yscale("log")
    bottom.set(xlim=(0.0, 1.0), ylim=(scale.low, scale.high))
    _count_labels(bottom, histogram, [item.count for item in filled], fractions, scale)
    faded = sum(sparse)
    xlabel = panel.xlabel
    if faded:
        xlabel += f"\n{faded} bin{'s' if faded > 1 else ''} with < {SPARSE_BIN} samples (faded)"
    bottom.set_xlabel(xlabel)
    if first:
        top.set_ylabel("accuracy")
        bottom.set_ylabel("fraction (log)" if scale.log else "fraction")


def _smooth_curve(top: Axes, curve: SmoothCurve) -> None:
    """The curve where the kernel density is not negligible (NaN breaks the line elsewhere)."""
    peak = max((d for d in curve.density if math.isfinite(d)), default=0.0)
    shown = [  # t + r̂(t) may pass 1 near t = 1; accuracy cannot
        min(max(a, 0.0), 1.0) if math.isfinite(d) and d >= CURVE_SUPPORT * peak > 0 else math.nan
        for a, d in zip(curve.accuracy, curve.density, strict=True)
    ]
    top.plot(list(curve.confidence), shown, color=SECOND, linewidth=1.8)


def _ece_box(
    top: Axes,
    panel: ReliabilityPanel,
    filled: Sequence[ReliabilityBin],
    accuracy: Sequence[float],
    confidence: Sequence[float],
    sparse: Sequence[bool],
) -> None:
    # The box is about 0.45 wide and 0.12 (0.2 with an interval) high in axes units.
    reach = 0.85 if panel.ece_interval is None else 0.75
    corner_free = all(  # faded (sparse) bars may sit under the box
        max(a, c) < reach
        for item, a, c, faint in zip(filled, accuracy, confidence, sparse, strict=True)
        if item.lower < 0.5 and not faint
    )
    x, y, ha, va = (0.03, 0.97, "left", "top") if corner_free else (0.97, 0.03, "right", "bottom")
    text = f"ECE = {panel.ece:.4f}"
    if panel.ece_interval is not None:
        low, high = panel.ece_interval
        text += f"\n95% CI [{low:.4f}, {high:.4f}]"
    top.text(x, y, text, transform=top.transAxes, ha=ha, va=va, bbox=BOX)


def _count_labels(
    bottom: Axes, bars: Any, counts: Sequence[int], fractions: Sequence[float], scale: _Scale
) -> None:
    """Each bin's count, vertical in every panel: above its bar, or inside a bar that reaches
    past 60% of the axis (in white), so no label leaves the axes."""
    for bar, count, fraction in zip(bars, counts, fractions, strict=True):
        inside = scale.position(fraction) > 0.6
        bottom.annotate(
            f"{count:,}",
            (bar.get_x() + bar.get_width() / 2, fraction),
            xytext=(0, -2 if inside else 2),
            textcoords="offset points",
            ha="center",
            va="top" if inside else "bottom",
            rotation=90,
            fontsize=6.0,
            color="white" if inside else "black",
        )


def spectrum_plot(
    eigenvalues: Sequence[float],
    path: Path,
    density_grid: Sequence[float] | None = None,
    density: Sequence[float] | None = None,
    trace: tuple[float, float, float] | None = None,
    lambda_min: float | None = None,
    caption: str | None = None,
) -> Figure:
    """The top-k Hessian eigenvalues (stems at k = 1..K, in the order given, each labelled with
    its value) with λmax, λmin and the trace ``(estimate, low, high)`` in a box when given, and,
    with ``density_grid`` and ``density``, the eigenvalue density beside them on a log scale
    over the whole spectrum, the top-k eigenvalues marked (:func:`_density`). One axis, or two
    with a density; ``caption`` above them."""
    if not eigenvalues:
        raise ValueError("spectrum_plot needs at least one eigenvalue")
    if (density_grid is None) != (density is None):
        raise ValueError("density_grid and density go together")
    if density_grid is not None and density is not None and len(density_grid) != len(density):
        raise ValueError("density_grid and density differ in length")
    fmt = file_format(path)
    values = [float(v) for v in eigenvalues]
    with drawing() as new_figure:
        panels = 1 if density is None else 2
        figure = new_figure(4.0 * panels, 3.2 + (0.3 if caption else 0.0))
        axes = figure.subplots(1, panels, squeeze=False)[0]
        if density_grid is not None and density is not None:
            _density(axes[0], [float(t) for t in density_grid], [float(d) for d in density], values)
        top_k = axes[-1]
        index = list(range(1, len(values) + 1))
        top_k.vlines(index, 0.0, values, color=MAIN)
        top_k.plot(index, values, "o", color=MAIN)
        top_k.axhline(0.0, color=GUIDE, linewidth=0.8)
        labelled = index if len(index) <= 12 else [index[0], index[-1]]
        for k in labelled:
            value = values[k - 1]
            top_k.annotate(
                f"{value:.4g}",
                (k, value),
                xytext=(0, 4 if value >= 0 else -4),
                textcoords="offset points",
                ha="center",
                va="bottom" if value >= 0 else "top",
                fontsize=7.0,
            )
        top_k.set_xlim(0.4, len(values) + 0.6)
        top_k.set(xlabel="k", ylabel="eigenvalue", title=f"top {len(values)} eigenvalues")
        top_k.set_xticks(index if len(index) <= 20 else index[:: math.ceil(len(index) / 20)])
        lines = [f"λmax = {max(values):.4g}"]
        if lambda_min is not None:
            lines.append(f"λmin = {lambda_min:.4g}")
        if trace is not None:
            estimate, t_low, t_high = trace
            lines.append(f"tr(H) = {estimate:.4g}\n95% CI [{t_low:.4g}, {t_high:.4g}]")
        box = "\n".join(lines)
        # Head room above the tallest stem for the box (about 0.12 of the span per line), so
        # the box never sits on a stem or its label.
        low, high = min(0.0, *values), max(0.0, *values)
        span = high - low or 1.0
        top_k.set_ylim(
            low - (0.15 * span if low < 0 else 0.0),
            high + span * (0.1 + 0.12 * (box.count("\n") + 1)),
        )
        top_k.text(0.97, 0.97, box, transform=top_k.transAxes, ha="right", va="top", bbox=BOX)
        if caption:
            figure.suptitle(caption)
        save(figure, path, fmt)
    return figure


def _density(ax: Axes, grid: list[float], density: list[float], eigenvalues: list[float]) -> None:
    """The density on a log axis over the whole spectrum, as PyHessian draws it: values under
    :data:`DENSITY_FLOOR` of the peak are drawn at that floor (so that the log axis holds the
    tails), and the x range holds the whole grid and every one of ``eigenvalues`` (the top-k,
    whose weight in the density is too small to show), each marked by a dotted line; the
    :data:`MARKED` largest apart from each other are labelled with their values."""
    peak = max((d for d in density if math.isfinite(d)), default=0.0)
    floor = DENSITY_FLOOR * peak if peak > 0 else DENSITY_FLOOR
    shown = [max(d, floor) if math.isfinite(d) else math.nan for d in density]
    ax.plot(grid, shown, color=MAIN)
    ax.set(yscale="log", xlabel="eigenvalue", ylabel="density (log)", title="eigenvalue density")
    low = min([*grid, *eigenvalues])
    high = max([*grid, *eigenvalues])
    width = (high - low) or 1.0
    ax.set_xlim(low - 0.03 * width, high + 0.03 * width)
    ax.set_ylim(floor / 2.0, 10.0 * max(peak, floor))
    labelled: list[float] = []
    for rank, value in enumerate(sorted(eigenvalues, reverse=True), start=1):
        ax.axvline(value, color=SECOND, linestyle=":", linewidth=1.0)
        apart = all(abs(value - other) > 0.06 * width for other in labelled)
        if len(labelled) < MARKED and apart:
            labelled.append(value)
            ax.annotate(
                f"λ{rank} = {value:.3g}",
                (value, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-2, -3),
                textcoords="offset points",
                ha="right",
                va="top",
                rotation=90,
                fontsize=7.0,
                color=SECOND,
            )


def per_layer_plot(
    names: Sequence[str],
    lambda_max: Sequence[float],
    traces: Sequence[float | None] | None,
    path: Path,
    trace_intervals: Sequence[tuple[float, float] | None] | None = None,
    caption: str | None = None,
) -> Figure:
    """Horizontal bars per parameter group (top to bottom in the order given): λmax and, when
    ``traces`` is given, the trace beside it (a missing trace is left blank) with its interval
    as an error bar when ``trace_intervals`` is given. Each chart is on a log scale when all its
    values are positive, else symmetric-log (linear within the smallest non-zero |value|).
    Names longer than :data:`LONGEST_NAME` are cut in the middle; the figure widens with the
    longest."""
    if not names:
        raise ValueError("per_layer_plot needs at least one layer")
    if len(lambda_max) != len(names) or (traces is not None and len(traces) != len(names)):
        raise ValueError("names, lambda_max and traces differ in length")
    if trace_intervals is not None and (traces is None or len(trace_intervals) != len(names)):
        raise ValueError("trace_intervals needs traces of the same length")
    fmt = file_format(path)
    columns: list[tuple[str, list[float], list[tuple[float, float] | None] | None]] = [
        ("λmax", [float(v) for v in lambda_max], None)
    ]
    if traces is not None:
        columns.append(
            (
                "trace",
                [math.nan if v is None else float(v) for v in traces],
                None if trace_intervals is None else list(trace_intervals),
            )
        )
    with drawing() as new_figure:
        shown = [_shorten(name, LONGEST_NAME) for name in names]
        longest = max(len(name) for name in shown)
        figure = new_figure(  # wider for long names: the bars keep their room
            2.0 + 3.5 * len(columns) + NAME_WIDTH * max(0, longest - 24),
            max(2.5, 1.0 + 0.25 * len(names)) + (0.3 if caption else 0.0),
        )
        axes = figure.subplots(1, len(columns), squeeze=False, sharey=True)[0]
        rows = list(range(len(names)))
        for ax, (title, numbers, intervals) in zip(axes, columns, strict=True):
            xerr = None
            if intervals is not None:
                xerr = [
                    [
                        0.0 if span is None or math.isnan(v) else max(v - span[0], 0.0)
                        for v, span in zip(numbers, intervals, strict=True)
                    ],
                    [
                        0.0 if span is None or math.isnan(v) else max(span[1] - v, 0.0)
                        for v, span in zip(numbers, intervals, strict=True)
                    ],
                ]
            bars = ax.barh(
                rows,
                numbers,
                color=MAIN,
                xerr=xerr,
                error_kw={"ecolor": ERROR, "elinewidth": 0.8, "capsize": 2.0},
            )
            ax.bar_label(bars, [f"{v:.3g}" for v in numbers], padding=3.0, fontsize=7.0)
            _layer_scale(ax, numbers)
            label = title if intervals is None else f"{title} (95% interval)"
            ax.set(title=title, xlabel=label)
        axes[0].set_yticks(rows, shown)
        axes[0].invert_yaxis()
        _finish(figure, caption, path, fmt)
    return figure


#: A per-layer chart's names are cut in the middle to this many characters (both ends tell
#: modules apart); the figure is :data:`NAME_WIDTH` inches wider for each character of the
#: longest past 24, so that a name of 150 characters no longer squeezes the bars to nothing.
LONGEST_NAME = 100
NAME_WIDTH = 0.055


def _layer_scale(ax: Axes, numbers: Sequence[float]) -> None:
    """Log scale from the decade below the smallest value (bars keep their relative length),
    major ticks labelled only; symmetric-log when a value is not positive, with a fifth of the
    axis beyond the longest bar each way for its label."""
    from matplotlib.ticker import NullFormatter, SymmetricalLogLocator

    finite = [v for v in numbers if math.isfinite(v)]
    if finite and all(v > 0 for v in finite):
        ax.set_xscale("log")
        ax.set_xlim(10.0 ** math.floor(math.log10(min(finite))), 4.0 * max(finite))
        ax.xaxis.set_minor_formatter(NullFormatter())
        return
    nonzero = [abs(v) for v in finite if v != 0]
    threshold = min(nonzero) if nonzero else 1.0
    ax.set_xscale("symlog", linthresh=threshold)
    ax.xaxis.set_major_locator(SymmetricalLogLocator(base=10.0, linthresh=threshold, subs=[1.0]))
    low, high = min(finite, default=0.0), max(finite, default=0.0)
    low, high = min(low, -threshold), max(high, threshold)
    # a fifth of the axis beyond the longest bar each way, in the axis's own (symlog) units
    scale = ax.xaxis.get_transform()
    start, end = (float(v) for v in scale.transform([low, high]))
    room = 0.2 * (end - start)
    inverse = scale.inverted()
    ax.set_xlim(
        float(inverse.transform([start - room])[0]), float(inverse.transform([end + room])[0])
    )
    ax.axvline(0.0, color=GUIDE, linewidth=0.8)


def _finish(figure: Figure, caption: str | None, path: Path, fmt: str) -> None:
    """Put ``caption`` above ``figure``, thin its tick labels (:func:`thin_tick_labels`) and
    write it: the end of a plot whose axes may hold more labels than fit."""
    if caption:
        figure.suptitle(caption)
    thin_tick_labels(figure)
    save(figure, path, fmt)


def thin_tick_labels(figure: Figure, gap: float = 4.0) -> None:
    """Lay ``figure`` out and keep, on each axis, only major tick labels at least ``gap``
    points clear of the last one kept (the others' ticks stay, unlabelled): labels never
    collide, whatever the scale (a symmetric-log axis over many decades has a label per
    decade)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import FixedFormatter, FixedLocator

    canvas = FigureCanvasAgg(figure)
    renderer = canvas.get_renderer()
    figure.draw(renderer)  # the constrained layout settles the axes' sizes
    pixels = gap * figure.dpi / 72.0
    for ax in figure.axes:
        for axis, along in ((ax.xaxis, 0), (ax.yaxis, 1)):
            ticks = [t for t in axis.get_major_ticks() if t.label1.get_visible()]
            placed = []
            for tick in ticks:
                text = tick.label1.get_text()
                lo, hi = ax.get_xlim() if along == 0 else ax.get_ylim()
                if not text or not min(lo, hi) <= tick.get_loc() <= max(lo, hi):
                    continue
                box = tick.label1.get_window_extent(renderer)
                placed.append((tick.get_loc(), text, box))
            placed.sort(key=lambda item: item[2].x0 if along == 0 else item[2].y0)
            kept: list[tuple[float, str]] = []
            last = None
            for loc, text, box in placed:
                start, end = (box.x0, box.x1) if along == 0 else (box.y0, box.y1)
                if last is not None and start < last + pixels:
                    continue
                kept.append((loc, text))
                last = end
            if len(kept) < len(placed):
                texts = [text for _, text in kept]
                numbers = writes_numbers(axis.get_major_formatter())
                axis.set_major_locator(FixedLocator([loc for loc, _ in kept]))
                # names stay names (drawn as written), numbers stay numbers (mathtext)
                axis.set_major_formatter(number_labels(texts) if numbers else FixedFormatter(texts))


def scatter_plot(
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str] | None,
    xlabel: str,
    ylabel: str,
    path: Path,
    title: str | None = None,
    xerr: Sequence[float] | None = None,
    yerr: Sequence[float] | None = None,
    note: str | None = None,
    caption: str | None = None,
) -> Figure:
    """One point per (x, y) with symmetric error bars ``xerr``/``yerr`` when given; with
    ``labels`` each point is numbered and the numbers are keyed to the labels on the right
    (long names never overlap or leave the figure: the figure grows with the key, a second
    column from :data:`KEY_ROWS` labels; a prefix they share heads the key); ``note`` (ρ)
    under the title, ``caption`` (checkpoints and data) above the figure. Each axis is
    logarithmic when its values span more than :data:`LOG_SPAN` (symmetric-log when one is not
    positive, :func:`_span_scale`). One axis."""
    if len(x) != len(y) or (labels is not None and len(labels) != len(x)):
        raise ValueError("x, y and labels differ in length")
    for name, err in (("xerr", xerr), ("yerr", yerr)):
        if err is not None and len(err) != len(x):
            raise ValueError(f"{name} and x differ in length")
    fmt = file_format(path)
    count = len(labels) if labels else 0
    key_columns = 1 if count <= KEY_ROWS else 2
    key_rows = math.ceil(count / key_columns)
    with drawing() as new_figure:
        from matplotlib.lines import Line2D

        figure = new_figure(
            6.4 + 2.2 * (key_columns - 1),
            max(4.0, 1.2 + KEY_ROW_HEIGHT * key_rows) + (0.3 if caption else 0.0),
        )
        ax = figure.add_subplot()
        ax.errorbar(
            list(x),
            list(y),
            xerr=None if xerr is None else list(xerr),
            yerr=None if yerr is None else list(yerr),
            fmt="o",
            color=MAIN,
            ecolor=ERROR,
            elinewidth=0.8,
            capsize=2.0,
        )
        if labels:
            for i in range(len(labels)):
                ax.annotate(str(i + 1), (x[i], y[i]), xytext=(4, 4), textcoords="offset points")
            shared, rests = _common_prefix(labels)
            key = [
                Line2D([], [], linestyle="none", label=f"{i + 1}  {_shorten(rest)}")
                for i, rest in enumerate(rests)
            ]
            figure.legend(
                handles=key,
                loc="outside right upper",
                handlelength=0,
                handletextpad=0,
                ncols=key_columns,
                title=f"{_shorten(shared)}…" if shared else None,
            )
        xscale = _span_scale(ax, "x", x)
        yscale = _span_scale(ax, "y", y)
        ax.set(xlabel=xlabel + xscale, ylabel=ylabel + yscale)
        ax.margins(0.12)
        heading = "\n".join(part for part in (title, note) if part)
        if heading:  # above the axes: a box inside would hide points
            ax.set_title(heading)
        _finish(figure, caption, path, fmt)
    return figure


#: A scatter plot's axis is logarithmic when its largest |value| is more than this many times
#: its smallest non-zero one.
LOG_SPAN = 100.0
#: The key of a scatter plot keeps one column up to this many labels, then takes two.
KEY_ROWS = 24
#: Inches a row of the key takes (8-point text with matplotlib's spacing, and some room).
KEY_ROW_HEIGHT = 0.19


def _span_scale(ax: Axes, which: str, values: Sequence[float]) -> str:
    """Set ``ax``'s ``which`` axis logarithmic when ``values`` span more than
    :data:`LOG_SPAN` (all positive), symmetric-log (linear within the smallest non-zero
    |value|) when they span that much but one is not positive; linear otherwise. Returns the
    words the axis label gains (``" (log)"``, ``" (symlog)"`` or nothing)."""
    finite = [float(v) for v in values if math.isfinite(v)]
    magnitudes = [abs(v) for v in finite if v != 0]
    if not magnitudes or max(magnitudes) <= LOG_SPAN * min(magnitudes):
        return ""
    setter = ax.set_xscale if which == "x" else ax.set_yscale
    if all(v > 0 for v in finite):
        setter("log")
        return " (log)"
    setter("symlog", linthresh=min(magnitudes))
    return " (symlog)"


def _common_prefix(labels: Sequence[str]) -> tuple[str, list[str]]:
    """The prefix all of several labels share (cut back to a ``_``, ``-`` or ``.`` boundary,
    and kept only when 4 characters or longer) and what is left of each label."""
    if len(labels) < 2:
        return "", list(labels)
    prefix = labels[0]
    for label in labels[1:]:
        while not label.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind(mark) for mark in "_-.") + 1
    prefix = prefix[:cut]
    if len(prefix) < 4 or any(len(label) == len(prefix) for label in labels):
        return "", list(labels)
    return prefix, [label[len(prefix) :] for label in labels]


def _shorten(label: str, limit: int = 28) -> str:
    """A label cut in the middle to ``limit`` characters (both ends tell checkpoints apart)."""
    if len(label) <= limit:
        return label
    half = (limit - 1) // 2
    return f"{label[:half]}…{label[-(limit - 1 - half) :]}"
