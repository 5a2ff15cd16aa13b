"""The settings of ``curvcal calibrate`` beyond the calibration's own: the dataset to fit the
maps on and the file the logits are saved to, declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from curvcal.settings.fields import Settings, file_setting, setting


@dataclass(frozen=True)
class CalibrateSettings(Settings):
    """``fit_data``: a dataset spec (read with the options of ``--data``) to fit the maps on,
    instead of a split of ``--data``; ``save_logits``: where the logits and labels of all of
    ``--data`` are written."""

    GROUP: ClassVar[str] = "calibrate"

    fit_data: str | None = setting(
        None,
        "Fit the maps on this dataset (same data options as --data) and evaluate on --data.",
        metavar="SPEC",
    )
    save_logits: Path | None = file_setting(
        "Write the logits and labels of all of --data to a .npz, .pt or .safetensors file.",
    )
    apply: Path | None = file_setting(
        "Measure the calibrators saved by --save-calibrator on all of --data (fits nothing). "
        "A Laplace calibrator needs the checkpoint it was fitted on (its SHA-256 is checked).",
        metavar="CALIBRATOR.json",
    )
