"""Figures: reliability diagrams, Hessian spectra, per-layer curvature, study scatter plots.

Needs matplotlib (the ``plot`` extra: ``pip install 'curvcal[plot]'``); it is imported only when
a plot is drawn. Every function takes plain numbers, writes one file whose format follows its
suffix (``.png``, ``.svg`` or ``.pdf``) and returns the :class:`~matplotlib.figure.Figure`.

Output is deterministic: figures are drawn on matplotlib's own Figure/Agg canvas (pyplot and the
global backend are never touched), under matplotlib's default style plus fixed fonts and sizes
(a user's ``matplotlibrc`` does not leak in, and our settings do not leak out), at
:data:`DPI` dots per inch, with fixed SVG hash salt and no dates in SVG/PDF metadata, so the same
numbers give the same bytes. Files are written atomically (a temporary file in the same
directory, then a rename).

Figure sizes (inches; pixels are inches × :data:`DPI`):

* reliability diagram: 3 × 4 per panel, side by side or ``columns`` to a row (300·P × 400
  px at the default :data:`DPI`; ``dpi`` scales the pixels, not the layout);
* spectrum: 4 × 3.2, or 8 × 3.2 with a density panel (400 or 800 × 320 px);
* per-layer: (2 + 3.5·A) × max(2.5, 1 + 0.25·L) for A = 1 or 2 bar charts and L layers;
* scatter: 4.8 × 4 (480 × 400 px).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.atomic import atomic_output
from curvcal.errors import InputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

DPI = 100
#: Bins holding fewer samples than this are drawn faded, with a note.
SPARSE_BIN = 10
SUFFIXES = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
OPTION = "--plot"

_STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs everywhere
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 8.0,
    "lines.linewidth": 1.2,
    "svg.hashsalt": "curvcal",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
    "path.simplify": False,
}
_METADATA: dict[str, dict[str, str | None]] = {
    "png": {"Software": "curvcal"},
    "svg": {"Creator": "curvcal", "Date": None},
    "pdf": {"Creator": "curvcal", "Producer": "curvcal", "CreationDate": None},
}
_BAR = "#4C72B0"
_GAP = "#DD4444"
_GUIDE = "#888888"


@dataclass(frozen=True)
class ReliabilityBin:
    """One confidence bin: edges, number of samples, and (for a non-empty bin) the mean
    confidence and the accuracy of its samples, all in [0, 1]."""

    lower: float
    upper: float
    count: int
    confidence: float | None
    accuracy: float | None


@dataclass(frozen=True)
class ReliabilityPanel:
    """One model's reliability diagram: a title (``uncalibrated``, ``TS``, ``focal TS``), its
    bins and, when known, its ECE (shown in the panel); ``xlabel`` names what was binned
    (``p_k`` for a classwise panel)."""

    title: str
    bins: Sequence[ReliabilityBin]
    ece: float | None = None
    xlabel: str = "confidence"


def reliability_diagram(
    panels: Sequence[ReliabilityPanel], path: Path, dpi: int = DPI, columns: int | None = None
) -> Figure:
    """Reliability diagrams, one column per panel (``columns`` per row when given: a grid).

    Top: accuracy per bin as bars over the bin's width, the gap to the bin's mean confidence
    shaded (red), and the diagonal (perfect calibration); bins with fewer than
    :data:`SPARSE_BIN` samples are drawn faded and counted in a note under the histogram. The
    ECE box sits in the upper-left corner unless a bar reaches it, else in the lower-right.
    Bottom: the fraction of samples per bin (the confidence histogram) with each bin's count
    above its bar. The title carries n; the legend sits above the panels, outside the data.
    Empty bins are left blank. Two axes per panel; ``dpi`` sets the pixels per inch.
    """
    if not panels:
        raise ValueError("reliability_diagram needs at least one panel")
    for panel in panels:
        _check_bins(panel)
    _check_dpi(dpi)
    fmt = _format(path)
    per_row = len(panels) if columns is None else max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / per_row)
    _check_pixels(3.0 * per_row, 4.0 * rows, dpi, fmt, len(panels))
    with _drawing(dpi) as new_figure:
        figure = new_figure(3.0 * per_row, 4.0 * rows)
        grid = figure.add_gridspec(2 * rows, per_row, height_ratios=(3, 1) * rows)
        for index, panel in enumerate(panels):
            row, column = divmod(index, per_row)
            top = figure.add_subplot(grid[2 * row, column])
            bottom = figure.add_subplot(grid[2 * row + 1, column], sharex=top)
            _reliability(top, bottom, panel, first=column == 0)
        figure.legend(handles=_legend_handles(), loc="outside upper center", ncols=3)
        _save(figure, path, fmt, dpi)
    return figure


def _legend_handles() -> list[Any]:
    """Legend entries drawn afresh (a faded first bar must not fade the legend)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Patch(facecolor=_BAR, edgecolor="black", linewidth=0.5, label="accuracy"),
        Patch(facecolor=_GAP, alpha=0.35, edgecolor=_GAP, hatch="//", label="gap"),
        Line2D([0, 1], [0, 0], linestyle="--", color=_GUIDE, label="perfect"),
    ]


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


