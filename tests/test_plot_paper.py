"""Plots fit for a paper: what is drawn is checked from the matplotlib objects against the
numbers it should show (bins, bootstrap intervals, smooth curve, shared axes, values, ρ)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.calibration.analysis import analyse_calibration
from curvcal.calibration.metrics import calibration_metrics
from curvcal.calibration.smooth import smooth_ece, smooth_reliability
from curvcal.report.calibration import reliability_panels, stage_detail
from curvcal.report.plots import (
    DENSITY_FLOOR,
    ReliabilityBin,
    ReliabilityPanel,
    SmoothCurve,
    per_layer_plot,
    reliability_diagram,
    scatter_plot,
    spectrum_plot,
)
from curvcal.settings.calibration import CalibrationSettings

BINS = [
    ReliabilityBin(0.0, 0.2, 0, None, None),
    ReliabilityBin(0.2, 0.4, 3, 0.3, 0.25, (0.0, 0.6)),
    ReliabilityBin(0.4, 0.6, 10, 0.5, 0.625, (0.4, 0.8)),
    ReliabilityBin(0.6, 0.8, 20, 0.75, 0.5, (0.35, 0.7)),
    ReliabilityBin(0.8, 1.0, 40, 0.875, 0.75, (0.6, 0.9)),
]
#: Most samples in the top bin, as for a well-trained network.
CROWDED = [
    ReliabilityBin(0.0, 0.5, 0, None, None),
    ReliabilityBin(0.5, 0.75, 6, 0.6, 0.5),
    ReliabilityBin(0.75, 1.0, 194, 0.97, 0.96),
]


def scores(n: int, k: int, seed: int, sharpen: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident logits: labels drawn from softmax(w), scores sharpen·w."""
    generator = torch.Generator().manual_seed(seed)
    w = 1.5 * torch.randn(n, k, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(w, dim=1), 1, generator=generator).squeeze(1)
    return sharpen * w, labels


def test_error_bars_are_the_bin_intervals_and_gap_never_blends(tmp_path: Path) -> None:
    figure = reliability_diagram([ReliabilityPanel("TS", BINS, 0.03)], tmp_path / "r.png")
    top = figure.axes[0]
    _accuracy, gap, errorbar = top.containers
    (segments,) = errorbar.lines[2]
    ends = [tuple(sorted(seg[:, 1])) for seg in segments.get_segments()]
    assert ends == pytest.approx([(0.0, 0.6), (0.4, 0.8), (0.35, 0.7), (0.6, 0.9)])
    xs = [seg[0, 0] for seg in segments.get_segments()]
    assert xs == pytest.approx([0.3, 0.5, 0.7, 0.9])  # at the bin centres
    for bar in gap:  # hatched, unfilled: red on blue where it overlaps a bar, never purple
        assert bar.get_facecolor()[3] == 0.0 and bar.get_hatch() == "////"
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "95% bootstrap interval" in legend and "gap to mean confidence" in legend


def test_histograms_share_one_axis_capped_at_one(tmp_path: Path) -> None:
    panels = [ReliabilityPanel("a", BINS, 0.1), ReliabilityPanel("b", BINS[2:], 0.1)]
    figure = reliability_diagram(panels, tmp_path / "r.png", counts="fraction")
    bottoms = figure.axes[1::2]
    limits = {ax.get_ylim() for ax in bottoms}
    assert len(limits) == 1  # the same axis in every panel
    largest = 40 / 70  # panel b: 40 of its 70 samples in one bin
    ((low, high),) = limits
    assert low == 0.0 and high == pytest.approx(min(1.0, 1.3 * largest)) and high <= 1.0
    heights = [bar.get_height() for bar in bottoms[1].containers[0]]
    assert heights == pytest.approx([10 / 70, 20 / 70, 40 / 70])
    for ax in bottoms:  # every count label vertical, none outside the axes
        assert {t.get_rotation() for t in ax.texts} == {90.0}
        assert all(t.xy[1] <= high for t in ax.texts)


