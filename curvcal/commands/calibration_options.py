"""What ``curvcal calibrate`` and ``curvcal metrics`` do with their calibration options beyond
declaring them (declared once, as the fields of
:class:`~curvcal.settings.calibration.CalibrationSettings`): refuse an option that would do
nothing, check the ``--plot`` and ``--save-calibrator`` files before any work, and write them
after."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from curvcal.commands.common import typed_options
from curvcal.report.tables import check_output_path, write_atomic
from curvcal.settings.fields import option_name

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.pipeline.calibrator import CalibratorProvenance
    from curvcal.settings.calibration import CalibrationSettings


_TS = ("ts", "both", "all")
_FOCAL_TS = ("focal-ts", "both", "all")
_LAPLACE = ("laplace", "all")
_HISTOGRAM = ("histogram", "histogram-ovr", "all")
#: the fields whose options shape one map's fit, and the --method values that fit that map
_MAP_FIELDS = {
    "objective": _TS,
    "focal_objective": _FOCAL_TS,
    "gammas": _FOCAL_TS,
    "laplace_structure": _LAPLACE,
    "laplace_predictive": _LAPLACE,
    "laplace_samples": _LAPLACE,
    "laplace_prior": _LAPLACE,
    "histogram_bins": _HISTOGRAM,
    "histogram_scheme": _HISTOGRAM,
    "rank_by": ("all",),
}


def refuse_unused_map_options(values: dict[str, Any], selector: str = "method") -> None:
    """An option typed for a map that ``--method`` (when given) does not fit would do nothing:
    ``--method none --objective ece``, ``--method ts --gammas 0,1``. Refused, not ignored
    (``values``: the command's typed options, seen before the settings are built;
    ``selector``: the option that names the maps, ``maps`` for ``study``)."""
    method = values[selector]
    if method is None:
        return
    idle = [name for name, methods in _MAP_FIELDS.items() if method not in methods]
    unused = [option_name(name) for name in typed_options(idle)]
    if unused:
        raise click.UsageError(
            f"--{selector} {method} fits no map that {', '.join(unused)} would shape; leave "
            f"{'it' if len(unused) == 1 else 'them'} out or pick another --method"
        )


def check_outputs(settings: CalibrationSettings, force: bool) -> None:
    """Refuse, before any work, an output file that exists (without ``--force``) or cannot be
    written, and a plot suffix that names no format."""
    for path in (settings.plot, settings.save_calibrator):
        if path is not None:
            check_output_path(path, force)
    if settings.plot is not None:
        from curvcal.report.plots import SUFFIXES, require_matplotlib

        if settings.plot.suffix.lower() not in SUFFIXES:
            raise click.BadParameter(
                f"cannot tell the format of {settings.plot} (name a .png, .svg or .pdf file)",
                param_hint="'--plot'",
            )
        require_matplotlib()


def write_outputs(
    analysis: CalibrationAnalysis,
    provenance: CalibratorProvenance,
    settings: CalibrationSettings,
    caption: str | None = None,
) -> None:
    """Write the ``--save-calibrator`` (with the ``provenance`` of the fit) and ``--plot``
    files that were asked for; the plot names its classes as the provenance does and carries
    ``caption`` (model and data)."""
    if settings.save_calibrator is not None:
        from curvcal.pipeline.calibrator import calibrators_json

        write_atomic(settings.save_calibrator, calibrators_json(analysis.calibrators(), provenance))
    if settings.plot is not None:
        from curvcal.report.calibration import write_reliability_plot

        write_reliability_plot(
            analysis,
            settings.plot,
            settings.dpi,
            settings.plot_classes,
            provenance.class_names,
            caption,
        )
