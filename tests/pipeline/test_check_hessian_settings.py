"""`check` builds its Hessian settings from the policy's keys: a key that is a HessianSettings
field's name sets that field, `eigen_method` sets `method` (the policy's `method` is the
calibration's), `trace` is the switch or the trace method, and an error names the policy's
setting."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from curvcal.errors import InputError
from curvcal.pipeline.check import _hessian_settings
from curvcal.policy.settings import DEFAULTS, Locator, Needs
from curvcal.settings.hessian import HessianSettings

NEED = Needs(predictions=True, ts=True, focal_ts=False, hessian=True, trace=True)


def _where() -> Locator:
    return Locator(SimpleNamespace(path=Path("policy.toml")), {})  # type: ignore[arg-type]


def _settings(**changes: Any) -> dict[str, Any]:
    return {**DEFAULTS, "data": "d.pt", **changes}


def test_policy_keys_set_the_fields_of_their_names() -> None:
    policy = _settings(
        method="ts", eigen_method="power", trace="hutchpp", top_k=2, probes=8, seed=4, tol=1,
        loss="focal", gamma=2, max_iter=50, bins=10,
    )  # fmt: skip
    assert _hessian_settings(policy, NEED, _where()) == HessianSettings(
        top_k=2, method="power", tol=1.0, max_iter=50, trace=True, trace_method="hutchpp",
        probes=8, seed=4, loss="focal", gamma=2.0,
    )  # fmt: skip
    # the calibration's method never reaches the eigenvalue method; a true trace is "auto"
    default = _hessian_settings(_settings(method="both"), NEED, _where())
    assert default.method is None and default.trace_method == "auto"
    assert default == HessianSettings()
    # a policy that gates no trace measures none; `own` is resolved later, per checkpoint
    no_trace = Needs(predictions=False, ts=False, focal_ts=False, hessian=True, trace=False)
    own = _hessian_settings(_settings(loss="own"), no_trace, _where())
    assert own.trace is False and own.loss == "own" and own.gamma is None


def test_an_impossible_value_names_the_policy_setting() -> None:
    where = _where()
    with pytest.raises(InputError) as info:
        _hessian_settings(_settings(top_k=0), NEED, where)
    assert info.value.what == where("top_k") and info.value.why.startswith("top_k must be")
    with pytest.raises(InputError) as info:
        _hessian_settings(_settings(trace="hutchpp", probes=3), NEED, where)
    assert info.value.what == where("probes") and "≥ 4" in info.value.why
    with pytest.raises(InputError) as info:
        _hessian_settings(_settings(eigen_method="power", max_iter=0), NEED, where)
    assert info.value.what == where("max_iter")
