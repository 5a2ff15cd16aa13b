"""Calibrator provenance: written, read back, old files read without it, and every mismatch
between a calibrator and the scores it is applied to named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal.calibration import Calibrator
from curvcal.errors import InputError
from curvcal.pipeline.calibrator import (
    CalibratorProvenance,
    calibrators_json,
    load_calibrator_file,
    provenance_mismatches,
)

TS = Calibrator("temperature", 2.25)
PROVENANCE = CalibratorProvenance(
    n_classes=3,
    input_kind="logits",
    class_names=("cat", "dog", "bird"),
    fit_data={"source": "--fit v.npz", "path": "v.npz", "sha256": "ab" * 32, "size_bytes": 9,
              "n_samples": 5},
    model={"path": "m", "sha256": "cd" * 32},
)  # fmt: skip


def test_provenance_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(calibrators_json({"ts": TS}, PROVENANCE))
    read = load_calibrator_file(path)
    assert read.calibrators == {"ts": TS} and read.provenance == PROVENANCE
    assert json.loads(path.read_text())["provenance"]["class_names"] == ["cat", "dog", "bird"]


def test_a_schema_1_0_file_is_read_without_provenance(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text('{"schema": "1.0", "ts": {"method": "temperature", "temperature": 2}}')
    read = load_calibrator_file(path)
    assert read.provenance is None and read.calibrators["ts"].temperature == 2.0


@pytest.mark.parametrize(
    ("provenance", "message"),
    [
        ("[]", "'provenance' must be an object"),
        ('{"n_classes": 0, "input_kind": "logits"}', "n_classes must be an integer >= 1"),
        ('{"n_classes": 2, "input_kind": "odds"}', "input_kind 'odds'"),
        ('{"n_classes": 2, "input_kind": "probs", "class_names": ["a"]}', "class_names must be 2"),
        ('{"n_classes": 2, "input_kind": "probs", "owner": 1}', "unknown provenance keys"),
    ],
)
def test_bad_provenance_is_refused_naming_the_file(
    tmp_path: Path, provenance: str, message: str
) -> None:
    path = tmp_path / "cal.json"
    path.write_text(
        '{"schema": "1.1", "ts": {"method": "temperature", "temperature": 2}, '
        f'"provenance": {provenance}}}'
    )
    with pytest.raises(InputError, match=message) as error:
        load_calibrator_file(path)
    assert error.value.what == str(path)


def test_matching_scores_have_no_mismatch() -> None:
    assert provenance_mismatches(PROVENANCE, 3, "logits", ("cat", "dog", "bird"), "cd" * 32) == []
    # what the scores do not know is not compared
    assert provenance_mismatches(PROVENANCE, 3, "logits") == []


def test_every_mismatch_is_named() -> None:
    found = provenance_mismatches(PROVENANCE, 4, "probs", ("cat", "dog", "fish", "ant"), "ef" * 32)
    assert found == [
        "fitted on 3 classes, applied to 4",
        "fitted on classes [cat, dog, bird], applied to [cat, dog, fish, ant]",
        "fitted on logits, applied to probs",
        "fitted on the outputs of model sha256 cdcdcdcdcdcd..., applied to model sha256 "
        "efefefefefef...",
    ]
