"""`curvcal hessian --plot`: spectrum (and density) and per-layer files, sizes and axes."""

from __future__ import annotations

import re
from pathlib import Path

from curvcal.assets import demo_checkpoint

LIGHT = (
    "--data", "curvcal:digits", "--max-samples", "40", "--device", "cpu", "--method", "lanczos",
    "--tol", "1e-2", "--probes", "4", "--top-k", "2", "--quiet",
)  # fmt: skip
#: LIGHT for runs without a trace, which refuse --probes (it would do nothing)
NO_TRACE = (*LIGHT[: LIGHT.index("--probes")], *LIGHT[LIGHT.index("--probes") + 2 :], "--no-trace")


def axes_in_svg(path: Path) -> int:
    return len(re.findall(r'<g id="axes_\d+">', path.read_text()))


def png_size(path: Path) -> tuple[int, int]:
    from matplotlib.image import imread

    height, width = imread(str(path)).shape[:2]
    return width, height


def test_spectrum_density_and_per_layer_plots(run_cli, tmp_path: Path) -> None:
    plot = tmp_path / "spectrum.svg"
    result = run_cli(
        "hessian", demo_checkpoint(), *LIGHT, "--density", "--density-runs", "1",
        "--density-steps", "5", "--per-layer", "--no-trace", "--plot", plot,
    )  # fmt: skip
    assert result.code == 0, result.output
    assert axes_in_svg(plot) == 2  # density and top-k
    layers = tmp_path / "spectrum-layers.svg"
    assert layers.stat().st_size > 0
    assert axes_in_svg(layers) == 2  # λmax and trace bars


def test_spectrum_png_size_and_refusals(run_cli, tmp_path: Path) -> None:
    plot = tmp_path / "spectrum.png"
    result = run_cli("hessian", demo_checkpoint(), *NO_TRACE, "--plot", plot)
    assert result.code == 0, result.output
    assert png_size(plot) == (400, 350)  # 4 × 3.2 inches + 0.3 of caption at 100 dpi, one axis
    first = plot.read_bytes()
    again = run_cli("hessian", demo_checkpoint(), *NO_TRACE, "--plot", plot)
    assert again.code == 2 and "already exists" in again.stderr  # checked before any work
    forced = run_cli("hessian", demo_checkpoint(), *NO_TRACE, "--plot", plot, "--force")
    assert forced.code == 0 and plot.read_bytes() == first  # deterministic
    bad = run_cli("hessian", demo_checkpoint(), *LIGHT, "--plot", tmp_path / "s.gif")
    assert bad.code == 2 and "cannot tell the format" in bad.stderr