def _reliability(top: Axes, bottom: Axes, panel: ReliabilityPanel, first: bool) -> None:
    filled = [item for item in panel.bins if item.count > 0]
    total = sum(item.count for item in panel.bins)
    lefts = [item.lower for item in filled]
    widths = [item.upper - item.lower for item in filled]
    accuracy = [float(item.accuracy or 0.0) for item in filled]
    confidence = [float(item.confidence or 0.0) for item in filled]
    sparse = [item.count < SPARSE_BIN for item in filled]
    bars = top.bar(
        lefts,
        accuracy,
        widths,
        align="edge",
        color=_BAR,
        edgecolor="black",
        linewidth=0.5,
        label="accuracy",
    )
    gaps = top.bar(
        lefts,
        [c - a for c, a in zip(confidence, accuracy, strict=True)],
        widths,
        bottom=accuracy,
        align="edge",
        color=_GAP,
        alpha=0.35,
        edgecolor=_GAP,
        linewidth=0.5,
        hatch="//",
        label="gap",
    )
    for bar, gap, faint in zip(bars, gaps, sparse, strict=True):
        if faint:  # a handful of samples: the bar says little
            bar.set_alpha(0.3)
            gap.set_alpha(0.15)
    top.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color=_GUIDE, label="perfect")
    top.set(xlim=(0.0, 1.0), ylim=(0.0, 1.0), title=f"{panel.title} (n = {total:,})")
    if panel.ece is not None and math.isfinite(panel.ece):
        # The box is about 0.45 wide and 0.12 high in axes units.
        corner_free = all(  # faded (sparse) bars may sit under the box
            max(a, c) < 0.85
            for item, a, c, faint in zip(filled, accuracy, confidence, sparse, strict=True)
            if item.lower < 0.5 and not faint
        )
        x, y, ha, va = (
            (0.03, 0.97, "left", "top") if corner_free else (0.97, 0.03, "right", "bottom")
        )
        top.text(
            x,
            y,
            f"ECE = {panel.ece:.4f}",
            transform=top.transAxes,
            ha=ha,
            va=va,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": _GUIDE},
        )
    top.tick_params(labelbottom=False)
    fractions = [item.count / total for item in filled] if total else []
    histogram = bottom.bar(
        lefts, fractions, widths, align="edge", color=_GUIDE, edgecolor="black", linewidth=0.5
    )
    crowded = len(filled) > 10
    bottom.bar_label(
        histogram,
        [f"{item.count:,}" for item in filled],
        fontsize=5.5 if crowded else 6.5,
        rotation=90 if crowded else 0,
        padding=1.5,
    )
    bottom.set(xlim=(0.0, 1.0), ylim=(0.0, (1.9 if crowded else 1.3) * max(fractions, default=1.0)))
    faded = sum(sparse)
    xlabel = panel.xlabel
    if faded:
        xlabel += f"\n{faded} bin{'s' if faded > 1 else ''} with < {SPARSE_BIN} samples (faded)"
    bottom.set_xlabel(xlabel)
    if first:
        top.set_ylabel("accuracy")
        bottom.set_ylabel("fraction")


