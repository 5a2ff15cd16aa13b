"""What a fit's or a metric's errors call its inputs: one InputNames value, and the keywords
the public API took before it (``source=``, ``labels_source=``) still read as that value."""

from __future__ import annotations

import pytest
import torch

import curvcal
from curvcal.calibration.binary import fit_binary
from curvcal.calibration.inputs import INPUTS, InputNames
from curvcal.calibration.isotonic import fit_isotonic
from curvcal.calibration.metrics import top_label_of
from curvcal.errors import InputError

SCORES = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5]])
LABELS = torch.tensor([0, 1, 0])
OUT_OF_RANGE = torch.tensor([0, 1, 2])


def test_the_names_of_a_file_and_of_its_labels() -> None:
    assert InputNames.of("val.pt") == InputNames("val.pt", "val.pt labels")
    assert InputNames("scores", "labels") == INPUTS


@pytest.mark.parametrize(
    "call",
    [
        lambda names: fit_binary(SCORES, OUT_OF_RANGE, "platt", names=names),
        lambda names: fit_isotonic(SCORES, OUT_OF_RANGE, names=names),
        lambda names: top_label_of(SCORES, OUT_OF_RANGE, names=names),
        lambda names: curvcal.fit_temperature(SCORES, OUT_OF_RANGE, names=names),
        lambda names: curvcal.calibration_metrics(SCORES, OUT_OF_RANGE, names=names),
    ],
)
def test_a_labels_error_names_the_labels_by_names(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as caught:
        call(InputNames("fit.npz", "fit.npz labels"))
    assert caught.value.what == "fit.npz labels"
    with pytest.raises(InputError) as caught:
        call(INPUTS)
    assert caught.value.what == "labels"


@pytest.mark.parametrize(
    "fitter", [curvcal.fit_temperature, curvcal.fit_focal_temperature, curvcal.calibration_metrics]
)
def test_the_public_functions_still_take_the_former_keywords(fitter) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as caught:
        fitter(SCORES, OUT_OF_RANGE, source="val.pt", labels_source="y.npy")
    assert caught.value.what == "y.npy"
    with pytest.raises(InputError) as caught:  # only one given: the other keeps its default
        fitter(SCORES, OUT_OF_RANGE, source="val.pt")
    assert caught.value.what == "labels"
    with pytest.raises(InputError) as caught:
        fitter(torch.zeros(3), LABELS, labels_source="y.npy")
    assert caught.value.what == "scores"


def test_names_and_a_former_keyword_together_are_refused() -> None:
    with pytest.raises(TypeError, match="names= or source=/labels_source="):
        curvcal.fit_temperature(SCORES, LABELS, names=INPUTS, source="val.pt")


def test_the_former_keywords_change_nothing_but_the_names() -> None:
    named = curvcal.calibration_metrics(SCORES, LABELS, source="val.pt")
    plain = curvcal.calibration_metrics(SCORES, LABELS)
    assert (named.ece, named.nll, named.accuracy) == (plain.ece, plain.nll, plain.accuracy)
