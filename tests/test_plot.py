"""Plots: files written at the documented size, the right axes and bars, deterministic bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import matplotlib.image
import pytest

from curvcal.errors import InputError
from curvcal.report.plots import (
    ReliabilityBin,
    ReliabilityPanel,
    per_layer_plot,
    reliability_diagram,
    scatter_plot,
    spectrum_plot,
)

# Five equal-width bins, the first empty; 73 samples in all.
BINS = [
    ReliabilityBin(0.0, 0.2, 0, None, None),
    ReliabilityBin(0.2, 0.4, 3, 0.3, 0.25),
    ReliabilityBin(0.4, 0.6, 10, 0.5, 0.625),
    ReliabilityBin(0.6, 0.8, 20, 0.75, 0.5),
    ReliabilityBin(0.8, 1.0, 40, 0.875, 0.75),
]
PANELS = [
    ReliabilityPanel("uncalibrated", BINS, 0.08),
    ReliabilityPanel("TS", BINS, 0.03),
    ReliabilityPanel("focal TS", BINS, None),
]


def png_shape(path: Path) -> tuple[int, int]:
    """(height, width) in pixels of a PNG read back with matplotlib's image reader."""
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    assert float(image[..., :3].min()) < 1.0  # not a blank white canvas
    return int(image.shape[0]), int(image.shape[1])


def test_reliability_diagram_png(tmp_path: Path) -> None:
    path = tmp_path / "reliability.png"
    figure = reliability_diagram(PANELS, path)
    assert png_shape(path) == (400, 3 * 360)  # one row: fewer panels than 4
    assert len(figure.axes) == 2 * len(PANELS)
    assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]  # no temporary left


def test_reliability_bars_are_accuracy_gap_and_fraction(tmp_path: Path) -> None:
    figure = reliability_diagram(PANELS[:1], tmp_path / "one.png")
    top, bottom = figure.axes
    accuracy, gap = top.containers
    assert [bar.get_height() for bar in accuracy] == [0.25, 0.625, 0.5, 0.75]
    assert [bar.get_x() for bar in accuracy] == [0.2, 0.4, 0.6, 0.8]  # the empty bin is blank
    assert [bar.get_height() for bar in gap] == pytest.approx([0.05, -0.125, 0.25, 0.125])
    assert [bar.get_y() for bar in gap] == [0.25, 0.625, 0.5, 0.75]
    (fraction,) = bottom.containers
    assert [bar.get_height() for bar in fraction] == pytest.approx(
        [3 / 73, 10 / 73, 20 / 73, 40 / 73]
    )
    assert any(text.get_text() == "ECE = 0.0800" for text in top.texts)


def test_spectrum_plot_with_and_without_density(tmp_path: Path) -> None:
    eigenvalues = [12.0, 5.0, 2.0, -0.5]
    figure = spectrum_plot(eigenvalues, tmp_path / "top.png")
    assert png_shape(tmp_path / "top.png") == (320, 400)
    assert len(figure.axes) == 1
    figure = spectrum_plot(
        eigenvalues,
        tmp_path / "both.png",
        density_grid=[-1.0, 0.0, 6.0, 12.0],
        density=[0.1, 0.6, 0.0, 0.3],
    )
    assert png_shape(tmp_path / "both.png") == (320, 800)
    density_axis, top_k_axis = figure.axes
    assert density_axis.get_yscale() == "log"
    (stems,) = top_k_axis.get_lines()[:1]
    assert list(stems.get_ydata()) == eigenvalues


def test_per_layer_plot(tmp_path: Path) -> None:
    names = [f"layer{i}.weight" for i in range(8)]
    figure = per_layer_plot(
        names, [float(i) for i in range(8)], [1.0, None, *range(6)], tmp_path / "l.png"
    )
    assert png_shape(tmp_path / "l.png") == (100 * 3, 100 * 9)  # (1 + 0.25·8) × (2 + 3.5·2) in
    assert len(figure.axes) == 2
    assert [label.get_text() for label in figure.axes[0].get_yticklabels()] == names
    figure = per_layer_plot(names[:2], [1.0, 2.0], None, tmp_path / "one.png")
    assert png_shape(tmp_path / "one.png") == (250, 550)
    assert len(figure.axes) == 1


