"""The demo's own table: accuracy and mean confidence on the held-out digits."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from curvcal.errors import InputError
from curvcal.inputs import refuse_output
from curvcal.report.tables import Table, check_output_path, fmt_float

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.curvature.results import HessianAnalysis

PLOT_NAMES = ("reliability.png", "spectrum.png")


def digits_table(n_samples: int, accuracy: float, confidence: float) -> Table:
    """Samples, top-1 accuracy and mean confidence, with a caption saying which way the model
    leans (over- or under-confident on average)."""
    return Table(
        title="held-out digits",
        columns=("quantity", "value"),
        rows=(
            ("samples", str(n_samples)),
            ("accuracy", fmt_float(accuracy)),
            ("mean confidence", fmt_float(confidence)),
        ),
        caption=_confidence_caption(accuracy, confidence),
    )


def _confidence_caption(accuracy: float, mean_confidence: float) -> str:
    if mean_confidence > accuracy:
        return "mean confidence above accuracy: over-confident on average"
    if mean_confidence < accuracy:
        return "mean confidence below accuracy: under-confident on average"
    return "mean confidence equals accuracy"


def plot_files(plot_dir: Path | None) -> tuple[Path, ...]:
    """The files ``--plot-dir`` names (none without it)."""
    return () if plot_dir is None else tuple(plot_dir / name for name in PLOT_NAMES)


def plot_paths(plot_dir: Path, force: bool) -> tuple[Path, Path]:
    """The demo's plot files in ``plot_dir``, checked before any work (the folder is created
    if missing)."""
    from curvcal.report.plots import require_matplotlib

    require_matplotlib()
    if plot_dir.exists() and not plot_dir.is_dir():
        raise InputError("--plot-dir", f"{plot_dir} exists and is not a folder")
    refuse_output(plot_dir, "--plot-dir")  # a folder created inside an input would change it
    try:
        plot_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError("--plot-dir", f"cannot create {plot_dir}: {error.strerror}") from error
    paths = (plot_dir / PLOT_NAMES[0], plot_dir / PLOT_NAMES[1])
    for path in paths:
        check_output_path(path, force)
    return paths


def write_plots(
    calibration: CalibrationAnalysis, hessian: HessianAnalysis, paths: tuple[Path, Path]
) -> None:
    """The reliability diagram and the spectrum, to ``paths``."""
    from curvcal.report.calibration import reliability_panels
    from curvcal.report.plots import reliability_diagram, spectrum_plot

    caption = "bundled digits CNN on curvcal:digits"
    reliability_diagram(reliability_panels(calibration), paths[0], caption=caption)
    trace = hessian.trace
    spectrum_plot(
        list(hessian.spectrum.eigenvalues),
        paths[1],
        trace=None if trace is None else (trace.estimate, *trace.ci95),
        lambda_min=hessian.lambda_min,
        caption=caption,
    )