def test_crowded_top_bin_switches_to_log_counts(tmp_path: Path) -> None:
    panels = [ReliabilityPanel("a", CROWDED, 0.01), ReliabilityPanel("b", BINS, 0.1)]
    figure = reliability_diagram(panels, tmp_path / "r.png")
    bottoms = figure.axes[1::2]
    assert {ax.get_yscale() for ax in bottoms} == {"log"}
    for ax in bottoms:  # half the smallest fraction of any panel, up to 1
        assert ax.get_ylim() == pytest.approx((6 / 200 / 2, 1.0))
    assert bottoms[0].get_ylabel() == "fraction (log)"
    inside = [t for t in bottoms[0].texts if t.get_text() == "194"]
    assert inside and inside[0].get_color() == "white"  # the tall bar holds its own label
    linear = reliability_diagram(panels, tmp_path / "l.png", counts="fraction")
    assert linear.axes[1].get_yscale() == "linear" and linear.axes[1].get_ylim()[1] == 1.0


def test_smooth_curve_matches_a_direct_kernel_smoother() -> None:
    logits, labels = scores(300, 4, seed=1, sharpen=3.0)
    p = torch.softmax(logits, dim=1)
    confidence, prediction = p.max(dim=1)
    correct = (prediction == labels).to(torch.float64)
    sigma = smooth_ece(confidence, correct).bandwidth
    curve = smooth_reliability(confidence, correct, sigma, points=33)
    f, r = confidence.numpy(), (correct - confidence).numpy()

    def kernel(t: float) -> np.ndarray:  # Gaussian reflected at 0 and 1, by its images
        shifts = 2.0 * np.arange(-6, 7)
        d = np.concatenate([t - f[:, None] + shifts, t + f[:, None] - shifts], axis=1)
        return np.exp(-0.5 * (d / sigma) ** 2).sum(axis=1) / (sigma * math.sqrt(2 * math.pi))

    for t, accuracy, density in zip(curve.confidence, curve.accuracy, curve.density, strict=True):
        weights = kernel(t)
        assert density == pytest.approx(weights.mean(), rel=2e-3, abs=1e-9)
        if weights.mean() > 1e-3:
            assert accuracy == pytest.approx(t + (weights * r).sum() / weights.sum(), abs=2e-3)
    # smECE = ∫ |r̂| δ̂ dt (trapezoid on the plotted grid)
    t = np.array(curve.confidence)
    integrand = np.abs(np.array(curve.accuracy) - t) * np.array(curve.density)
    value = float(((integrand[1:] + integrand[:-1]) / 2 * np.diff(t)).sum())
    assert all(math.isfinite(a) for a in curve.accuracy)  # JSON carries no NaN
    assert value == pytest.approx(smooth_ece(confidence, correct).value, rel=0.05)


def test_bin_intervals_are_percentiles_of_resampled_bin_accuracy() -> None:
    logits, labels = scores(200, 3, seed=2, sharpen=2.0)
    metrics = calibration_metrics(logits, labels, bins=5, bootstrap=60, seed=7)
    p = torch.softmax(logits, dim=1)
    confidence, prediction = p.max(dim=1)
    correct = (prediction == labels).numpy().astype(float)
    index = np.clip(np.ceil(confidence.numpy() * 5) - 1, 0, 4).astype(int)
    generator = torch.Generator().manual_seed(7)  # the same draws, counted independently
    draws = []
    for _ in range(60):
        pick = torch.randint(200, (200,), generator=generator).numpy()
        draws.append(
            [correct[pick][index[pick] == b].mean() if (index[pick] == b).any() else np.nan
             for b in range(5)]
        )  # fmt: skip
    table = np.array(draws)
    for b, span in enumerate(metrics.bin_intervals):
        if metrics.ece_bins[b].count == 0:
            assert span is None
            continue
        column = table[:, b][~np.isnan(table[:, b])]
        assert span == pytest.approx(tuple(np.percentile(column, [2.5, 97.5])), abs=1e-12)


