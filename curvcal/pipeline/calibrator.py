"""Calibrator files: the fitted calibration maps of a run, saved as JSON and read back.

Layout (``--save-calibrator FILE``, read by ``curvcal metrics --apply FILE``)::

    {"schema": "1.1", "curvcal": "<version>",
     "ts": {"method": "temperature", "temperature": T, "gamma": 0.0} | null,
     "focal_ts": {"method": "focal-temperature", "temperature": T, "gamma": γ} | null,
     "vector": {"method": "vector", "weights": [w_1..w_K], "bias": [b_1..b_K]},
     "matrix": {"method": "matrix", "weights": [[W_11..W_1K], ...], "bias": [b_1..b_K]},
     "provenance": {"n_classes": K, "class_names": [...] | null, "input_kind": "logits",
                    "fit_data": {"source", "path", "sha256", "size_bytes", "n_samples"},
                    "model": {"path", "sha256"} | null}}

A map acts on log-probabilities, but a temperature fitted on logits means something else for
rounded probabilities, and a map fitted for one model's classes means nothing for another's:
:func:`provenance_mismatches` lists where a file's provenance disagrees with the scores it is
applied to. The ``vector`` and ``matrix`` keys appear only in files that hold those maps
(schema ``1.2``; a file with TS and focal TS only stays ``1.1``); ``histogram``,
``histogram_ovr``, ``isotonic``, ``isotonic_ovr``, ``platt`` and ``beta`` keys only in files of
schema ``1.3``, which hold such a map (their numbers: :mod:`curvcal.calibration.binning`,
:mod:`~curvcal.calibration.isotonic`, :mod:`~curvcal.calibration.binary`; a ``bbq`` key:
:mod:`~curvcal.calibration.bbq`). Every value is a plain
number: reading a file runs nothing from it. Each map's body is read by its class's declared
fields (:mod:`curvcal.calibration.saved`: types, shapes, finite values, bounds), and the text
by :func:`curvcal.jsontext.loads`, which refuses a key given twice. A map that depends on the
model (Laplace) is checked against it where it is applied (``check_model``). Schema ``1.0``
files (no provenance) are still read. The command writes the text of
:func:`calibrators_json` atomically; every fault in a file read back is an
:class:`~curvcal.errors.InputError` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curvcal import jsontext
from curvcal.calibration.registry import MAPS, STAGE_METHODS, CalibrationMap
from curvcal.calibration.saved import (
    MAX_TEXT,
    Field,
    digest,
    integer,
    read_fields,
    shown_value,
    text,
)
from curvcal.errors import InputError
from curvcal.paths import readable_file

CALIBRATOR_SCHEMA = "1.1"
#: The schema of a file holding a map other than TS and focal TS.
MAPS_SCHEMA = "1.2"
#: The schema of a file holding histogram binning, isotonic regression, Platt scaling, beta
#: calibration, the last-layer Laplace approximation, Dirichlet calibration or ensemble
#: temperature scaling.
ONE_DIMENSIONAL_SCHEMA = "1.3"
#: Schemas read back: 1.0 files carry no provenance.
_READ_SCHEMAS = ("1.0", CALIBRATOR_SCHEMA, MAPS_SCHEMA, ONE_DIMENSIONAL_SCHEMA)
#: The stages a schema 1.3 file may hold and older ones may not.
_SINCE_1_3 = (
    *("histogram", "histogram_ovr", "isotonic", "isotonic_ovr", "platt", "beta"),
    *("laplace", "dirichlet", "dirichlet_l2", "ets"),
    "bbq",
    "venn_abers",
)
#: Stages every file names (``null`` when absent); the others only when present.
_ALWAYS = ("ts", "focal_ts")
_KEYS = ("schema", "curvcal", *STAGE_METHODS, "provenance")
#: the envelope's own fields beside the schema, read by the one schema reader: ``curvcal``, the
#: version that wrote the file (absent from the oldest files), is shown, never acted on, and
#: must still be what it says (any JSON value was accepted, an object or a NaN included)
ENVELOPE_FIELDS: tuple[Field, ...] = (text("curvcal", optional=True),)
_PROVENANCE_KEYS = ("n_classes", "class_names", "input_kind", "fit_data", "model")
_INPUT_KINDS = ("logits", "probs", "logprobs")
#: The fields of the provenance's ``fit_data`` and ``model`` objects, read by the one schema
#: reader every saved map's body goes through (:func:`curvcal.calibration.saved.read_fields`):
#: what a file read back records is checked before anything prints, slices or compares it.
RECORD_FIELDS: dict[str, tuple[Field, ...]] = {
    "fit_data": (
        text("source"),
        text("path", nullable=True),
        digest("sha256", nullable=True),
        integer("size_bytes", low=0, nullable=True),
        integer("n_samples", low=0),
    ),
    "model": (text("path"), digest("sha256", nullable=True)),
}


@dataclass(frozen=True)
class CalibratorProvenance:
    """What a calibrator was fitted on: the number of classes ``n_classes`` and their names
    (``class_names``, ``None`` when the scores did not name them), the ``input_kind`` of the
    scores, the ``fit_data`` (``source`` as given, ``path``, ``sha256``, ``size_bytes``,
    ``n_samples``; a split's source names the fraction and seed) and the ``model`` (``path``,
    ``sha256``; ``None`` for scores read from a file)."""

    n_classes: int
    input_kind: str
    class_names: tuple[str, ...] | None = None
    fit_data: dict[str, Any] | None = None
    model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_classes": self.n_classes,
            "class_names": None if self.class_names is None else list(self.class_names),
            "input_kind": self.input_kind,
            "fit_data": self.fit_data,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> CalibratorProvenance:
        """Rebuild from :meth:`to_dict` output; faults are :class:`InputError` naming ``where``."""
        if not isinstance(data, dict):
            raise InputError(where, f"'provenance' must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_PROVENANCE_KEYS))
        if unknown:
            raise InputError(where, f"unknown provenance keys {unknown}")
        n_classes, kind, names = (
            data.get("n_classes"),
            data.get("input_kind"),
            data.get("class_names"),
        )
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise InputError(
                where, f"provenance n_classes must be an integer >= 1, got {n_classes!r}"
            )
        if kind not in _INPUT_KINDS:
            raise InputError(
                where, f"provenance input_kind {kind!r} is not one of {', '.join(_INPUT_KINDS)}"
            )
        if names is not None and (
            not isinstance(names, list)
            or len(names) != n_classes
            or not all(isinstance(name, str) and len(name) <= MAX_TEXT for name in names)
        ):
            raise InputError(
                where,
                f"provenance class_names must be {n_classes} strings of at most {MAX_TEXT} "
                f"characters or null, got {shown_value(names)}",
            )
        records: dict[str, dict[str, Any] | None] = {}
        for key, fields in RECORD_FIELDS.items():
            record = data.get(key)
            if record is not None and not isinstance(record, dict):
                raise InputError(where, f"provenance {key} must be an object or null")
            records[key] = (
                None
                if record is None
                else read_fields(record, fields, f"{where} (provenance {key})")
            )
        return cls(
            n_classes=n_classes,
            input_kind=kind,
            class_names=None if names is None else tuple(names),
            fit_data=records["fit_data"],
            model=records["model"],
        )


@dataclass(frozen=True)
class CalibratorFile:
    """A calibrator file read back: its maps keyed by stage, and its provenance (``None`` for
    a schema 1.0 file, written before provenance was recorded)."""

    calibrators: dict[str, CalibrationMap]
    provenance: CalibratorProvenance | None


def provenance_mismatches(
    saved: CalibratorProvenance,
    n_classes: int,
    input_kind: str,
    class_names: tuple[str, ...] | None = None,
    model_sha256: str | None = None,
    scores_sha256: str | None = None,
) -> list[str]:
    """Where the scores a calibrator is applied to disagree with what it was fitted on: the
    class count, the class names (when both sides name them), the input kind and the model's
    SHA-256 (when both sides know it). Also, when the SHA-256 of the file of scores
    (``scores_sha256``) is the fit data's: the map was fitted on rows of these very scores, and
    measured on them it looks better than it is. Empty when nothing is wrong."""
    found: list[str] = []
    if saved.n_classes != n_classes:
        found.append(f"fitted on {saved.n_classes} classes, applied to {n_classes}")
    if (
        saved.class_names is not None
        and class_names is not None
        and tuple(saved.class_names) != tuple(class_names)
    ):
        found.append(
            f"fitted on classes {_names(saved.class_names)}, applied to {_names(class_names)}"
        )
    if saved.input_kind != input_kind:
        found.append(f"fitted on {saved.input_kind}, applied to {input_kind}")
    saved_model = (saved.model or {}).get("sha256")
    if saved_model and model_sha256 and saved_model != model_sha256:
        found.append(
            f"fitted on the outputs of model sha256 {saved_model[:12]}..., applied to model "
            f"sha256 {model_sha256[:12]}..."
        )
    in_sample = fitted_on_these(saved, scores_sha256)
    if in_sample is not None:
        found.append(in_sample)
    return found


def fitted_on_these(saved: CalibratorProvenance, scores_sha256: str | None) -> str | None:
    """Why a calibrator must not be measured on scores from the file whose SHA-256 is
    ``scores_sha256`` when that is the file its fit data came from (the rows it was fitted on
    would count as evaluation rows, and the map would look better than it is); ``None``
    otherwise, or when either side does not know the digest."""
    fitted_on = (saved.fit_data or {}).get("sha256")
    if not fitted_on or not scores_sha256 or fitted_on != scores_sha256:
        return None
    return (
        f"fitted on rows of these very scores ({(saved.fit_data or {}).get('source')}): "
        "measured on the rows it was fitted on, the map looks better than it is"
    )


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"[{shown}]"


def calibrators_json(
    calibrators: Mapping[str, CalibrationMap], provenance: CalibratorProvenance | None = None
) -> str:
    """The JSON text of a calibrator file holding ``calibrators`` (keyed by stage) and the
    ``provenance`` of their fit."""
    from curvcal import __version__

    newer = any(stage not in _ALWAYS for stage in calibrators)
    newest = any(stage in _SINCE_1_3 for stage in calibrators)
    schema = MAPS_SCHEMA if newer else CALIBRATOR_SCHEMA
    document: dict[str, object] = {
        "schema": ONE_DIMENSIONAL_SCHEMA if newest else schema,
        "curvcal": __version__,
    }
    for stage in STAGE_METHODS:
        calibrator = calibrators.get(stage)
        if calibrator is not None or stage in _ALWAYS:
            document[stage] = None if calibrator is None else calibrator.to_dict()
    document["provenance"] = None if provenance is None else provenance.to_dict()
    return json.dumps(document, indent=2) + "\n"


def load_calibrators(path: Path) -> dict[str, CalibrationMap]:
    """The calibrators a calibrator file holds, keyed by stage (:func:`load_calibrator_file`
    without the provenance)."""
    return load_calibrator_file(path).calibrators


def load_calibrator_file(path: Path) -> CalibratorFile:
    """The calibrators a file of :func:`calibrators_json` text holds, and its provenance.

    Refuses a missing or unreadable file, text that is not a JSON object, another schema,
    unknown keys, a stage whose method does not match it (``ts`` must be ``temperature``,
    ``focal_ts`` ``focal-temperature``, ``vector`` and ``matrix`` their own name), bad numbers
    or shapes, a map whose class count differs from the provenance's ``n_classes``, and a
    file with no calibrator at all.
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
    envelope = {spec.name for spec in ENVELOPE_FIELDS}
    read_fields({k: v for k, v in document.items() if k in envelope}, ENVELOPE_FIELDS, where)
    schema = document.get("schema")
    if schema not in _READ_SCHEMAS:
        raise InputError(
            where,
            f"calibrator schema {schema!r} is not {' or '.join(map(repr, _READ_SCHEMAS))}",
            "pass a file from --save-calibrator",
        )
    if schema == "1.0" and "provenance" in document:
        raise InputError(where, "a schema 1.0 calibrator file has no 'provenance'")
    provenance = None
    if document.get("provenance") is not None:
        provenance = CalibratorProvenance.from_dict(document["provenance"], where)
    calibrators: dict[str, CalibrationMap] = {}
    for stage, method in STAGE_METHODS.items():
        entry = document.get(stage)
        if entry is None:
            continue
        if stage not in _ALWAYS and schema not in (MAPS_SCHEMA, ONE_DIMENSIONAL_SCHEMA):
            raise InputError(where, f"a schema {schema} calibrator file has no {stage!r}")
        if stage in _SINCE_1_3 and schema != ONE_DIMENSIONAL_SCHEMA:
            raise InputError(where, f"a schema {schema} calibrator file has no {stage!r}")
        if stage not in _ALWAYS and isinstance(entry, dict) and entry.get("method") != method:
            raise InputError(
                where,
                f"'{stage}' must be a {method!r} calibrator, got method {entry.get('method')!r}",
            )
        calibrator = MAPS[stage].load(entry, f"{where} ({stage})")
        if calibrator.method != method:
            raise InputError(
                where,
                f"'{stage}' must be a {method!r} calibrator, got method {calibrator.method!r}",
            )
        calibrators[stage] = calibrator
    if not calibrators:
        raise InputError(where, "holds no calibrator", "both 'ts' and 'focal_ts' are null")
    if provenance is not None:
        _check_classes(calibrators, provenance.n_classes, where)
    return CalibratorFile(calibrators, provenance)


def _check_classes(calibrators: Mapping[str, CalibrationMap], n_classes: int, where: str) -> None:
    """Every map that has a class count must have the ``n_classes`` its file's provenance
    records: a file that disagrees with itself is the file's fault, not that of the scores it
    is applied to (which would otherwise be named, or pass the provenance check wrongly)."""
    for stage, calibrator in calibrators.items():
        own = getattr(calibrator, "n_classes", None)
        if own is not None and own != n_classes:
            raise InputError(
                where,
                f"'{stage}' is a map of {own} classes but the provenance records {n_classes}",
            )
