"""Reliability diagrams for papers: n and counts, dpi, legend outside, ECE box, sparse note."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from curvcal.errors import InputError
from curvcal.report.plots import SPARSE_BIN, ReliabilityBin, ReliabilityPanel, reliability_diagram

BINS = [
    ReliabilityBin(0.0, 0.2, 0, None, None),
    ReliabilityBin(0.2, 0.4, 3, 0.3, 0.25),
    ReliabilityBin(0.4, 0.6, 10, 0.5, 0.625),
    ReliabilityBin(0.6, 0.8, 20, 0.75, 0.5),
    ReliabilityBin(0.8, 1.0, 40, 0.875, 0.75),
]


def test_counts_n_sparse_note_and_legend_outside(tmp_path: Path) -> None:
    figure = reliability_diagram([ReliabilityPanel("TS", BINS, 0.03)], tmp_path / "r.png")
    top, bottom = figure.axes
    assert top.get_title() == "TS\nn = 73"
    assert [t.get_text() for t in bottom.texts] == ["3", "10", "20", "40"]  # per-bin counts
    assert bottom.get_xlabel() == f"confidence\n1 bin with < {SPARSE_BIN} samples (faded)"
    accuracy, _ = top.containers
    assert [bar.get_alpha() for bar in accuracy] == [0.3, None, None, None]
    assert top.get_legend() is None and len(figure.legends) == 1  # above the panels
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [
        "accuracy",
        "gap to mean confidence",
        "perfect calibration",
    ]


def test_ece_box_avoids_the_bars(tmp_path: Path) -> None:
    figure = reliability_diagram([ReliabilityPanel("a", BINS, 0.08)], tmp_path / "a.png")
    (box,) = figure.axes[0].texts
    assert box.get_position() == (0.03, 0.97)  # upper left: no bar reaches it
    tall = [ReliabilityBin(0.2, 0.4, 50, 0.3, 0.95), ReliabilityBin(0.8, 1.0, 50, 0.9, 0.5)]
    figure = reliability_diagram([ReliabilityPanel("b", tall, 0.3)], tmp_path / "b.png")
    (box,) = figure.axes[0].texts
    assert box.get_position() == (0.97, 0.03)


def test_dpi_scales_pixels_and_columns_make_a_grid(tmp_path: Path) -> None:
    panels = [ReliabilityPanel(f"p{i}", BINS, 0.01 * i) for i in range(4)]
    reliability_diagram(panels[:1], tmp_path / "hi.png", dpi=200)
    assert matplotlib.image.imread(tmp_path / "hi.png").shape[:2] == (800, 720)
    figure = reliability_diagram(panels, tmp_path / "grid.png", columns=2)
    assert matplotlib.image.imread(tmp_path / "grid.png").shape[:2] == (800, 720)
    assert len(figure.axes) == 8
    with pytest.raises(InputError, match="dpi"):
        reliability_diagram(panels, tmp_path / "bad.png", dpi=0)
    assert not (tmp_path / "bad.png").exists()


def test_classwise_xlabel(tmp_path: Path) -> None:
    panel = ReliabilityPanel("class 3", BINS[1:], 0.02, xlabel="p_3")
    figure = reliability_diagram([panel], tmp_path / "c.png")
    assert figure.axes[1].get_xlabel().startswith("p_3")
