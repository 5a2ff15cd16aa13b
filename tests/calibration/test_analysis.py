"""The calibration engine: fits only on the fit split, measures only on the evaluation split."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from curvcal.calibration import (
    Calibrator,
    apply_calibrator,
    calibration_metrics,
    fit_focal_temperature,
    fit_temperature,
)
from curvcal.calibration.analysis import (
    CalibrationSettings,
    analyse_calibration,
    evaluate_calibrators,
)
from curvcal.errors import InputError, as_option, wording
from curvcal.results import to_jsonable

GAMMAS = (0.0, 1.0)  # a short grid keeps the focal fits quick
FAST = CalibrationSettings(method="both", gammas=GAMMAS)

# references.md, golden micro-case "edge side": ECE 0.400 with (a,b], 0.200 with [a,b), M = 2.
GOLDEN_P = torch.tensor(
    [
        [0.5, 0.25, 0.25],
        [0.5, 0.25, 0.25],
        [0.75, 0.125, 0.125],
        [0.75, 0.125, 0.125],
        [0.25, 0.25, 0.5],
    ],
    dtype=torch.float64,
)
GOLDEN_Y = torch.tensor([0, 0, 0, 1, 2])


def overconfident(n: int, k: int, seed: int, sharpen: float = 3.0) -> tuple[torch.Tensor, ...]:
    """Labels drawn from softmax(w); scores sharpen·w are over-confident (true T = sharpen)."""
    generator = torch.Generator().manual_seed(seed)
    w = 1.5 * torch.randn(n, k, generator=generator, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(w, dim=1), 1, generator=generator)[:, 0]
    return sharpen * w, y


def same(a: object, b: object) -> bool:
    """Equal field by field (NaN means of empty bins compare equal, as null in JSON)."""
    return bool(to_jsonable(a) == to_jsonable(b))


def split(n: int, n_fit: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[:n_fit].sort().values, order[n_fit:].sort().values


def test_every_stage_is_measured_on_exactly_the_evaluation_indices() -> None:
    z, y = overconfident(300, 4, seed=1)
    fit_idx, eval_idx = split(300, 120)
    settings = dataclasses.replace(FAST, bootstrap=20, seed=3)
    analysis = analyse_calibration(
        z[fit_idx], y[fit_idx], z[eval_idx], y[eval_idx], "logits", settings, "val-split", 0.4
    )
    assert (analysis.split.n_fit, analysis.split.n_eval) == (120, 180)
    assert analysis.split.method == "val-split" and analysis.split.fraction == 0.4
    assert analysis.split.seed == 3
    options = {"bins": 15, "edges": "left", "bootstrap": 20, "seed": 3}
    assert same(
        analysis.evaluation.uncalibrated, calibration_metrics(z[eval_idx], y[eval_idx], **options)
    )
    assert analysis.fits.ts is not None and analysis.fits.focal_ts is not None
    for stage, fit in (("ts", analysis.fits.ts), ("focal_ts", analysis.fits.focal_ts)):
        measured = getattr(analysis.evaluation, stage)
        logp = apply_calibrator(fit.calibrator, z[eval_idx])
        expected = calibration_metrics(logp, y[eval_idx], kind="logprobs", **options)
        assert same(measured, expected)
        assert measured.n_samples == 180
    # The fits use the fit split alone.
    assert analysis.fits.ts == fit_temperature(z[fit_idx], y[fit_idx])
    assert analysis.fits.focal_ts == fit_focal_temperature(z[fit_idx], y[fit_idx], gammas=GAMMAS)
    assert analysis.fits.ts.temperature > 1.5  # over-confident scores are softened


def test_evaluation_split_cannot_move_the_fit_and_fit_split_cannot_move_the_metrics() -> None:
    z, y = overconfident(200, 3, seed=2)
    fit_idx, eval_idx = split(200, 100)
    settings = CalibrationSettings(method="ts")
    base = analyse_calibration(z[fit_idx], y[fit_idx], z[eval_idx], y[eval_idx], "logits", settings)
    scrambled_eval = analyse_calibration(
        z[fit_idx], y[fit_idx], -z[eval_idx], y[eval_idx].flip(0), "logits", settings
    )
    assert scrambled_eval.fits == base.fits
    assert not same(scrambled_eval.evaluation.uncalibrated, base.evaluation.uncalibrated)
    other_fit = analyse_calibration(
        z[fit_idx] / 3, y[fit_idx], z[eval_idx], y[eval_idx], "logits", settings
    )
    assert same(other_fit.evaluation.uncalibrated, base.evaluation.uncalibrated)
    assert other_fit.fits != base.fits


def test_golden_micro_case_on_the_evaluation_split() -> None:
    fit = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64)
    for edges, expected in (("left", 0.4), ("right", 0.2)):
        settings = CalibrationSettings(method="ts", bins=2, edges=edges)
        analysis = analyse_calibration(
            fit, torch.tensor([0, 1, 0]), GOLDEN_P, GOLDEN_Y, "probs", settings
        )
        assert analysis.evaluation.uncalibrated.ece == pytest.approx(expected, abs=1e-12)
        assert analysis.kind == "probs" and analysis.n_classes == 3


def test_method_none_measures_only_the_uncalibrated_scores() -> None:
    analysis = analyse_calibration(
        None, None, GOLDEN_P, GOLDEN_Y, "probs", CalibrationSettings(method="none", bins=2)
    )
    assert analysis.evaluation.ts is None and analysis.evaluation.focal_ts is None
    assert analysis.fits.ts is None and analysis.fits.focal_ts is None
    assert (analysis.split.method, analysis.split.n_fit, analysis.split.n_eval) == ("none", 0, 5)
    assert analysis.calibrators() == {}
    assert analysis.evaluation.uncalibrated.ece == pytest.approx(0.4, abs=1e-12)


def test_json_layout_is_what_the_ci_gate_reads() -> None:
    z, y = overconfident(120, 3, seed=4)
    document = to_jsonable(analyse_calibration(z[:60], y[:60], z[60:], y[60:], "logits", FAST))
    assert set(document["evaluation"]) == {"uncalibrated", "ts", "focal_ts"}
    for stage in ("uncalibrated", "ts", "focal_ts"):
        assert 0 <= document["evaluation"][stage]["ece"] <= 1
    assert document["fits"]["ts"]["temperature"] > 0
    assert document["fits"]["focal_ts"]["gamma"] in GAMMAS
    assert document["fits"]["focal_ts"]["temperature"] > 0
    assert document["split"] == {
        "method": "fit-data",
        "n_fit": 60,
        "n_eval": 60,
        "fraction": None,
        "seed": None,
    }
    assert document["settings"]["gammas"] == list(GAMMAS)


def test_only_the_requested_maps_are_fitted() -> None:
    z, y = overconfident(100, 3, seed=5)
    ts_only = analyse_calibration(
        z[:50], y[:50], z[50:], y[50:], "logits", CalibrationSettings("ts")
    )
    assert ts_only.fits.focal_ts is None and ts_only.evaluation.focal_ts is None
    assert set(ts_only.calibrators()) == {"ts"}
    focal = CalibrationSettings("focal-ts", gammas=GAMMAS)
    focal_only = analyse_calibration(z[:50], y[:50], z[50:], y[50:], "logits", focal)
    assert focal_only.fits.ts is None and focal_only.evaluation.ts is None
    assert focal_only.calibrators()["focal_ts"].method == "focal-temperature"


def test_saved_calibrators_are_measured_on_all_samples() -> None:
    z, y = overconfident(150, 4, seed=6)
    calibrators = {
        "ts": Calibrator("temperature", 2.5),
        "focal_ts": Calibrator("focal-temperature", 3.0, 1.0),
    }
    analysis = evaluate_calibrators(z, y, "logits", calibrators, CalibrationSettings("none"))
    assert analysis.split.method == "none" and analysis.split.n_eval == 150
    assert analysis.applied == calibrators and analysis.calibrators() == calibrators
    for stage, calibrator in calibrators.items():
        expected = calibration_metrics(apply_calibrator(calibrator, z), y, kind="logprobs")
        assert same(getattr(analysis.evaluation, stage), expected)


def test_identity_calibrator_reproduces_the_uncalibrated_metrics() -> None:
    z, y = overconfident(80, 3, seed=7)
    analysis = evaluate_calibrators(
        z, y, "logits", {"ts": Calibrator("temperature", 1.0)}, CalibrationSettings("none")
    )
    assert analysis.evaluation.ts is not None
    assert analysis.evaluation.ts.ece == pytest.approx(analysis.evaluation.uncalibrated.ece)
    assert analysis.evaluation.ts.nll == pytest.approx(analysis.evaluation.uncalibrated.nll)


def test_one_sample_evaluation_split_is_defined() -> None:
    z, y = overconfident(30, 3, seed=8)
    analysis = analyse_calibration(z[:29], y[:29], z[29:], y[29:], "logits", FAST)
    for _, metrics in analysis.evaluation.present():
        assert metrics.n_samples == 1
        assert 0 <= metrics.ece <= 1 and metrics.ece == metrics.mce


def test_a_stage_with_the_wrong_calibrator_is_refused() -> None:
    z, y = overconfident(20, 3, seed=9)
    with pytest.raises(InputError, match="stage ts needs method 'temperature'"):
        evaluate_calibrators(
            z, y, "logits", {"ts": Calibrator("focal-temperature", 2.0, 1.0)},
            CalibrationSettings("none"),
        )  # fmt: skip
    with pytest.raises(InputError, match="unknown stage"):
        evaluate_calibrators(
            z, y, "logits", {"temperature": Calibrator("temperature", 2.0)},
            CalibrationSettings("none"),
        )  # fmt: skip


def test_splits_with_different_class_counts_are_refused() -> None:
    z, y = overconfident(40, 3, seed=10)
    with pytest.raises(InputError, match=r"^fit\.npz: has 4 classes but the evaluation"):
        analyse_calibration(
            torch.randn(10, 4), torch.zeros(10, dtype=torch.int64), z, y, "logits",
            CalibrationSettings("ts"), fit_source="fit.npz",
        )  # fmt: skip


def test_fit_split_and_method_must_agree() -> None:
    z, y = overconfident(40, 3, seed=11)
    with pytest.raises(InputError, match="needs a fit split"):
        analyse_calibration(None, None, z, y, "logits", CalibrationSettings("ts"))
    with pytest.raises(InputError, match="method none: fits nothing"):
        analyse_calibration(z, y, z, y, "logits", CalibrationSettings("none"))
    with pytest.raises(InputError, match="does not describe a fit split"):
        analyse_calibration(z, y, z, y, "logits", CalibrationSettings("ts"), "none")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"method": "no-such-map"}, "method"),
        ({"objective": "brier"}, "objective"),
        ({"focal_objective": "mse"}, "focal_objective"),
        ({"bins": 0}, "bins"),
        ({"edges": "both"}, "edges"),
        ({"bootstrap": -1}, "bootstrap"),
        ({"gammas": ()}, "gammas"),
        ({"gammas": (0.0, -1.0)}, "gammas"),
    ],
)
def test_bad_settings_name_the_option(changes: dict[str, object], field: str) -> None:
    # from Python the error names the field; on the command line, the option
    with pytest.raises(InputError) as error:
        CalibrationSettings(**changes)  # type: ignore[arg-type]
    assert error.value.what == field
    with wording(as_option), pytest.raises(InputError) as error:
        CalibrationSettings(**changes)  # type: ignore[arg-type]
    assert error.value.what == "--" + field.replace("_", "-")


def test_gamma_grid_is_sorted_and_deduplicated() -> None:
    assert CalibrationSettings(gammas=(2, 0, 1, 2)).gammas == (0.0, 1.0, 2.0)


def test_caller_tensors_are_not_modified() -> None:
    z, y = overconfident(60, 3, seed=12)
    z_copy, y_copy = z.clone(), y.clone()
    analyse_calibration(z[:30], y[:30], z[30:], y[30:], "logits", FAST)
    assert torch.equal(z, z_copy) and torch.equal(y, y_copy)


def test_val_split_helper_equals_the_explicit_call() -> None:
    from curvcal.calibration.analysis import analyse_val_split

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(60, 4, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, 4, (60,), generator=generator)
    fit_idx, eval_idx = torch.arange(0, 60, 2), torch.arange(1, 60, 2)
    settings = CalibrationSettings(method="ts")
    helper = analyse_val_split(logits, labels, fit_idx, eval_idx, "logits", settings, 0.5, "x")
    explicit = analyse_calibration(
        logits[fit_idx], labels[fit_idx], logits[eval_idx], labels[eval_idx],
        "logits", settings, "val-split", 0.5,
    )  # fmt: skip
    assert to_jsonable(helper) == to_jsonable(explicit)  # (NaN fields defeat ==)
    assert helper.split.n_fit == 30 and helper.split.n_eval == 30
