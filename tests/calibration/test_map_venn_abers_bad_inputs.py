"""Inductive Venn–Abers: bad saved maps and bad fit inputs give one line, exit 2, naming the
file or option; nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from curvcal.calibration.inputs import InputNames
from curvcal.calibration.venn_abers import VennAbersMap, fit_venn_abers
from curvcal.errors import InputError
from tests.commands.test_metrics import logits_file, one_line_error


def _fall(row: list[float]) -> list[float]:
    return [row[1], row[0], *row[2:]]


@pytest.mark.parametrize(
    ("key", "change", "needle"),
    [
        ("c", lambda rows: [_fall(rows[0]), *rows[1:]], "c must rise strictly"),
        ("c", lambda rows: [rows[0][:-1], *rows[1:]], "one more value than c"),
        ("p0", lambda rows: [[*rows[0][:-1], 1.0], *rows[1:]], "p0 must lie in [0, 1)"),
        ("p1", lambda rows: [[0.0, *rows[0][1:]], *rows[1:]], "p1 in (0, 1]"),
        ("p1", lambda rows: [[*rows[0][:-1], 0.01], *rows[1:]], "must not fall"),
        ("p0", lambda rows: rows[:-1], "needs 3 row(s) of p0"),
        ("p1", lambda rows: "__import__('os')", "p1 must be a non-empty list of lists"),
        ("c", lambda rows: [["1", *rows[0][1:]], *rows[1:]], "numbers only"),
        ("n_classes", lambda value: 1, "n_classes must be >= 2"),
        ("method", lambda value: "venn", "must be a 'venn-abers' calibrator, got method 'venn'"),
    ],
)
def test_tampered_saved_maps(run_cli, tmp_path: Path, key: str, change, needle: str) -> None:
    fit = logits_file(tmp_path / "fit.npz", 120, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 60, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--method", "venn-abers", "--save-calibrator", calibrator)
    assert run_cli("metrics", test, "--fit", fit, *args).code == 0
    saved = json.loads(calibrator.read_text())
    entry = {**saved["venn_abers"], key: change(saved["venn_abers"][key])}
    calibrator.write_text(json.dumps({**saved, "venn_abers": entry}))
    before = calibrator.read_text()
    one_line_error(run_cli("metrics", test, "--apply", calibrator), str(calibrator), needle)
    assert calibrator.read_text() == before


def test_missing_and_unknown_keys_and_old_schema(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 80, 2, seed=4)
    test = logits_file(tmp_path / "test.npz", 40, 2, seed=5)
    calibrator = tmp_path / "cal.json"
    run_cli(
        "metrics", test, "--fit", fit, "--method", "venn-abers", "--save-calibrator", calibrator
    )
    saved = json.loads(calibrator.read_text())
    entry = saved["venn_abers"]
    for bad, needle in (
        ({key: value for key, value in entry.items() if key != "p1"}, "missing keys ['p1']"),
        ({**entry, "code": "x"}, "unknown calibrator keys ['code']"),
        ({**entry, "c": [[float("inf")]]}, "must be finite"),
    ):
        calibrator.write_text(json.dumps({**saved, "venn_abers": bad}))
        one_line_error(run_cli("metrics", test, "--apply", calibrator), str(calibrator), needle)
    calibrator.write_text(json.dumps({**saved, "schema": "1.2"}))
    one_line_error(run_cli("metrics", test, "--apply", calibrator), "has no 'venn_abers'")


def test_a_map_for_other_classes_is_refused(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 80, 3, seed=6)
    test = logits_file(tmp_path / "test.npz", 40, 3, seed=8)
    wide = logits_file(tmp_path / "wide.npz", 40, 4, seed=7)
    calibrator = tmp_path / "cal.json"
    run_cli(
        "metrics", test, "--fit", fit, "--method", "venn-abers", "--save-calibrator", calibrator
    )
    refused = run_cli("metrics", wide, "--apply", calibrator)
    assert refused.code == 2 and "fitted on 3 classes, applied to 4" in refused.stderr
    # forced past the provenance check, the map itself refuses: one error line naming the scores
    result = run_cli("metrics", wide, "--apply", calibrator, "--apply-anyway")
    errors = [line for line in result.stderr.splitlines() if line.startswith("curvcal: error:")]
    assert result.code == 2 and "Traceback" not in result.stderr
    assert len(errors) == 1 and "wide.npz" in errors[0]
    assert "4 classes but the venn-abers map has 3" in errors[0]


def test_bad_fit_inputs_name_their_source() -> None:
    z = torch.zeros(6, 3)
    z[2, 1] = float("nan")
    with pytest.raises(InputError, match=r"fit\.npz"):
        fit_venn_abers(z, torch.zeros(6, dtype=torch.int64), names=InputNames("fit.npz"))
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
        fit_venn_abers(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(InputError, match="at least 2"):
        fit_venn_abers(torch.zeros(2, 1), torch.tensor([0, 0]))
    with pytest.raises(InputError, match="JSON object"):
        VennAbersMap.from_dict([1, 2], "cal.json")