def test_scatter_plot_labels_points(tmp_path: Path) -> None:
    figure = scatter_plot(
        [1.0, 2.0, 3.0],
        [0.1, 0.05, 0.02],
        ["γ=0", "γ=1", "γ=3"],
        "λmax",
        "ECE",
        tmp_path / "s.png",
        "focal",
    )
    assert png_shape(tmp_path / "s.png") == (400, 640)
    (ax,) = figure.axes
    assert [text.get_text() for text in ax.texts] == ["1", "2", "3"]  # numbered points
    (key,) = figure.legends  # keyed to their labels outside the axes
    assert [t.get_text() for t in key.get_texts()] == ["1  γ=0", "2  γ=1", "3  γ=3"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("λmax", "ECE", "focal")


@pytest.mark.parametrize("suffix", [".svg", ".pdf"])
def test_vector_output_is_byte_identical_across_runs(tmp_path: Path, suffix: str) -> None:
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    reliability_diagram(PANELS[:2], first)
    reliability_diagram(PANELS[:2], second)
    assert first.stat().st_size > 1000
    assert first.read_bytes() == second.read_bytes()


def test_user_rc_settings_neither_leak_in_nor_are_changed(tmp_path: Path) -> None:
    plain = tmp_path / "plain.svg"
    styled = tmp_path / "styled.svg"
    scatter_plot([1.0, 2.0], [3.0, 4.0], ["a", "b"], "x", "y", plain)
    user = {"font.size": 30.0, "axes.facecolor": "red", "svg.hashsalt": "other"}
    with matplotlib.rc_context(user):
        scatter_plot([1.0, 2.0], [3.0, 4.0], ["a", "b"], "x", "y", styled)
        assert matplotlib.rcParams["font.size"] == 30.0
        assert matplotlib.rcParams["svg.hashsalt"] == "other"
    assert plain.read_bytes() == styled.read_bytes()


def test_format_from_suffix_and_bad_paths(tmp_path: Path) -> None:
    assert (tmp_path / "x.PDF").exists() is False
    spectrum_plot([1.0], tmp_path / "x.PDF")
    assert (tmp_path / "x.PDF").read_bytes().startswith(b"%PDF")
    with pytest.raises(InputError) as info:
        spectrum_plot([1.0], tmp_path / "x.jpeg")
    assert info.value.what == "--plot" and "x.jpeg" in info.value.why
    with pytest.raises(InputError, match="does not exist"):
        spectrum_plot([1.0], tmp_path / "missing" / "x.png")
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        spectrum_plot([1.0], tmp_path / "dir.png")


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(InputError) as info:
        spectrum_plot([1.0], tmp_path / "x.png")
    assert info.value.what == "--plot"
    assert "matplotlib is not installed" in info.value.why
    assert info.value.hint == "pip install 'curvcal[plot]'"
    assert not (tmp_path / "x.png").exists()


def test_inconsistent_inputs_are_rejected(tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    with pytest.raises(ValueError, match="at least one panel"):
        reliability_diagram([], out)
    with pytest.raises(ValueError, match="bad bin"):
        reliability_diagram([ReliabilityPanel("p", [ReliabilityBin(0.5, 0.4, 1, 0.5, 0.5)])], out)
    with pytest.raises(ValueError, match="without values"):
        reliability_diagram([ReliabilityPanel("p", [ReliabilityBin(0.0, 1.0, 2, None, None)])], out)
    with pytest.raises(ValueError, match="at least one eigenvalue"):
        spectrum_plot([], out)
    with pytest.raises(ValueError, match="go together"):
        spectrum_plot([1.0], out, density_grid=[0.0, 1.0])
    with pytest.raises(ValueError, match="differ in length"):
        per_layer_plot(["a", "b"], [1.0], None, out)
    with pytest.raises(ValueError, match="differ in length"):
        scatter_plot([1.0], [1.0, 2.0], None, "x", "y", out)
    assert not out.exists()


def test_all_empty_bins_draw_an_empty_diagram(tmp_path: Path) -> None:
    panel = ReliabilityPanel(
        "empty", [ReliabilityBin(0.0, 0.5, 0, None, None), ReliabilityBin(0.5, 1.0, 0, None, None)]
    )
    figure = reliability_diagram([panel], tmp_path / "empty.png")
    assert png_shape(tmp_path / "empty.png") == (400, 360)
    assert all(len(container) == 0 for container in figure.axes[0].containers)
