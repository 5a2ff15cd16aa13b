"""A check's stop during inference keeps the reason it stopped for: it names the checkpoint
(the policy, not an option, named the data) and says what went wrong, NaN or a wrong shape."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from curvcal.errors import NumericalError
from curvcal.pipeline import calibration as calibration_pipeline
from curvcal.pipeline.check import _predict


@pytest.mark.parametrize(
    "why",
    [
        "batch 1: expected logits of shape (4, classes), got (1, 3)",
        "the model's logits are NaN or Inf for 2 of 8 samples, the first being sample 3",
    ],
)
def test_the_reason_survives_and_the_checkpoint_is_named(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stops(*args: Any, **kwargs: Any) -> Any:
        raise NumericalError("model output", why, "check the model")

    monkeypatch.setattr(calibration_pipeline, "predict_with_features", stops)
    loaded = SimpleNamespace(path=Path("m.safetensors"))
    data = SimpleNamespace(spec="d.pt")
    with pytest.raises(NumericalError) as caught:
        _predict(None, loaded, data, 8, "--data", "error", False, False)  # type: ignore[arg-type]
    error = caught.value
    assert error.what == "m.safetensors"
    assert error.why == f"on --data d.pt: {why}"
    assert "NaN" not in error.why or "NaN" in why
    assert error.hint == "check the model"
