"""The tables of maps fitted on the fit split say so the same way: the title names the split
and its size, the caption ends with the in-sample warning (one helper builds them all)."""

from __future__ import annotations

from typing import Any

import torch

from curvcal.calibration.laplace import fit_laplace
from curvcal.calibration.registry import MAPS
from curvcal.report.calibration import (
    ensemble_fit_table,
    laplace_fit_table,
    linear_fits_table,
    one_dimensional_fits_table,
)
from curvcal.settings.calibration import CalibrationSettings


def _fit(stage: str) -> Any:
    g = torch.Generator().manual_seed(5)
    scores = 3 * torch.randn(90, 3, generator=g, dtype=torch.float64)
    labels = torch.arange(90) % 3
    return MAPS[stage].fit(scores, labels, "logits", CalibrationSettings())


def test_every_fit_table_names_the_fit_split_and_says_before_after_are_in_sample() -> None:
    weight = torch.eye(3, 4, dtype=torch.float64)
    features = torch.randn(40, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    tables = [
        linear_fits_table([_fit("vector")], 90),
        laplace_fit_table(fit_laplace(features, torch.arange(40) % 3, weight)),
        one_dimensional_fits_table([("histogram", _fit("histogram"))], 90),
        ensemble_fit_table(_fit("ets"), 90),
    ]
    assert [table.title for table in tables] == [
        "linear maps (on the fit split, 90 samples)",
        "Laplace (last layer, on the fit split, 40 samples)",
        "binning, isotonic and binary maps (on the fit split, 90 samples)",
        "ensemble temperature scaling (on the fit split, 90 samples)",
    ]
    assert tables[3].caption == (
        "T fitted first, then the weights (≥ 0, sum 1) by NLL with T fixed; before/after: in-sample"
    )
    assert tables[1].caption == (
        "δ maximises the Laplace log marginal likelihood (scalar prior, GGN of the summed "
        "cross-entropy); before/after: in-sample"
    )
    for table in tables:
        assert table.caption is not None and table.caption.endswith("; before/after: in-sample")
        assert any(row[0] == "NLL before" for row in table.rows)