def test_panels_carry_stage_parameters_intervals_curve_and_class_names(tmp_path: Path) -> None:
    fit, fit_labels = scores(300, 3, seed=3, sharpen=3.0)
    test, test_labels = scores(300, 3, seed=4, sharpen=3.0)
    settings = CalibrationSettings(
        method="both",
        gammas=(0.0, 1.0),
        bootstrap=30,
        plot=tmp_path / "r.png",
        plot_smooth=True,
        plot_classes=2,
    )
    analysis = analyse_calibration(fit, fit_labels, test, test_labels, "logits", settings)
    panels = reliability_panels(analysis, ("cat", "dog", "bird"))
    titles = [panel.title for panel in panels]
    assert titles[0] == "uncalibrated" and titles[3] == "TS" and titles[6] == "focal TS"
    assert {t.split(": ")[1] for t in titles if ": " in t} <= {"cat", "dog", "bird"}
    ts = analysis.fits.ts
    assert ts is not None and panels[3].detail == f"T = {ts.temperature:.3g}"
    assert panels[0].detail is None
    focal = analysis.fits.focal_ts
    assert focal is not None and panels[6].detail == (
        f"γ = {focal.gamma:.3g}, T = {focal.temperature:.3g}"
    )
    metrics = analysis.evaluation.ts
    assert metrics is not None
    assert panels[3].ece_interval == metrics.intervals["ece"]
    drawn = [item.interval for item in panels[3].bins]
    assert drawn == [
        None if item.count == 0 else span
        for item, span in zip(metrics.ece_bins, metrics.bin_intervals, strict=True)
    ]
    assert panels[3].curve is not None and metrics.smooth_curve is not None
    assert list(panels[3].curve.accuracy) == list(metrics.smooth_curve.accuracy)


def test_stage_detail_is_generic_over_maps() -> None:
    class Saved:
        def __init__(self, **values: object) -> None:
            self.values = values

        def to_dict(self) -> dict[str, object]:
            return self.values

    assert stage_detail(Saved(method="ts", temperature=2.5, gamma=0.0)) == "T = 2.5"
    assert stage_detail(Saved(method="focal_ts", temperature=1.5, gamma=0.0)) == "γ = 0, T = 1.5"
    assert stage_detail(Saved(method="isotonic", thresholds=[0.1, 0.5])) is None
    assert stage_detail(None) is None


def test_applied_stage_and_unknown_stage_titles() -> None:
    from curvcal.report.calibration import stage_title

    assert stage_title("ts") == "TS" and stage_title("histogram_binning") == "histogram binning"


def test_spectrum_values_trace_lambda_min_and_density_over_the_whole_spectrum(
    tmp_path: Path,
) -> None:
    # the bulk near 0 and outliers far out (12.3, 7.2, 4.6 in the field report; 42.95 and 26.5
    # here) whose weight in a smoothed density is far under the bulk's
    grid = np.linspace(-5, 40, 400)
    density = np.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi) + 1e-7 * np.exp(
        -0.5 * (grid - 26.5) ** 2
    )
    density[grid > 35] = 1e-30  # the flat floor a smoothed density reaches
    figure = spectrum_plot(
        [42.95, 26.5, -0.25],
        tmp_path / "s.png",
        list(grid),
        list(density),
        trace=(130.2, 129.0, 131.4),
        lambda_min=-1.5,
    )
    left, right = figure.axes
    assert [t.get_text() for t in right.texts[:3]] == ["42.95", "26.5", "-0.25"]
    box = right.texts[3].get_text()
    assert "λmax = 42.95" in box and "λmin = -1.5" in box and "tr(H) = 130.2" in box
    assert "[129, 131.4]" in box
    line, *markers = left.get_lines()
    assert sorted(m.get_xdata()[0] for m in markers) == [-0.25, 26.5, 42.95]  # each marked
    assert [t.get_text() for t in left.texts] == ["λ1 = 43", "λ2 = 26.5", "λ3 = -0.25"]
    shown = line.get_ydata()
    floor = DENSITY_FLOOR * density.max()
    assert (shown >= floor).all() and shown[density < floor] == pytest.approx(floor)
    assert left.get_yscale() == "log" and left.get_ylim()[0] < floor
    assert left.get_ylim()[0] < 1e-7 * density.max()  # the outlier's bump is on the axis
    low, high = left.get_xlim()
    assert low < -5 and high > 42.95  # the whole grid and the largest eigenvalue


