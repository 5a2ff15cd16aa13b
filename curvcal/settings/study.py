"""The settings of ``curvcal study`` that are its own (the Hessian's come from
:class:`~curvcal.settings.hessian.HessianSettings`, the calibration's from the calibration
settings).

Every field is one option of ``curvcal study`` (field ``curvature_data`` is
``--curvature-data``), declared once with its type, default and help
(:mod:`curvcal.settings.fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from curvcal.settings.calibration import METHODS
from curvcal.settings.fields import Settings, folder_setting, setting, study_fields
from curvcal.settings.hessian import HessianSettings

#: The Hessian options ``study`` takes: the fields of
#: :class:`~curvcal.settings.hessian.HessianSettings` that say so (``study=True``); the others
#: keep their defaults: the top eigenvalue, the ``auto`` trace, every trainable parameter.
STUDY_HESSIAN_OPTIONS = study_fields(HessianSettings)
#: ``--maps``: the calibration maps study fits, spelled as ``calibrate --method`` spells them
#: (``--method`` itself is the Hessian's eigensolver in ``study``); ``none`` is not offered.
STUDY_MAPS = tuple(method for method in METHODS if method != "none")


@dataclass(frozen=True)
class StudySettings(Settings):
    """Where ``study`` measures the Hessian (``curvature_data``: a dataset spec read with the
    same data options as ``--data``; ``None``: ``--data`` itself), the calibration maps it fits
    on each checkpoint (``maps``: a ``calibrate --method`` value; ``both``: TS and focal TS,
    ``all``: every map that applies, ranked by NLL) and the folder its two plots go to
    (``plot``; ``None``: no plot) in ``plot_format``."""

    GROUP: ClassVar[str] = "study"

    curvature_data: str | None = setting(
        None,
        "Measure the Hessian on this dataset (same data options as --data); default --data.",
        metavar="SPEC",
    )
    maps: str = setting(
        "both",
        "Calibration maps fitted on each checkpoint, as calibrate --method names them (both: "
        "TS and focal TS; all: every map that applies, the best by NLL named per checkpoint); "
        "each map's ECE and NLL after calibration is a column, its ECE correlated with the "
        "curvature.",
        choices=STUDY_MAPS,
    )
    plot: Path | None = folder_setting(
        "Write lambda_max_vs_gamma.png (when the checkpoints record two or more focal γ), "
        "lambda_max_vs_ece.png and trace_vs_ece.png into DIR (needs matplotlib).",
    )
    plot_format: str = setting(
        "png",
        "Format of the --plot files: png, or svg / pdf (vector, for a paper).",
        choices=("png", "svg", "pdf"),
    )
