"""Calibrator files: the fitted calibration maps of a run, saved as JSON and read back.

Layout (``--save-calibrator FILE``, read by ``curvcal metrics --apply FILE``)::

    {"schema": "1.0", "curvcal": "<version>",
     "ts": {"method": "temperature", "temperature": T, "gamma": 0.0} | null,
     "focal_ts": {"method": "focal-temperature", "temperature": T, "gamma": γ} | null}

A map acts on log-probabilities, so it applies to logits, probabilities and log-probabilities
alike. The command writes the text of :func:`calibrators_json` atomically; every fault in a file
read back is an :class:`~curvcal.errors.InputError` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from curvcal import jsontext
from curvcal.calibration.analysis import STAGE_METHODS
from curvcal.calibration.results import Calibrator
from curvcal.errors import InputError
from curvcal.paths import readable_file

CALIBRATOR_SCHEMA = "1.0"
_KEYS = ("schema", "curvcal", *STAGE_METHODS)


def calibrators_json(calibrators: Mapping[str, Calibrator]) -> str:
    """The JSON text of a calibrator file holding ``calibrators`` (keyed by stage)."""
    from curvcal import __version__

    document: dict[str, object] = {"schema": CALIBRATOR_SCHEMA, "curvcal": __version__}
    for stage in STAGE_METHODS:
        calibrator = calibrators.get(stage)
        document[stage] = None if calibrator is None else calibrator.to_dict()
    return json.dumps(document, indent=2) + "\n"


def load_calibrators(path: Path) -> dict[str, Calibrator]:
    """The calibrators a file of :func:`calibrators_json` text holds, keyed by stage.

    Refuses a missing or unreadable file, text that is not a JSON object, another schema,
    unknown keys, a stage whose method does not match it (``ts`` must be ``temperature``,
    ``focal_ts`` ``focal-temperature``), bad numbers, and a file with no calibrator at all.
    """
    where = str(path)
    readable_file(path, expected="calibrator file")
    try:
        document = jsontext.loads(path.read_text(encoding="utf-8"), where)
    except UnicodeDecodeError:
        raise InputError(
            where, "is not a text file", "pass a file from --save-calibrator"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            where,
            f"is not valid JSON ({exc.msg} at line {exc.lineno})",
            "pass a file from --save-calibrator",
        ) from None
    if not isinstance(document, dict):
        raise InputError(where, f"holds a JSON {type(document).__name__}, not a calibrator object")
    unknown = sorted(set(document) - set(_KEYS))
    if unknown:
        raise InputError(
            where, f"unknown keys {unknown}", f"a calibrator file has {', '.join(_KEYS)}"
        )
    if document.get("schema") != CALIBRATOR_SCHEMA:
        raise InputError(
            where,
            f"calibrator schema {document.get('schema')!r} is not {CALIBRATOR_SCHEMA!r}",
            "pass a file from --save-calibrator",
        )
    calibrators: dict[str, Calibrator] = {}
    for stage, method in STAGE_METHODS.items():
        entry = document.get(stage)
        if entry is None:
            continue
        calibrator = Calibrator.from_dict(entry, f"{where} ({stage})")
        if calibrator.method != method:
            raise InputError(
                where, f"'{stage}' must be a {method!r} calibrator, got {calibrator.method!r}"
            )
        calibrators[stage] = calibrator
    if not calibrators:
        raise InputError(where, "holds no calibrator", "both 'ts' and 'focal_ts' are null")
    return calibrators
