"""Holes a hardening round noticed and left, each fixed where every part goes through it:

- plots: names were drawn as written in titles, legends and annotations, but a tick label was
  still read as mathtext: a per-layer chart whose module is named ``m$\\frac{$`` was a
  ``ValueError`` (exit 70), and one named ``$x$`` was drawn as math. Now every figure is made
  by :func:`curvcal.report.style.drawing`, whose figures draw every text as written on each
  draw (:func:`~curvcal.report.style.text_as_written`), tick labels included; only the numbers
  matplotlib's own formatters write keep mathtext.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from matplotlib.figure import Figure
from matplotlib.text import Text

from curvcal.report.landscape import landscape_plot
from curvcal.report.plots import (
    ReliabilityBin,
    ReliabilityPanel,
    per_layer_plot,
    reliability_diagram,
    scatter_plot,
    spectrum_plot,
)

# ---------------------------------------------------------------------------------------------
# plots draw every name as written: ticks, annotations, titles, legends, suptitles

#: names mathtext would fail on (two ``$`` around a bad command), set as math (``$x$``), or
#: read as a lone delimiter
NAMES = ("m$\\frac{$", "$x$", "a$b", "$\\alpha$ b$")
BINS = [
    ReliabilityBin(0.0, 0.5, 12, 0.3, 0.25),
    ReliabilityBin(0.5, 1.0, 40, 0.8, 0.75),
]


def _texts(figure: Figure) -> list[Text]:
    return [text for text in figure.findobj(Text) if text.get_visible() and text.get_text()]


def _drawn_as_written(figure: Figure, names: tuple[str, ...]) -> list[str]:
    """Each text of ``figure`` that holds one of ``names``, checked to be drawn as written
    (no mathtext), and the texts that equal a name."""
    texts = _texts(figure)
    for name in names:
        holding = [text for text in texts if name in text.get_text()]
        assert holding, f"{name!r} is not drawn"
        for text in holding:
            assert not text.get_parse_math(), f"{text.get_text()!r} is read as mathtext"
    return [text.get_text() for text in texts if text.get_text() in names]


def test_names_in_every_slot_of_a_reliability_diagram(tmp_path: Path) -> None:
    panels = [
        ReliabilityPanel(NAMES[0], BINS, 0.05, xlabel=NAMES[1], detail=NAMES[2]),
        ReliabilityPanel(NAMES[3], BINS, 0.05),
    ]
    path = tmp_path / "r.png"
    figure = reliability_diagram(panels, path, caption=NAMES[0] + " on " + NAMES[3])
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_names_in_every_slot_of_a_spectrum(tmp_path: Path) -> None:
    path = tmp_path / "s.svg"
    figure = spectrum_plot([3.0, 1.0, -0.5], path, [0.0, 1.0, 2.0], [0.1, 1.0, 0.2],
                           trace=(4.0, 3.5, 4.5), caption=" ".join(NAMES))  # fmt: skip
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_module_names_on_the_per_layer_ticks_are_drawn_as_written(tmp_path: Path) -> None:
    """Before: ``ValueError: ParseSyntaxException`` for ``m$\\frac{$`` (exit 70 from
    ``hessian --per-layer --plot``), and ``$x$`` drawn as an italic x."""
    path = tmp_path / "l.png"
    values = [1.0, 20.0, 300.0, 4000.0]
    figure = per_layer_plot(list(NAMES), values, values, path, caption=NAMES[0])
    assert path.stat().st_size > 0
    ticks = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert ticks == list(NAMES)  # the drawn text is the name
    assert sorted(_drawn_as_written(figure, NAMES)) == sorted([*NAMES, NAMES[0]])
    # the numbers matplotlib writes on the log axis stay mathtext (10^2, not "$\mathdefault")
    numbers = [label for label in figure.axes[0].get_xticklabels() if label.get_text()]
    assert numbers and all("mathdefault" in label.get_text() for label in numbers)
    assert all(label.get_parse_math() for label in numbers)


def test_names_in_every_slot_of_a_scatter_plot(tmp_path: Path) -> None:
    path = tmp_path / "p.pdf"
    figure = scatter_plot([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.15, 0.3], list(NAMES), NAMES[0],
                          NAMES[1], path, title=NAMES[2], note=NAMES[3], caption=NAMES[0])  # fmt: skip
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_names_in_a_landscape_plot(tmp_path: Path) -> None:
    grids = {"loss": [[1.0, 0.5, 1.2]], "accuracy": [[0.5, 0.9, 0.4]], "ece": [[0.2, 0.1, 0.3]]}
    landscape = SimpleNamespace(
        betas=(), alphas=(-1.0, 0.0, 1.0), directions="random", grid=lambda key: grids[key]
    )
    analysis: Any = SimpleNamespace(landscape=landscape, loss=NAMES[1])
    path = tmp_path / "g.png"
    figure = landscape_plot(analysis, path, caption=NAMES[0])
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES[:2])


def test_a_new_plot_cannot_forget_names_on_its_ticks(tmp_path: Path) -> None:
    """The rule lives in the figure every plot is drawn on, not in each plot: ticks set by
    hand, an annotation and a table cell, drawn for layout before the file is saved."""
    from curvcal.report.style import drawing, save

    with drawing() as new_figure:
        figure = new_figure(4.0, 3.0)
        ax = figure.add_subplot()
        ax.bar(range(4), [1.0, 2.0, 3.0, 4.0])
        ax.set_xticks(range(4), list(NAMES))
        ax.annotate(NAMES[0], (1.0, 1.0))
        ax.table(cellText=[[NAMES[1], NAMES[2]]], loc="top")
        ax.set_yscale("log")
        figure.draw_without_rendering()  # a layout pass, as plots that thin their ticks make
        save(figure, tmp_path / "n.png", "png")
    assert (tmp_path / "n.png").stat().st_size > 0
    assert [label.get_text() for label in ax.get_xticklabels()] == list(NAMES)
    _drawn_as_written(figure, NAMES)
    assert math.isfinite(ax.get_ylim()[1])
