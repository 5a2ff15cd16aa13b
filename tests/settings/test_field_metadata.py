"""Each settings field says whether a policy may set it (and by which key) and whether
``curvcal study`` takes it; the policy's keys and study's options are gathered from that, so a
field added without saying is refused here rather than left out of a list by accident."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from curvcal.policy import keys
from curvcal.settings.fields import Settings, setting, settings_fields, study_fields
from curvcal.settings.hessian import HessianSettings
from curvcal.settings.study import STUDY_HESSIAN_OPTIONS


@pytest.mark.parametrize("cls", keys.POLICY_CLASSES, ids=lambda cls: cls.__name__)
def test_every_field_says_whether_a_policy_may_set_it(cls: type[Settings]) -> None:
    unsaid = [field.name for field, spec in settings_fields(cls) if spec.policy is None]
    assert unsaid == [], f"{cls.__name__}: give these fields policy=True, False or their keys"


def test_every_hessian_field_says_whether_study_takes_it() -> None:
    unsaid = [field.name for field, spec in settings_fields(HessianSettings) if spec.study is None]
    assert unsaid == [], "give these fields study=True or False"


def test_the_gathered_keys_are_the_ones_a_check_has_always_shown_in_its_order() -> None:
    """The keys and the fields they set, as they were listed by hand before (the order of a
    check's report; ``seed`` sets both seeds, ``trace`` the trace and its method)."""
    assert list(keys.KEYS) == list(keys.SHOWN_ORDER)
    assert keys.KEYS["seed"] == (
        (keys.CalibrationSettings, "seed"),
        (HessianSettings, "seed"),
    )
    assert keys.KEYS["trace"] == ((HessianSettings, "trace"), (HessianSettings, "trace_method"))
    assert keys.KEYS["eigen_method"] == ((HessianSettings, "method"),)
    assert keys.KEYS["fit_data"] == keys.KEYS["data"] == ((keys.DataSettings, "data"),)
    assert keys.KEYS["method"] == ((keys.CalibrationSettings, "method"),)  # the maps, not eigen


@dataclass(frozen=True)
class _Extra(Settings):
    GROUP: ClassVar[str] = "extra"

    shown: int = setting(1, "A key of its own.", policy=True)
    aliased: int = setting(2, "Set by another key.", policy=("other_name",))
    hidden: int = setting(3, "Not for a policy.", policy=False)


def test_a_new_field_gets_its_key_after_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "POLICY_CLASSES", (*keys.POLICY_CLASSES, _Extra))
    gathered = keys.policy_keys()
    assert list(gathered)[-2:] == ["shown", "other_name"]
    assert gathered["other_name"] == ((_Extra, "aliased"),)
    assert "hidden" not in gathered and list(gathered)[:-2] == list(keys.SHOWN_ORDER)


def test_study_takes_the_hessian_fields_that_say_so() -> None:
    assert study_fields(HessianSettings) == STUDY_HESSIAN_OPTIONS
    assert STUDY_HESSIAN_OPTIONS == ("method", "tol", "max_iter", "probes", "seed", "loss", "gamma")
