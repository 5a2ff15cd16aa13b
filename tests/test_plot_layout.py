"""Figures that show the point: panels in a grid, tick labels that never collide (read from the
rendered figure's bounding boxes), axes that turn logarithmic when a quantity spans more than
100×, keys and legends inside the figure, and every figure the commands write naming the
checkpoint and the data."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from curvcal.assets import demo_checkpoint
from curvcal.report import plots, style
from curvcal.report.plots import (
    ReliabilityBin,
    ReliabilityPanel,
    grid_places,
    per_layer_plot,
    reliability_diagram,
    scatter_plot,
)
from tests.commands.test_metrics import logits_file


def _rendered(figure: Any) -> Any:
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return canvas.get_renderer()


def _tick_boxes(figure: Any, renderer: Any) -> Iterator[list[tuple[str, Any]]]:
    """Per axis of every axes: the visible, non-empty tick labels inside the view, with their
    window boxes."""
    for ax in figure.axes:
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = min(limits), max(limits)
            yield [
                (tick.label1.get_text(), tick.label1.get_window_extent(renderer))
                for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                if tick.label1.get_visible()
                and tick.label1.get_text()
                and low <= tick.get_loc() <= high
            ]


def _collisions(figure: Any) -> list[tuple[str, str]]:
    renderer = _rendered(figure)
    return [
        (a, b)
        for boxes in _tick_boxes(figure, renderer)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if box_a.overlaps(box_b)
    ]


def _inside(figure: Any) -> bool:
    """Whether every legend of ``figure`` (and of its axes) lies within the figure."""
    renderer = _rendered(figure)
    legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
    assert legends
    bounds = figure.bbox
    for legend in legends:
        box = legend.get_window_extent(renderer)
        if not (
            box.x0 >= bounds.x0 - 0.5
            and box.y0 >= bounds.y0 - 0.5
            and box.x1 <= bounds.x1 + 0.5
            and box.y1 <= bounds.y1 + 0.5
        ):
            return False
    return True


def test_grid_places_wrap_rows_and_groups() -> None:
    assert grid_places(5, 4) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert grid_places(3, None) == [(0, 0), (0, 1), (0, 2)]
    assert grid_places(2, 4) == [(0, 0), (0, 1)]  # fewer panels than columns: one row
    assert grid_places(1, 1) == [(0, 0)]
    # two stages of 1 + 4 classwise panels, 3 to a row: each stage starts a row
    assert grid_places(10, 3, group=5) == [
        *((0, 0), (0, 1), (0, 2), (1, 0), (1, 1)),
        *((2, 0), (2, 1), (2, 2), (3, 0), (3, 1)),
    ]
    with pytest.raises(ValueError, match="columns"):
        grid_places(2, 0)
    with pytest.raises(ValueError, match="at least one"):
        grid_places(0, 4)


def test_reliability_grid_panels_are_readable_and_the_legend_is_inside(tmp_path: Path) -> None:
    bins = [ReliabilityBin(0.0, 0.5, 30, 0.4, 0.3), ReliabilityBin(0.5, 1.0, 70, 0.8, 0.75)]
    panels = [ReliabilityPanel(f"map {i}", bins, 0.05) for i in range(6)]
    figure = reliability_diagram(panels, tmp_path / "r.png", caption="model.pt on data.pt")
    assert tuple(figure.get_size_inches() * figure.dpi) == pytest.approx((4 * 360, 2 * 400))
    renderer = _rendered(figure)
    tops = figure.axes[::2]
    assert len(tops) == 6
    # each panel's plotting area alone is at least 250 px wide at 100 dpi
    assert min(ax.get_window_extent(renderer).width for ax in tops) >= 250
    assert _inside(figure)
    assert figure.legends[0].get_title().get_text() == "model.pt on data.pt"


LONG = [f"encoder.layers.{i}.self_attention.query_key_value" for i in range(30)]


@pytest.mark.parametrize(
    ("names", "lambda_max", "traces"),
    [
        # signs alternate over 12 decades: a symmetric-log axis whose labels used to overlap
        (
            [f"layer{i}.block.conv" for i in range(12)],
            [(-1) ** i * 10.0 ** (i - 4) for i in range(12)],
            [(-1) ** i * 3 * 10.0 ** (i - 3) for i in range(12)],
        ),
        (LONG, [10.0 ** (i / 3) for i in range(30)], [10.0 ** (i / 2) for i in range(30)]),
        (["a", "b"], [1e-6, 1e6], [1e-9, 1e9]),
    ],
)
def test_per_layer_tick_labels_never_collide(
    tmp_path: Path, names: list[str], lambda_max: list[float], traces: list[float]
) -> None:
    figure = per_layer_plot(names, lambda_max, traces, tmp_path / "l.png", caption="m on d")
    assert _collisions(figure) == []
    renderer = _rendered(figure)
    names_shown = [t.get_window_extent(renderer) for t in figure.axes[0].get_yticklabels()]
    for ax in figure.axes:  # no value label runs into a layer's name
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert not any(box.overlaps(name) for name in names_shown), text.get_text()


def test_an_unthinned_symlog_axis_would_collide(tmp_path: Path, monkeypatch) -> None:
    """The collision check can fail: without the thinning the same figure overlaps."""
    monkeypatch.setattr(plots, "thin_tick_labels", lambda figure, gap=4.0: None)
    figure = per_layer_plot(
        [f"layer{i}" for i in range(12)],
        [(-1) ** i * 10.0 ** (i - 4) for i in range(12)],
        None,
        tmp_path / "l.png",
    )
    assert _collisions(figure)


@pytest.mark.parametrize(
    ("x", "scale", "label"),
    [
        ([3.0, 40.0, 1152.0], "log", "λmax (log)"),  # the field report's 3 to 1152
        ([-2.0, 0.5, 400.0], "symlog", "λmax (symlog)"),
        ([3.0, 40.0, 290.0], "linear", "λmax"),  # within 100×
        ([-5.0, 0.0, 5.0], "linear", "λmax"),
    ],
)
def test_scatter_axes_turn_logarithmic_past_100x(
    tmp_path: Path, x: list[float], scale: str, label: str
) -> None:
    figure = scatter_plot(x, [0.1, 0.05, 0.02], ["a", "b", "c"], "λmax", "ECE", tmp_path / "s.png")
    (ax,) = figure.axes
    assert ax.get_xscale() == scale and ax.get_xlabel() == label
    assert ax.get_yscale() == "linear"  # 0.02 to 0.1: 5×
    assert _collisions(figure) == []


@pytest.mark.parametrize("count", [3, 20, 40])
def test_scatter_key_stays_inside_the_figure(tmp_path: Path, count: int) -> None:
    labels = [f"resnet18_focal_gamma_{i}_seed_{i * 7}_epoch_{200 + i}" for i in range(count)]
    x = [1.0 + i for i in range(count)]
    y = [0.01 * (1 + i % 5) for i in range(count)]
    figure = scatter_plot(
        x, y, labels, "λmax", "ECE", tmp_path / "s.png", title="λmax vs ECE", caption="3 on d"
    )
    assert _inside(figure)
    assert figure.get_suptitle() == "3 on d"
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert len(texts) == count and texts[0].startswith("1  ")


@pytest.fixture
def drawn(monkeypatch) -> list[Any]:
    """Every figure the commands save, recorded as it is written."""
    figures: list[Any] = []
    original = style.save

    def recording(figure: Any, path: Path, fmt: str, dpi: int = style.DPI) -> None:
        figures.append(figure)
        original(figure, path, fmt, dpi)

    monkeypatch.setattr(style, "save", recording)
    monkeypatch.setattr(plots, "save", recording)
    return figures


def _words(figure: Any) -> str:
    """The figure's caption text: its suptitle and its legends' titles."""
    parts = [figure.get_suptitle()]
    parts += [legend.get_title().get_text() for legend in figure.legends]
    return " ".join(part for part in parts if part)


CKPT = demo_checkpoint()
SMALL = ("--data", "curvcal:digits", "--max-samples", "40", "--batch-size", "40")


@pytest.mark.slow  # five commands end to end (about 20 s on one core)
def test_every_figure_names_the_checkpoint_and_the_data(
    run_cli, tmp_path: Path, drawn: list[Any]
) -> None:
    named = f"{CKPT.name} on curvcal:digits"
    runs = [
        ("hessian", CKPT, *SMALL, "--top-k", "2", "--density", "--density-runs", "1",
         "--density-steps", "8", "--per-layer", "--probes", "4", "--plot", tmp_path / "h.png"),
        ("calibrate", CKPT, *SMALL, "--method", "ts", "--plot", tmp_path / "c.png"),
        ("landscape", CKPT, *SMALL, "--directions", "random", "--steps", "3",
         "--plot", tmp_path / "l.png"),
    ]  # fmt: skip
    for args in runs:
        before = len(drawn)
        result = run_cli(*args)
        assert result.code == 0, result.stderr
        assert len(drawn) > before
        for figure in drawn[before:]:
            assert named in _words(figure), args[0]
        if args[0] == "landscape":  # the table names them too
            assert f"Loss landscape of {named}" in " ".join(result.stdout.split())
    assert len(drawn) == 4  # spectrum, per-layer, reliability, landscape
    logits = logits_file(tmp_path / "scores.npz", 200, 3, seed=1)
    result = run_cli("metrics", logits, "--val-split", "0.5", "--plot", tmp_path / "m.png")
    assert result.code == 0, result.stderr
    assert "scores.npz" in _words(drawn[-1])


def test_study_figures_name_the_checkpoints_and_the_data(
    run_cli, tmp_path: Path, drawn: list[Any]
) -> None:
    import torch
    from safetensors.torch import save_file

    from tests.commands.test_study import FAST, _checkpoint

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 1, 8, 8, generator=generator), torch.arange(24) % 10
    save_file({"x": x, "y": y}, str(tmp_path / "data.safetensors"))
    for name, seed, gamma in (("a", 1, "0"), ("b", 2, "2")):
        loss = {"curvcal.loss": "focal" if gamma != "0" else "ce", "curvcal.gamma": gamma}
        _checkpoint(tmp_path / f"{name}.safetensors", seed, loss)
    data = str(tmp_path / "data.safetensors")
    result = run_cli(
        "study", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--data", data,
        "--plot", tmp_path / "plots", *FAST,
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert len(drawn) == 3
    for figure in drawn:
        assert _words(figure) == f"2 checkpoints on {data}"
        assert _inside(figure) and _collisions(figure) == []
