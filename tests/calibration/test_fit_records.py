"""Every calibration map's fit record derives from one base, :class:`MapFit`: the same
``nll_before``/``nll_after``/``n_samples`` fields with the same meaning, and one ``to_dict`` that
keeps every JSON key the map wrote before (pinned here by name) and leaves the calibrator out.

The NLLs are checked against float64 references computed here: ``nll_before`` the mean −log
softmax(z)_y of the scores as given, ``nll_after`` the same of the fitted map's probabilities
on its own fit rows (in-sample). The maps read their fit split through one helper,
:func:`fit_split`, whose refusals are checked once for all of them.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest
import torch

from curvcal.calibration.inputs import InputNames
from curvcal.calibration.laplace import fit_laplace
from curvcal.calibration.registry import MAPS
from curvcal.calibration.results import MapFit, ScalingFit
from curvcal.calibration.univariate import fit_split
from curvcal.errors import InputError
from curvcal.settings.calibration import CalibrationSettings

SHARED = ("nll_before", "nll_after", "n_samples")
LINEAR = (
    "method",
    "input",
    "objective_after",
    "l2_off_diagonal",
    "l2_bias",
    "n_parameters",
    "iterations",
    "gradient_max",
    "gradient_tol",
    "max_iterations",
    "converged",
    "cv_folds",
    "cv_strengths",
    "cv_nll",
    "regulariser",
    "no_minimum",
)
BINARY = (
    "method",
    "input",
    "coefficients",
    "fixed",
    "l2",
    "iterations",
    "gradient_max",
    "gradient_tol",
    "converged",
)
HISTOGRAM = ("method", "scheme", "n_bins", "bins_used", "empty_bins", "n_parameters")
ISOTONIC = ("method", "points", "n_parameters")
#: each map's own keys of its JSON fit record, as docs/guide/calibration.md lists them
OWN_KEYS = {
    "vector": LINEAR,
    "matrix": LINEAR,
    "dirichlet": LINEAR,
    "dirichlet_l2": LINEAR,
    "histogram": HISTOGRAM,
    "histogram_ovr": HISTOGRAM,
    "isotonic": ISOTONIC,
    "isotonic_ovr": ISOTONIC,
    "platt": BINARY,
    "beta": BINARY,
    "ets": ("temperature", "weights", "nll_ts"),
    "bbq": (
        "method",
        "min_bins",
        "max_bins",
        "n_models",
        "models_kept",
        "largest_weight",
        "n_parameters",
    ),
    "venn_abers": (
        "method",
        "input",
        "distinct_scores",
        "knots",
        "n_parameters",
        "width_mean",
        "width_max",
    ),
}
SCORE_MAPS = sorted(OWN_KEYS)


def _split(n_classes: int, n: int = 240) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident logits (4× those the labels were drawn from) and their labels."""
    g = torch.Generator().manual_seed(11)
    truth = torch.randn(n, n_classes, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(truth, dim=1), 1, generator=g)[:, 0]
    return 4 * truth, labels


