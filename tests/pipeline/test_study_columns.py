"""The study table's column notes say how the calibration columns were measured."""

from __future__ import annotations

from types import SimpleNamespace

from curvcal.pipeline.study import column_provenance


def test_the_ece_column_names_the_bins_it_was_measured_with() -> None:
    data = SimpleNamespace(n_samples=100, spec="curvcal:digits")
    columns = column_provenance("ce", None, data, data, 40, 60, bins=10)  # type: ignore[arg-type]
    assert columns["ECE"].startswith("10-bin top-label ECE (bins (a,b]) on the evaluation split")
    default = column_provenance("ce", None, data, data, 40, 60)  # type: ignore[arg-type]
    assert default["ECE"].startswith("15-bin top-label ECE")
