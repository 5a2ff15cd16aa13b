"""Warnings for calibration results not to be trusted, from real analyses."""

from __future__ import annotations

import torch

from curvcal.calibration.analysis import CalibrationSettings, analyse_calibration
from curvcal.pipeline.calibration_warnings import analysis_warnings, probabilities_as_logits


def _analysis(fit_scores, fit_labels, scores, labels, kind="logits", method="ts"):
    settings = CalibrationSettings(method=method, gammas=(0.0, 1.0))
    return analyse_calibration(fit_scores, fit_labels, scores, labels, kind, settings, "fit-file")


def test_a_well_posed_fit_has_no_warning() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 3, generator=generator, dtype=torch.float64) * 2
    labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=generator).squeeze(1)
    analysis = _analysis(logits[:200] * 3, labels[:200], logits[200:] * 3, labels[200:])
    assert 2 < analysis.fits.ts.temperature < 4
    assert analysis_warnings(analysis) == []


def test_a_temperature_at_the_bracket_end_is_named() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(200, 3, generator=generator, dtype=torch.float64) * 5
    labels = torch.randint(0, 3, (200,), generator=generator)  # unrelated: T runs to the end
    analysis = _analysis(logits, labels, logits, labels, method="both")
    messages = analysis_warnings(analysis)
    assert analysis.fits.ts.at_bracket_end
    assert any(m.startswith("temperature scaling stopped at T = 100") for m in messages)
    assert any(m.startswith("focal temperature scaling (γ = ") for m in messages)


def test_an_infinite_nll_is_named_per_stage() -> None:
    probs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)
    labels = torch.tensor([1, 1, 0, 1])  # the first row gives its true class probability 0
    analysis = _analysis(None, None, probs, labels, kind="probs", method="none")
    assert analysis.evaluation.uncalibrated.nll == float("inf")
    (message,) = analysis_warnings(analysis)
    assert "NLL of the uncalibrated stage" in message and "infinite" in message


def test_probabilities_as_logits_names_the_source_and_the_remedy() -> None:
    message = probabilities_as_logits("z.csv")
    assert message.startswith("z.csv: ") and "--input-kind probs" in message