def _mean_nll(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float(-np.log(probabilities[np.arange(len(labels)), labels]).mean())


def _softmax(z: np.ndarray) -> np.ndarray:
    shifted = np.exp(z - z.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("stage", SCORE_MAPS)
def test_every_score_map_keeps_its_record_and_its_nll(stage: str) -> None:
    n_classes = 2 if stage in ("platt", "beta") else 3
    scores, labels = _split(n_classes)
    fit = MAPS[stage].fit(scores, labels, "logits", CalibrationSettings())
    assert isinstance(fit, MapFit)
    record = fit.to_dict()
    assert set(record) == {*OWN_KEYS[stage], *SHARED}
    assert "calibrator" not in record
    assert list(record)[-3:] == list(SHARED)
    assert fit.n_samples == len(labels)
    z, y = scores.numpy(), labels.numpy()
    assert fit.nll_before == pytest.approx(_mean_nll(_softmax(z), y), rel=1e-12)
    calibrated = fit.calibrator.probabilities(scores).numpy()
    # linear maps: the solver's NLL at its last iterate, the map rounded from it
    assert fit.nll_after == pytest.approx(_mean_nll(calibrated, y), rel=1e-9)
    assert fit.nll_after < fit.nll_before  # over-confident scores: every map helps in-sample


def test_the_laplace_record_derives_from_the_same_base() -> None:
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(3, 4, generator=g, dtype=torch.float64)
    features = torch.randn(50, 4, generator=g, dtype=torch.float64)
    labels = torch.arange(50) % 3
    fit = fit_laplace(features, labels, weight)
    assert isinstance(fit, MapFit)
    record = fit.to_dict()
    assert "calibrator" not in record and list(record)[-3:] == list(SHARED)
    logits = (features @ weight.T).numpy()
    assert fit.nll_before == pytest.approx(_mean_nll(_softmax(logits), labels.numpy()), rel=1e-12)
    assert fit.n_samples == 50


def test_temperature_fits_share_their_record_and_keep_their_keys() -> None:
    """TS and focal TS share what a temperature fit records (:class:`ScalingFit`) and carry
    their calibrator as a property, made from T (and γ): no copy in the record."""
    from curvcal.calibration.scaling import fit_focal_temperature, fit_temperature

    scores, labels = _split(3)
    ts = fit_temperature(scores, labels)
    focal = fit_focal_temperature(scores, labels, gammas=(0.0, 1.0))
    assert isinstance(ts, ScalingFit) and isinstance(focal, ScalingFit)
    assert not isinstance(ts, MapFit) and not isinstance(focal, MapFit)
    shared = {"temperature", "objective", "objective_before", "objective_after"}
    assert {item.name for item in fields(ts)} == {
        *shared,
        *SHARED,
        "derivative",
        "bracket",
        "at_bracket_end",
        "grid_step",
        "n_evaluations",
    }
    assert {item.name for item in fields(focal)} == {
        *shared,
        *SHARED,
        "gamma",
        "profile",
        "bracket",
        "grid_step",
        "n_evaluations",
        "n_exact_evaluations",
    }
    z, y = scores.numpy(), labels.numpy()
    reference = _mean_nll(_softmax(z), y)
    assert ts.nll_before == pytest.approx(reference, rel=1e-12)
    assert focal.nll_before == pytest.approx(reference, rel=1e-12)
    assert ts.nll_after == pytest.approx(_mean_nll(_softmax(z / ts.temperature), y), rel=1e-12)
    assert ts.calibrator.temperature == ts.temperature and focal.calibrator.gamma == focal.gamma


def test_map_fit_is_frozen_and_its_shared_fields_are_keywords() -> None:
    fit = MAPS["histogram"].fit(*_split(3), "logits", CalibrationSettings())
    with pytest.raises(AttributeError):
        fit.nll_after = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        MapFit(1.0, 0.5, 10, None)  # type: ignore[misc]
    assert MapFit(nll_before=1.0, nll_after=0.5, n_samples=10, calibrator=None).to_dict() == {
        "nll_before": 1.0,
        "nll_after": 0.5,
        "n_samples": 10,
    }


def test_fit_split_reads_log_probabilities_and_labels() -> None:
    scores = torch.tensor([[0.0, math.log(3.0)], [2.0, 2.0]], dtype=torch.float64)
    logp, y = fit_split(scores, [1, 0], "logits", InputNames("s.pt", "y.pt"), "BBQ")
    assert torch.allclose(logp.exp(), torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64))
    assert logp.dtype == torch.float64 and y.tolist() == [1, 0]
    probabilities = torch.tensor([[0.2, 0.8]], dtype=torch.float64)
    logp, _ = fit_split(probabilities, [1], "probs", InputNames("s.pt", "y.pt"), None)
    assert logp.exp()[0].tolist() == pytest.approx([0.2, 0.8], rel=1e-15)


def test_fit_split_refusals_name_the_map_and_the_inputs() -> None:
    one_class = torch.zeros(4, 1, dtype=torch.float64)
    with pytest.raises(InputError) as caught:
        fit_split(one_class, [0, 0, 0, 0], "logits", InputNames("s.pt", "y.pt"), "Venn-Abers")
    assert caught.value.what == "s.pt" and "Venn-Abers needs at least 2" in caught.value.why
    # without a map's name any K is read (ensemble TS): the labels are still checked
    logp, _ = fit_split(one_class, [0, 0, 0, 0], "logits", InputNames("s.pt", "y.pt"), None)
    assert logp.shape == (4, 1)
    with pytest.raises(InputError) as caught:
        fit_split(torch.zeros(3, 2), [0, 2, 1], "logits", InputNames("s.pt", "y.pt"), "BBQ")
    assert caught.value.what == "y.pt"
    with pytest.raises(InputError) as caught:
        fit_split(torch.zeros(3, 2), [0, 1], "logits", InputNames("s.pt", "y.pt"), "BBQ")
    assert caught.value.what == "y.pt"


def test_top_label_targets_take_the_first_index_on_ties() -> None:
    from curvcal.calibration.univariate import top_label_targets

    logp = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.7, 0.3]], dtype=torch.float64))
    confidence, correct = top_label_targets(logp, torch.tensor([1, 1, 0]))
    assert confidence.tolist() == pytest.approx([0.5, 0.8, 0.7], rel=1e-15)
    assert correct.tolist() == [0.0, 1.0, 1.0] and correct.dtype == np.float64
