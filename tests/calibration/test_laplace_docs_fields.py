"""docs/guide/calibration.md's Laplace section names every key the Laplace map writes: the fit's
record (`fits.laplace`), the calibrator file's `laplace` entry and the applied summary, for both
structures, and every Laplace option of `calibrate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from curvcal.calibration import laplace as lp
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import cli_fields

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "calibration.md"


def _section() -> str:
    text = PAGE.read_text()
    start = text.index("### Laplace")
    return text[start : text.index("\n### ", start + 1)]


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_every_laplace_json_key_is_named_in_the_guide(structure: str) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(3, generator=g, dtype=torch.float64)
    phi = torch.randn(30, 4, generator=g, dtype=torch.float64)
    y = torch.arange(30) % 3
    fit = lp.fit_laplace(phi, y, w, b, structure=structure, prior="nll")
    section = _section()
    keys = {*fit.to_dict(), *fit.calibrator.to_dict(), *fit.calibrator.summary()}
    missing = sorted(key for key in keys if f"`{key}`" not in section and f"`{key}:" not in section)
    assert not missing, missing


def test_every_laplace_option_is_named_in_the_guide() -> None:
    section = _section()
    options = [
        field.name.replace("_", "-")
        for field, _spec in cli_fields(CalibrationSettings, (), None)
        if field.name.startswith("laplace_")
    ]
    assert len(options) == 4
    text = PAGE.read_text()
    for option in options:
        assert f"--{option}" in section or f"`--{option}" in text, option
