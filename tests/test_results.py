"""The JSON envelope: schema, non-finite numbers, conversion of tensors and dataclasses."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from curvcal.report.tables import to_json_text
from curvcal.results import Report, to_jsonable


@dataclass(frozen=True)
class _Result:
    value: float
    values: tuple[float, ...]


def test_nonfinite_numbers_become_null_with_reason() -> None:
    report = Report(command="x", results=_Result(value=math.nan, values=(1.0, math.inf)))
    document = json.loads(to_json_text(report))
    assert document["results"] == {"value": None, "values": [1.0, None]}
    assert document["nonfinite"] == [
        {"path": "results.value", "value": "nan"},
        {"path": "results.values[1]", "value": "inf"},
    ]


def test_tensors_numpy_and_paths_convert() -> None:
    from pathlib import Path

    converted = to_jsonable(
        {"t": torch.tensor([1.5, 2.0]), "n": np.float64(3.0), "p": Path("a/b"), "i": np.int64(4)}
    )
    assert converted == {"t": [1.5, 2.0], "n": 3.0, "p": "a/b", "i": 4}


def test_unconvertible_object_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot convert object"):
        to_jsonable(object())
