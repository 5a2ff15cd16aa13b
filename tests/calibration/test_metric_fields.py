"""One list names the metrics of a set of scores; every part that lists them draws on it."""

from __future__ import annotations

import dataclasses
import math

import torch

from curvcal.calibration.metrics import calibration_metrics
from curvcal.calibration.results import CalibrationMetrics
from curvcal.policy.parse import CALIBRATION_METRICS
from curvcal.results import CALIBRATION_METRIC_FIELDS
from curvcal.training.measurement import QUANTITIES
from curvcal.training.streaming import STREAMED, StreamingCalibration


def test_the_list_is_the_float_fields_of_calibration_metrics_in_order() -> None:
    settings = {"smooth_ece_bandwidth", "interval_level"}
    floats = tuple(
        field.name
        for field in dataclasses.fields(CalibrationMetrics)
        if field.type == "float" and field.name not in settings
    )
    assert floats == CALIBRATION_METRIC_FIELDS


def test_each_listed_metric_is_a_number_of_the_scores() -> None:
    # two samples worked by hand: p = (0.8, 0.2) right, (0.4, 0.6) wrong (label 0)
    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64)
    metrics = calibration_metrics(probs, torch.tensor([0, 0]), kind="probs", bins=2)
    assert metrics.accuracy == 0.5
    assert math.isclose(metrics.mean_confidence, 0.7)
    assert math.isclose(metrics.brier, (0.2**2 * 2 + 0.6**2 * 2) / 2)
    for name in CALIBRATION_METRIC_FIELDS:
        assert isinstance(getattr(metrics, name), float), name


def test_consumers_keep_the_order_of_the_list() -> None:
    def in_order(names: tuple[str, ...]) -> bool:
        listed = [name for name in names if name in CALIBRATION_METRIC_FIELDS]
        return listed == sorted(listed, key=CALIBRATION_METRIC_FIELDS.index)

    assert set(QUANTITIES) >= set(CALIBRATION_METRIC_FIELDS)
    assert set(CALIBRATION_METRICS) < set(CALIBRATION_METRIC_FIELDS)
    assert in_order(QUANTITIES) and in_order(CALIBRATION_METRICS) and in_order(STREAMED)
    metric = StreamingCalibration(bins=2)
    metric.update(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    assert tuple(metric.compute()) == STREAMED


def test_the_metrics_table_shows_every_metric_but_the_debiased_rms() -> None:
    # the table gives each metric its label and place; a new metric without a row fails here
    from curvcal.report.calibration import _METRIC_ROWS

    shown = [attribute for _label, attribute, _interval in _METRIC_ROWS]
    assert sorted(shown) == sorted(set(CALIBRATION_METRIC_FIELDS) - {"rms_ce_debiased"})
