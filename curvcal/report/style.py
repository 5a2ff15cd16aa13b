"""One style for every curvcal figure: colours, fonts, sizes, the canvas and the file writer.

Figures are drawn on matplotlib's own Figure/Agg canvas (pyplot and the global backend are never
touched), under matplotlib's default style plus :data:`RC` (a user's ``matplotlibrc`` does not
leak in, and ours does not leak out), with fixed SVG hash salt and no dates in SVG/PDF metadata,
so the same numbers give the same bytes. The format of a file follows its suffix
(:data:`SUFFIXES`); files are written atomically (a temporary file, then a rename).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.atomic import atomic_output
from curvcal.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.ticker import Formatter
    from matplotlib.typing import RcKeyType

DPI = 100
SUFFIXES = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
OPTION = "--plot"

#: The measured quantity (bars, points, curves).
MAIN = "#4C72B0"
#: Miscalibration: the gap between accuracy and confidence (hatched, never blended).
GAP = "#C44E52"
#: A second measured quantity drawn over the first (the smooth reliability curve).
SECOND = "#DD8452"
#: Reference lines, the histogram and annotations' frames.
GUIDE = "#808080"
#: Error bars and intervals.
ERROR = "#222222"

RC: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs everywhere
    "font.size": 9.0,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 8.0,
    "figure.titlesize": 10.0,
    "lines.linewidth": 1.2,
    "hatch.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "curvcal",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
    "path.simplify": False,
}
METADATA: dict[str, dict[str, str | None]] = {
    "png": {"Software": "curvcal"},
    "svg": {"Creator": "curvcal", "Date": None},
    "pdf": {"Creator": "curvcal", "Producer": "curvcal", "CreationDate": None},
}
#: Annotation boxes (ECE, λ values, ρ).
BOX = {"boxstyle": "round", "facecolor": "white", "edgecolor": GUIDE, "alpha": 0.9}


def file_format(path: Path, option: str = OPTION) -> str:
    """The file format from the suffix; the directory must exist (checked before drawing)."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            option, f"cannot tell the format of {path}", "name a .png, .svg or .pdf file"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(option, f"directory {parent} does not exist")
    if path.is_dir():
        raise InputError(option, f"{path} is a directory")
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
def drawing(dpi: int = DPI) -> Iterator[Any]:
    """matplotlib under the fixed style; yields ``new_figure(width_in, height_in)``, a figure
    that draws every text as written (:func:`text_as_written`)."""
    require_matplotlib()
    import matplotlib
    import matplotlib.style
    from matplotlib.figure import Figure

    class WrittenFigure(Figure):
        """A figure whose every draw (a layout pass, the file) draws its texts as written
        (:func:`text_as_written`), whatever the plot did before."""

        def draw(self, renderer: Any) -> None:
            text_as_written(self)
            super().draw(renderer)

    def new_figure(width: float, height: float) -> Figure:
        return WrittenFigure(figsize=(width, height), dpi=dpi, layout="constrained")

    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        yield new_figure


def save(figure: Figure, path: Path, fmt: str, dpi: int = DPI) -> None:
    """Write ``figure`` to ``path`` atomically in ``fmt``, without dates, every text drawn as
    it is written (:func:`text_as_written`): the one writer of every figure."""
    text_as_written(figure)
    with atomic_output(path) as out:
        figure.savefig(out, format=fmt, dpi=dpi, metadata=METADATA[fmt])


#: The attribute :func:`number_labels` sets on a formatter of texts a number formatter wrote.
_WRITES_NUMBERS = "_curvcal_writes_numbers"


def number_labels(texts: Sequence[str]) -> Formatter:
    """A fixed formatter of tick labels that matplotlib's number formatters wrote (their
    ``$\\mathdefault{10^{-1}}$`` is drawn as mathtext, :func:`text_as_written`): how a plot
    that thins its ticks keeps them."""
    from matplotlib.ticker import FixedFormatter

    formatter = FixedFormatter(list(texts))
    setattr(formatter, _WRITES_NUMBERS, True)
    return formatter


def writes_numbers(formatter: Formatter) -> bool:
    """Whether the tick labels of ``formatter`` are numbers matplotlib wrote (a scalar or log
    axis, or :func:`number_labels`), not texts a plot gave (``set_yticks(rows, names)``,
    ``set_xticklabels``, a function of curvcal's): only those may be mathtext."""
    from matplotlib.ticker import LogFormatter, NullFormatter, ScalarFormatter

    return bool(getattr(formatter, _WRITES_NUMBERS, False)) or isinstance(
        formatter, ScalarFormatter | LogFormatter | NullFormatter
    )


def text_as_written(figure: Figure) -> None:
    """Draw every text of ``figure`` as it is written, ``$`` included: titles, legends,
    annotations, axis labels, suptitles and tick labels hold names (a checkpoint's, a file's,
    a layer's, a class's), and one named ``m$\\frac{$.pt`` made the plot a mathtext
    ``ValueError``, exit 70, or ``$x$`` was drawn as math, as ``[/]`` in a name was rich markup
    (:mod:`curvcal.console`). The one exception is the tick labels (and offset) of an axis
    whose formatter writes numbers (:func:`writes_numbers`): matplotlib's own formatters write
    mathtext (``$\\mathdefault{10^{-1}}$`` on a log axis), never a name. Called by
    :func:`save`, which every figure is written through, so no plot can forget it; the texts
    are those the figure holds when it is saved (its ticks made for their locations)."""
    from matplotlib.text import Text

    numbers: set[int] = set()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            if writes_numbers(axis.get_major_formatter()):
                numbers.add(id(axis.offsetText))
                numbers.update(_labels(axis.get_major_ticks()))
            if writes_numbers(axis.get_minor_formatter()):
                numbers.update(_labels(axis.get_minor_ticks()))
    for text in figure.findobj(Text):
        if id(text) not in numbers:
            text.set_parse_math(False)


def _labels(ticks: Sequence[Any]) -> list[int]:
    return [id(label) for tick in ticks for label in (tick.label1, tick.label2)]