def test_per_layer_log_scale_and_trace_error_bars(tmp_path: Path) -> None:
    figure = per_layer_plot(
        ["conv", "fc"],
        [0.5, 40.0],
        [3.0, 90.0],
        tmp_path / "l.png",
        trace_intervals=[(2.5, 3.5), (80.0, 100.0)],
    )
    lam, trace = figure.axes
    assert lam.get_xscale() == "log" and trace.get_xscale() == "log"
    assert lam.get_xlim()[0] == pytest.approx(0.1)  # the decade below the smallest value
    (errorbar,) = [c for c in trace.containers if hasattr(c, "lines")]
    segments = errorbar.lines[2][0].get_segments()
    assert [tuple(seg[:, 0]) for seg in segments] == [(2.5, 3.5), (80.0, 100.0)]
    assert [t.get_text() for t in trace.texts] == ["3", "90"]
    signed = per_layer_plot(["a", "b"], [-0.5, 4.0], None, tmp_path / "m.png")
    assert signed.axes[0].get_xscale() == "symlog"


def test_scatter_keys_long_names_and_shows_rho_and_error_bars(tmp_path: Path) -> None:
    names = ["resnet_cifar10_cross_entropy_seed1", "resnet_cifar10_focal_gamma3_seed2"]
    figure = scatter_plot(
        [0.3, 0.5],
        [0.02, 0.01],
        names,
        "λmax",
        "ECE",
        tmp_path / "s.png",
        xerr=[0.01, 0.02],
        note="Spearman ρ = -1.000",
    )
    (ax,) = figure.axes
    (key,) = figure.legends
    assert key.get_title().get_text() == "resnet_cifar10_…"
    assert [t.get_text() for t in key.get_texts()] == [
        "1  cross_entropy_seed1",
        "2  focal_gamma3_seed2",
    ]
    assert ax.get_title() == "Spearman ρ = -1.000"  # above the axes, over no point
    (errorbar,) = ax.containers
    segments = errorbar.lines[2][0].get_segments()
    assert [tuple(seg[:, 0]) for seg in segments] == [
        pytest.approx((0.29, 0.31)),
        pytest.approx((0.48, 0.52)),
    ]


