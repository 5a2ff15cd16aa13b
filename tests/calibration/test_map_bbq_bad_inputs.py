"""BBQ: bad saved maps and bad fit inputs are one line naming the file or option, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.calibration.bbq import BBQMap, fit_bbq
from curvcal.calibration.inputs import InputNames
from curvcal.errors import InputError
from tests.commands.test_metrics import logits_file

GOOD = {
    "method": "bbq",
    "n_classes": 3,
    "edges": [[0.0, 1.0], [0.0, 0.6, 1.0]],
    "values": [[0.5], [0.3, 0.8]],
    "weights": [0.25, 0.75],
}


def changed(**fields: object) -> dict:
    return {**GOOD, **fields}


@pytest.mark.parametrize(
    ("saved", "needle"),
    [
        (changed(method="histogram"), "unknown method"),
        (changed(n_classes=1), "n_classes must be >= 2"),
        (changed(n_classes=True), "n_classes must be a whole number, got True"),
        (changed(edges=[[0.0, 1.0], [0.0, 0.6, 0.9]]), "rise strictly from 0 to 1"),
        (
            changed(edges=[[0.0, 1.0], [0.0, 0.6, 0.6, 1.0]], values=[[0.5], [0.1, 0.2, 0.3]]),
            "rise strictly",
        ),
        (changed(values=[[0.5], [0.3]]), "one edge more"),
        (changed(values=[[0.5], [0.3, 1.2]]), "values 1.2 is outside 0..1"),
        (changed(values=[[0.5], [0.3, float("nan")]]), "finite"),
        (changed(weights=[0.5, 0.6]), "sum to 1"),
        (changed(weights=[1.25, -0.25]), "weights -0.25 is outside 0..1"),
        (changed(weights=[1.0]), "one weight per model"),
        (changed(weights=[]), "non-empty"),
        (changed(edges=[]), "non-empty"),
        (changed(weights=["0.25", 0.75]), "numbers only"),
        ({k: v for k, v in GOOD.items() if k != "weights"}, "missing"),
        ({**GOOD, "extra": 1}, "unknown calibrator keys"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_saved_maps_are_refused(saved: object, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as info:
        BBQMap.from_dict(saved, "cal.json")
    assert info.value.what == "cal.json"


def test_the_good_map_is_read() -> None:
    fitted = BBQMap.from_dict(GOOD, "cal.json")
    # f(c) = 0.25·0.5 + 0.75·(0.3 if c <= 0.6 else 0.8)
    assert fitted.confidence(np.array([0.4, 0.6, 0.7])).tolist() == [
        0.25 * 0.5 + 0.75 * 0.3,
        0.25 * 0.5 + 0.75 * 0.3,
        0.25 * 0.5 + 0.75 * 0.8,
    ]


def test_scores_of_another_number_of_classes_are_refused() -> None:
    fitted = BBQMap.from_dict(GOOD, "cal.json")
    with pytest.raises(InputError, match="has 4 classes but the bbq map has 3") as info:
        fitted.apply(torch.zeros(5, 4), source="test.npz")
    assert info.value.what == "test.npz"


def test_bad_fit_inputs_are_refused() -> None:
    z = torch.zeros(6, 3)
    z[2, 1] = float("nan")
    with pytest.raises(InputError, match=r"fit\.npz"):
        fit_bbq(z, torch.zeros(6, dtype=torch.int64), names=InputNames("fit.npz"))
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
        fit_bbq(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(InputError, match="needs at least 2"):
        fit_bbq(torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64), names=InputNames("fit.npz"))
    with pytest.raises(InputError, match="unknown BBQ map"):
        fit_bbq(torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64), method="bbq-ovr")
    with pytest.raises(InputError, match="bins must be whole numbers >= 1"):
        fit_bbq(torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64), counts=(0, 2))


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (lambda entry: entry.update(weights=[0.5] * len(entry["weights"])), "sum to 1"),
        (lambda entry: entry["edges"][0].reverse(), "rise strictly"),
        (lambda entry: entry.update(method="histogram"), "must be a 'bbq' calibrator"),
    ],
)
def test_a_tampered_saved_map_is_one_line_naming_the_file(
    run_cli, tmp_path: Path, tamper, needle: str
) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 150, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--fit", fit, "--method", "bbq", "--save-calibrator", calibrator)
    assert run_cli("metrics", test, *args).code == 0
    saved = json.loads(calibrator.read_text())
    tamper(saved["bbq"])
    calibrator.write_text(json.dumps(saved))
    before = calibrator.read_text()
    result = run_cli("metrics", test, "--apply", calibrator)
    assert result.code == 2 and str(calibrator) in result.stderr and needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert calibrator.read_text() == before  # nothing the user gave is changed
