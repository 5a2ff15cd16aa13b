"""One saved form for the maps whose body is their fields (:class:`SavedMap`'s ``to_dict`` and
``from_fields``): a value goes to JSON and back unchanged, rows as lists one way and tuples of
floats the other, and a saved body names its fields in their declared order."""

from __future__ import annotations

import json
from array import array

import numpy as np

from curvcal.calibration.binning import HistogramMap
from curvcal.calibration.ensemble import EnsembleMap
from curvcal.calibration.saved import held_value, saved_value
from curvcal.calibration.venn_abers import VennAbersMap, float_row


def test_rows_become_lists_and_come_back_as_tuples() -> None:
    assert saved_value(((0.0, 0.5, 1.0), (0.0, 1.0))) == [[0.0, 0.5, 1.0], [0.0, 1.0]]
    assert saved_value((array("d", [0.25, 0.75]),)) == [[0.25, 0.75]]
    assert saved_value("histogram") == "histogram" and saved_value(3) == 3
    assert held_value(np.array([[1.0, 2.0], [3.0, 4.0]])) == ((1.0, 2.0), (3.0, 4.0))
    assert held_value([np.array([0.0, 1.0]), np.array([0.0, 0.5, 1.0])]) == (
        (0.0, 1.0),
        (0.0, 0.5, 1.0),
    )
    assert held_value(np.array([0.1, 0.2])) == (0.1, 0.2)
    assert held_value(0.5) == 0.5


def test_a_saved_body_lists_the_declared_fields_in_order_and_reads_back_equal() -> None:
    histogram = HistogramMap(
        "histogram-ovr", "equal-width", 2, ((0.0, 0.5, 1.0), (0.0, 1.0)), ((0.1, 0.9), (0.5,))
    )
    body = histogram.to_dict()
    assert list(body) == ["method", "scheme", "n_classes", "edges", "values"]
    assert HistogramMap.from_dict(json.loads(json.dumps(body))) == histogram
    ensemble = EnsembleMap(1.5, (0.5, 0.25, 0.25))
    assert ensemble.to_dict() == {
        "method": "ensemble-temperature",
        "temperature": 1.5,
        "weights": [0.5, 0.25, 0.25],
    }
    venn = VennAbersMap(
        2,
        (float_row(np.array([0.0])),),
        (float_row(np.array([0.0, 0.5])),),
        (float_row(np.array([0.5, 1.0])),),
    )
    assert venn.to_dict() == {
        "method": "venn-abers",
        "n_classes": 2,
        "c": [[0.0]],
        "p0": [[0.0, 0.5]],
        "p1": [[0.5, 1.0]],
    }
