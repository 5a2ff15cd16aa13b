"""The settings that say how a file of scores is read (``curvcal metrics``), declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from curvcal.settings.fields import Settings, file_setting, setting

#: ``--input-kind``: what the scores are (never guessed).
INPUT_KINDS = ("logits", "probs", "logprobs")


@dataclass(frozen=True)
class ScoresSettings(Settings):
    """How ``metrics`` reads its scores: their ``input_kind`` and the names of the scores and
    labels in the files (``scores_key``, ``labels_key``); the file to ``fit`` the maps on, or
    the calibrators to ``apply`` (``apply_anyway`` where their provenance does not match);
    ``strict`` refuses scores read as logits that look like probabilities."""

    GROUP: ClassVar[str] = "logits"

    input_kind: str = setting("logits", "What the scores are (never guessed).", choices=INPUT_KINDS)
    scores_key: str = setting("logits", "Name of the scores in the files.")
    labels_key: str = setting("labels", "Name of the labels in the files.")
    fit: Path | None = file_setting(
        "Fit the maps on this logits file (same kind and keys) and evaluate on LOGITS.",
    )
    apply: Path | None = file_setting(
        "Measure the calibrators saved by --save-calibrator on LOGITS (fits nothing).",
        metavar="CALIBRATOR.json",
    )
    apply_anyway: bool = setting(
        False,
        "Apply --apply's calibrators even where their provenance (classes, input kind, model) "
        "does not match LOGITS.",
        flag=True,
    )
    strict: bool = setting(
        False, "Refuse (exit 2) scores read as logits that look like probabilities.", flag=True
    )