def test_vector_files_parse(tmp_path: Path) -> None:
    curve = SmoothCurve([0.0, 0.5, 1.0], [0.1, 0.5, 0.9], [1.0, 1.0, 1.0])
    panel = ReliabilityPanel(
        "TS", BINS, 0.03, detail="T = 2", ece_interval=(0.01, 0.05), curve=curve
    )
    reliability_diagram([panel], tmp_path / "r.pdf", caption="model.pt on data")
    assert (tmp_path / "r.pdf").read_bytes().startswith(b"%PDF-")
    reliability_diagram([panel], tmp_path / "r.svg", caption="model.pt on data")
    root = ElementTree.parse(tmp_path / "r.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    spectrum_plot([1.0, 0.5], tmp_path / "s.svg", trace=(2.0, 1.0, 3.0))
    ElementTree.parse(tmp_path / "s.svg")
    per_layer_plot(["a"], [1.0], [2.0], tmp_path / "l.pdf")
    assert (tmp_path / "l.pdf").read_bytes().startswith(b"%PDF-")


def _row(name: str, gamma: float | None, lambda_max: float, ece: float) -> object:
    from curvcal.study.summary import CalibrationSummary, CurvatureSummary, StudyRow

    curvature = CurvatureSummary(
        lambda_max=lambda_max,
        lambda_max_converged=True,
        lambda_max_residual=0.01,
        trace=10 * lambda_max,
        trace_standard_error=0.5,
        loss="ce",
        gamma=None,
        mean_loss=0.3,
        n_samples=40,
        n_params=100,
        matvecs=20,
        engine="double-backward",
    )
    calibration = CalibrationSummary(
        n_eval=20, n_fit=20, accuracy=0.9, ece=ece, adaece=ece, nll=0.3, temperature=1.5,
        focal_gamma=1.0, focal_temperature=1.2, ece_after_ts=ece / 2, ece_after_fts=ece / 3,
    )  # fmt: skip
    loss = None if gamma is None else ("ce" if gamma == 0 else "focal")
    return StudyRow(name, loss, gamma, None, curvature, calibration)


def test_study_plots_skip_gamma_without_two_gammas_and_show_rho(tmp_path: Path) -> None:
    from curvcal.report.study import draw_plots, plot_files
    from curvcal.study.summary import StudyResult, rank_correlations

    rows = tuple(
        _row(f"run_{i}.safetensors", 0.0 if i == 0 else None, lam, ece)
        for i, (lam, ece) in enumerate([(1.0, 0.05), (2.0, 0.04), (3.0, 0.02), (4.0, 0.01)])
    )
    result = StudyResult(rows, rank_correlations(rows), {})  # type: ignore[arg-type]
    paths = plot_files(tmp_path)
    notes = draw_plots(result, paths)
    assert not paths["gamma"].exists()
    assert notes == [
        "lambda_max_vs_gamma.png not written: it needs checkpoints trained with at least two "
        "focal γ (ce counts as γ = 0) recorded in their metadata; 1 of 4 record one"
    ]
    assert paths["lambda_ece"].stat().st_size > 0 and paths["ece"].stat().st_size > 0
    tagged = tuple(
        _row(f"run_{g}.safetensors", g, lam, 0.01) for g, lam in [(0.0, 3.0), (2.0, 1.0)]
    )
    both = StudyResult(tagged, rank_correlations(tagged), {})  # type: ignore[arg-type]
    (tmp_path / "b").mkdir()
    tagged_paths = plot_files(tmp_path / "b")
    assert draw_plots(both, tagged_paths) == []  # two γ: the γ plot is drawn
    assert tagged_paths["gamma"].stat().st_size > 0


def test_study_rho_note_is_the_correlation_table_value() -> None:
    from curvcal.report.study import _rho
    from curvcal.study.summary import StudyResult, rank_correlations

    rows = tuple(
        _row(f"r{i}", None, lam, ece)
        for i, (lam, ece) in enumerate([(1.0, 0.05), (2.0, 0.04), (3.0, 0.02), (4.0, 0.01)])
    )
    result = StudyResult(rows, rank_correlations(rows), {})  # type: ignore[arg-type]
    assert _rho(result, "lambda_max").startswith("Spearman ρ = -1.000, p = ")
    assert _rho(result, "lambda_max").endswith("(n = 4)")


def test_metrics_cli_smooth_curve_log_counts_and_bootstrap_svg(run_cli, tmp_path: Path) -> None:
    logits, labels = scores(200, 3, seed=5, sharpen=4.0)
    data = tmp_path / "z.npz"
    np.savez(data, logits=logits.numpy(), labels=labels.numpy())
    plot = tmp_path / "r.svg"
    result = run_cli(
        "metrics", data, "--val-split", "0.5", "--method", "ts", "--bootstrap", "20",
        "--plot-smooth", "--plot-counts", "log", "--plot", plot, "--quiet",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    text = plot.read_text()
    ElementTree.fromstring(text)
    bad = run_cli("metrics", data, "--plot-counts", "sqrt", "--plot", tmp_path / "x.png")
    assert bad.code == 2 and "--plot-counts" in bad.stderr


def test_study_plot_format_writes_vector_files(tmp_path: Path) -> None:
    from curvcal.report.study import draw_plots, plot_paths
    from curvcal.settings.study import StudySettings
    from curvcal.study.summary import StudyResult, rank_correlations

    settings = StudySettings(plot=tmp_path / "plots", plot_format="pdf")
    paths = plot_paths(settings.plot, False, settings.plot_format)
    assert paths is not None
    assert sorted(p.name for p in paths.values()) == [
        "lambda_max_vs_ece.pdf",
        "lambda_max_vs_gamma.pdf",
        "trace_vs_ece.pdf",
    ]
    rows = tuple(_row(f"r{g}", g, 1.0 + g, 0.01 * (1 + g)) for g in (0.0, 1.0, 2.0))
    draw_plots(StudyResult(rows, rank_correlations(rows), {}), paths)  # type: ignore[arg-type]
    for path in paths.values():
        assert path.read_bytes().startswith(b"%PDF-")


def test_smooth_curve_leaves_out_points_no_sample_reaches() -> None:
    confidence = torch.linspace(0.95, 1.0, 200, dtype=torch.float64)
    correct = (torch.arange(200) % 10 != 0).to(torch.float64)
    curve = smooth_reliability(confidence, correct, bandwidth=0.01)
    assert 0 < len(curve.confidence) < 257 and min(curve.confidence) > 0.8
    assert all(math.isfinite(a) for a in curve.accuracy)
