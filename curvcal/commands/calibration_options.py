"""The calibration options shared by ``curvcal calibrate`` and ``curvcal metrics``: parsing
(``--method``, ``--gammas``, ``--bins``, ... and ``--nan-policy``) into a
:class:`~curvcal.pipeline.calibration.CalibrationOptions`, and the ``--plot`` and
``--save-calibrator`` files they ask for."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from curvcal import choices
from curvcal.commands.common import typed_options
from curvcal.pipeline.calibration import CalibrationOptions
from curvcal.report.tables import check_output_path, write_atomic

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.pipeline.calibrator import CalibratorProvenance

F = TypeVar("F", bound=Callable[..., Any])

_OPTION_NAMES = (
    "method",
    "objective",
    "focal_objective",
    "gammas",
    "bins",
    "edges",
    "bootstrap",
    "val_split",
    "seed",
    "plot",
    "dpi",
    "plot_classes",
    "save_calibrator",
)


def check_outputs(options: CalibrationOptions, force: bool) -> None:
    """Refuse, before any work, an output file that exists (without ``--force``) or cannot be
    written, and a plot suffix that names no format."""
    for path in (options.plot, options.save_calibrator):
        if path is not None:
            check_output_path(path, force)
    if options.plot is not None:
        from curvcal.report.plots import SUFFIXES, require_matplotlib

        if options.plot.suffix.lower() not in SUFFIXES:
            raise click.BadParameter(
                f"cannot tell the format of {options.plot} (name a .png, .svg or .pdf file)",
                param_hint="'--plot'",
            )
        require_matplotlib()


#: the options that shape one map's fit, and the --method values that fit that map
_MAP_OPTIONS = {
    "objective": ("--objective", ("ts", "both")),
    "focal_objective": ("--focal-objective", ("focal-ts", "both")),
    "gammas": ("--gammas", ("focal-ts", "both")),
}


def _refuse_unused_map_options(method: str | None) -> None:
    """An option typed for a map that ``--method`` (when given) does not fit would do nothing:
    ``--method none --objective ece``, ``--method ts --gammas 0,1``. Refused, not ignored."""
    if method is None:
        return
    idle = [name for name, (_option, methods) in _MAP_OPTIONS.items() if method not in methods]
    unused = [_MAP_OPTIONS[name][0] for name in typed_options(idle)]
    if unused:
        raise click.UsageError(
            f"--method {method} fits no map that {', '.join(unused)} would shape; leave "
            f"{'it' if len(unused) == 1 else 'them'} out or pick another --method"
        )


def _gamma_list(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        gammas = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(
            f"takes comma-separated numbers such as 0,0.5,1,2; got '{value}'", ctx, param
        ) from None
    if not gammas:
        raise click.BadParameter("needs at least one value", ctx, param)
    if any(not (0 <= g < math.inf) for g in gammas):
        raise click.BadParameter(f"values must be finite and >= 0; got '{value}'", ctx, param)
    return gammas


def calibration_options(fit_help: str) -> Callable[[F], F]:
    """Add the options of a calibration run; the command receives one ``calibration`` keyword
    argument (a :class:`CalibrationOptions`). ``fit_help`` completes the ``--method`` help."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in _OPTION_NAMES}
            _refuse_unused_map_options(values["method"])
            return func(*args, calibration=CalibrationOptions(**values), **kwargs)

        decorators = [
            click.option(
                "--method",
                type=click.Choice(("ts", "focal-ts", "both", "none")),
                help=f"Calibration maps to fit: temperature scaling, focal temperature scaling, "
                f"both, or none (metrics only). {fit_help}",
            ),
            click.option(
                "--objective",
                type=click.Choice(("nll", "ece", "adaece")),
                default="nll",
                show_default=True,
                help="What temperature scaling minimises on the fit split.",
            ),
            click.option(
                "--focal-objective",
                type=click.Choice(("ece", "nll", "adaece", "adaece-grid")),
                default="ece",
                show_default=True,
                help="What focal temperature scaling minimises on the fit split (picks γ and T). "
                "adaece-grid: the authors' code (Komisarenko & Kull): T on the linear grid "
                "0.05, 0.10, ..., 5.00 by equal-mass ECE, for each γ; γ likewise.",
            ),
            click.option(
                "--gammas",
                callback=_gamma_list,
                metavar="G1,G2,...",
                help="γ grid of focal temperature scaling "
                "[default: 0,0.25,0.5,0.75,1,1.5,2,3,5,7].",
            ),
            click.option(
                "--bins",
                type=click.IntRange(1, choices.MAX_BINS),
                default=15,
                show_default=True,
                help="Bins of ECE, MCE, RMS-CE, AdaECE and classwise ECE.",
            ),
            click.option(
                "--edges",
                type=click.Choice(("left", "right")),
                default="left",
                show_default=True,
                help="Equal-width bin edges: left = (a,b], right = [a,b).",
            ),
            click.option(
                "--bootstrap",
                type=click.IntRange(min=0),
                default=0,
                show_default=True,
                metavar="N",
                help="Bootstrap resamples for 95% intervals of ECE, AdaECE, MCE and NLL.",
            ),
            click.option(
                "--val-split",
                type=click.FloatRange(0, 1, min_open=True, max_open=True),
                metavar="F",
                help="Fit on a stratified fraction F of the samples, evaluate on the rest.",
            ),
            click.option(
                "--seed",
                type=click.IntRange(0, choices.MAX_SEED),
                default=0,
                show_default=True,
                help="Seed of --val-split and of the bootstrap.",
            ),
            click.option(
                "--plot",
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help="Write reliability diagrams (uncalibrated, TS, focal TS) to a .png, "
                ".svg or .pdf file (needs matplotlib).",
            ),
            click.option(
                "--dpi",
                type=click.IntRange(10, 2400),
                default=100,
                show_default=True,
                help="Resolution of --plot (dots per inch; the layout is fixed in inches).",
            ),
            click.option(
                "--plot-classes",
                type=click.IntRange(min=0),
                default=0,
                show_default=True,
                metavar="N",
                help="Add classwise reliability diagrams (p_k against y = k) of the N most "
                "frequent classes to --plot, one row per stage.",
            ),
            click.option(
                "--save-calibrator",
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help="Write the fitted calibrator(s) as JSON (for metrics --apply).",
            ),
        ]
        command: Callable[..., Any] = wrapper
        for decorator in reversed(decorators):
            command = decorator(command)
        return command  # type: ignore[return-value]

    return decorate


def write_outputs(
    analysis: CalibrationAnalysis, provenance: CalibratorProvenance, options: CalibrationOptions
) -> None:
    """Write the ``--save-calibrator`` (with the ``provenance`` of the fit) and ``--plot``
    files that were asked for."""
    if options.save_calibrator is not None:
        from curvcal.pipeline.calibrator import calibrators_json

        write_atomic(options.save_calibrator, calibrators_json(analysis.calibrators(), provenance))
    if options.plot is not None:
        from curvcal.report.calibration import write_reliability_plot

        write_reliability_plot(analysis, options.plot, options.dpi, options.plot_classes)


def nan_policy_option(func: F) -> F:
    """Add ``--nan-policy error|drop`` (the command receives ``nan_policy``)."""
    decorated: F = click.option(
        "--nan-policy",
        type=click.Choice(("error", "drop")),
        default="error",
        show_default=True,
        help="Rows of logits with a NaN or Inf: stop with an error naming the first, or leave "
        "them out (counted in the report and warned about).",
    )(func)
    return decorated