def spectrum_plot(
    eigenvalues: Sequence[float],
    path: Path,
    density_grid: Sequence[float] | None = None,
    density: Sequence[float] | None = None,
) -> Figure:
    """The top-k Hessian eigenvalues (stems at k = 1..K, in the order given) and, with
    ``density_grid`` and ``density``, the eigenvalue density beside them (log scale, values below
    1e-12 × its maximum clipped there). One axis, or two with a density."""
    if not eigenvalues:
        raise ValueError("spectrum_plot needs at least one eigenvalue")
    if (density_grid is None) != (density is None):
        raise ValueError("density_grid and density go together")
    if density_grid is not None and density is not None and len(density_grid) != len(density):
        raise ValueError("density_grid and density differ in length")
    fmt = _format(path)
    with _drawing() as new_figure:
        panels = 1 if density is None else 2
        figure = new_figure(4.0 * panels, 3.2)
        axes = figure.subplots(1, panels, squeeze=False)[0]
        if density_grid is not None and density is not None:
            floor = 1e-12 * max((d for d in density if math.isfinite(d)), default=1.0)
            shown = [max(d, floor) if math.isfinite(d) else math.nan for d in density]
            axes[0].plot(list(density_grid), shown, color=_BAR)
            axes[0].set(yscale="log", xlabel="eigenvalue", ylabel="density", title="density")
        top_k = axes[-1]
        index = list(range(1, len(eigenvalues) + 1))
        top_k.vlines(index, 0.0, list(eigenvalues), color=_BAR)
        top_k.plot(index, list(eigenvalues), "o", color=_BAR)
        top_k.axhline(0.0, color=_GUIDE, linewidth=0.8)
        top_k.set(xlabel="k", ylabel="eigenvalue", title=f"top {len(eigenvalues)} eigenvalues")
        top_k.set_xticks(index if len(index) <= 20 else index[:: math.ceil(len(index) / 20)])
        _save(figure, path, fmt)
    return figure


def per_layer_plot(
    names: Sequence[str],
    lambda_max: Sequence[float],
    traces: Sequence[float | None] | None,
    path: Path,
) -> Figure:
    """Horizontal bars per parameter group (top to bottom in the order given): λmax and, when
    ``traces`` is given, the trace beside it (a missing trace is left blank)."""
    if not names:
        raise ValueError("per_layer_plot needs at least one layer")
    if len(lambda_max) != len(names) or (traces is not None and len(traces) != len(names)):
        raise ValueError("names, lambda_max and traces differ in length")
    fmt = _format(path)
    columns: list[tuple[str, list[float]]] = [("λmax", [float(v) for v in lambda_max])]
    if traces is not None:
        columns.append(("trace", [math.nan if v is None else float(v) for v in traces]))
    with _drawing() as new_figure:
        figure = new_figure(2.0 + 3.5 * len(columns), max(2.5, 1.0 + 0.25 * len(names)))
        axes = figure.subplots(1, len(columns), squeeze=False, sharey=True)[0]
        rows = list(range(len(names)))
        for ax, (title, numbers) in zip(axes, columns, strict=True):
            ax.barh(rows, numbers, color=_BAR)
            ax.axvline(0.0, color=_GUIDE, linewidth=0.8)
            ax.set(title=title, xlabel=title)
        axes[0].set_yticks(rows, list(names))
        axes[0].invert_yaxis()
        _save(figure, path, fmt)
    return figure


def scatter_plot(
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str] | None,
    xlabel: str,
    ylabel: str,
    path: Path,
    title: str | None = None,
) -> Figure:
    """One point per (x, y), each annotated with its label when ``labels`` is given; one axis."""
    if len(x) != len(y) or (labels is not None and len(labels) != len(x)):
        raise ValueError("x, y and labels differ in length")
    fmt = _format(path)
    with _drawing() as new_figure:
        figure = new_figure(4.8, 4.0)
        ax = figure.add_subplot()
        ax.plot(list(x), list(y), "o", color=_BAR)
        for i, label in enumerate(labels or ()):
            ax.annotate(label, (x[i], y[i]), xytext=(4, 4), textcoords="offset points")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        if title:
            ax.set_title(title)
        _save(figure, path, fmt)
    return figure


def _format(path: Path) -> str:
    """The file format from the suffix; the directory must exist (checked before drawing)."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            OPTION, f"cannot tell the format of {path}", "name a .png, .svg or .pdf file"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(OPTION, f"directory {parent} does not exist")
    if path.is_dir():
        raise InputError(OPTION, f"{path} is a directory")
    return fmt


def require_matplotlib() -> None:
    """Raise the :class:`InputError` a plot would raise when matplotlib is missing (commands
    call it before any work, so that a missing extra does not waste a run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            OPTION, "matplotlib is not installed", "pip install 'curvcal[plot]'"
        ) from None


@contextmanager
def _drawing(dpi: int = DPI) -> Iterator[Any]:
    """matplotlib under a fixed style; yields ``new_figure(width_in, height_in)``."""
    require_matplotlib()
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure

    def new_figure(width: float, height: float) -> Figure:
        return Figure(figsize=(width, height), dpi=dpi, layout="constrained")

    with matplotlib.style.context("default"), matplotlib.rc_context(_STYLE):
        yield new_figure


def _save(figure: Figure, path: Path, fmt: str, dpi: int = DPI) -> None:
    with atomic_output(path) as out:
        figure.savefig(out, format=fmt, dpi=dpi, metadata=_METADATA[fmt])
