"""Calibration of a model run in bfloat16 or float16: its logits are promoted to float64 before
the softmax, and ``curvcal calibrate --dtype bfloat16|float16`` gives metrics and a temperature
within stated tolerances of float32 on the bundled digits model."""

from __future__ import annotations

import json

import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.calibration.inputs import log_probabilities

#: |Δ| against float32 allowed for each dtype: (ECE, NLL relative, Brier, temperature relative).
#: Measured on the bundled digits model (399 evaluation samples): bf16 ΔECE 2.1e-4, NLL 5e-4
#: relative, ΔBrier 1.5e-4, T 2e-4 relative; fp16 ΔECE 2e-6, NLL 3e-4, ΔBrier 4e-7, T 2e-5.
TOLERANCES = {"bfloat16": (0.005, 0.01, 0.002, 0.01), "float16": (0.001, 0.002, 0.0005, 0.002)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_logits_meet_the_softmax_in_float64(dtype: torch.dtype) -> None:
    """A margin of 40 saturates a 16-bit softmax (p_y rounds to 1); promoted first, the log
    probability of the other classes is the float64 one of the same logits."""
    logits = torch.tensor([[40.0, 0.0, -3.0], [0.5, 0.25, 0.0]]).to(dtype)
    assert float(torch.softmax(logits, dim=1)[0, 0]) == 1.0
    log_probs = log_probabilities(logits, "logits", "test")
    assert log_probs.dtype == torch.float64
    expected = torch.log_softmax(logits.to(torch.float64), dim=1)
    assert torch.allclose(log_probs, expected, rtol=0, atol=1e-12)
    assert float(log_probs[0, 1]) == pytest.approx(-40.0, rel=1e-12)


def _calibrate(run_cli, dtype: str) -> dict:
    result = run_cli(
        "calibrate", demo_checkpoint(), "--data", "curvcal:digits", "--val-split", "0.5",
        "--method", "ts", "--seed", "0", "--dtype", dtype, "--json",
    )  # fmt: skip
    assert result.code == 0, result.output
    return json.loads(result.stdout)["results"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_calibrate_in_half_precision_matches_float32(run_cli, dtype: str) -> None:
    wide, half = _calibrate(run_cli, "float32"), _calibrate(run_cli, dtype)
    ece, nll, brier, temperature = TOLERANCES[dtype]
    for state in ("uncalibrated", "ts"):
        a, b = wide["evaluation"][state], half["evaluation"][state]
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=2 / a["n_samples"])
        assert abs(a["ece"] - b["ece"]) <= ece
        assert abs(a["nll"] - b["nll"]) <= nll * a["nll"]
        assert abs(a["brier"] - b["brier"]) <= brier
    t_wide, t_half = wide["fits"]["ts"]["temperature"], half["fits"]["ts"]["temperature"]
    assert abs(t_half - t_wide) <= temperature * t_wide
