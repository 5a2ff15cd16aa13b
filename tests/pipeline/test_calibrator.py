"""Calibrator files: written, read back, and every kind of bad file refused with its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal.calibration import Calibrator
from curvcal.errors import InputError
from curvcal.pipeline.calibrator import calibrators_json, load_calibrators

TS = Calibrator("temperature", 2.25)
FOCAL = Calibrator("focal-temperature", 3.5, 1.5)


def test_round_trip_keeps_both_stages(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(calibrators_json({"ts": TS, "focal_ts": FOCAL}))
    document = json.loads(path.read_text())
    assert document["schema"] == "1.1"
    assert document["ts"] == {"method": "temperature", "temperature": 2.25, "gamma": 0.0}
    assert load_calibrators(path) == {"ts": TS, "focal_ts": FOCAL}


def test_one_stage_may_be_null(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(calibrators_json({"ts": TS}))
    assert json.loads(path.read_text())["focal_ts"] is None
    assert load_calibrators(path) == {"ts": TS}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json at all", "is not valid JSON"),
        ("[1, 2]", "holds a JSON list"),
        ('{"schema": "1.0", "ts": null, "focal_ts": null}', "holds no calibrator"),
        ('{"schema": "9", "ts": null}', "calibrator schema '9'"),
        ('{"ts": {"method": "temperature", "temperature": 2}}', "calibrator schema None"),
        ('{"schema": "1.0", "no_such_map": {}}', "unknown keys"),
        (
            '{"schema": "1.0", "ts": {"method": "focal-temperature", "temperature": 2, "gamma": 1}}',
            "'ts' must be a 'temperature' calibrator",
        ),
        ('{"schema": "1.0", "ts": {"method": "temperature", "temperature": -1}}', "temperature"),
        ('{"schema": "1.0", "ts": {"method": "temperature", "temperature": "2"}}', "a number"),
    ],
)
def test_bad_files_are_refused_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "cal.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as error:
        load_calibrators(path)
    assert error.value.what.startswith(str(path))


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_calibrators(tmp_path / "absent.json")
    binary = tmp_path / "cal.json"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(InputError, match="not a text file"):
        load_calibrators(binary)
