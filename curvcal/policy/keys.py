"""The keys a policy's ``[settings]`` may hold: fields of the settings classes, by their names.

A key is the name of the field it sets, and takes that field's type, range, choices and default
(:mod:`curvcal.settings.fields`); each field says whether a policy may set it, and by which key
(``policy=`` of :func:`~curvcal.settings.fields.setting`), and :data:`KEYS` is gathered from
them. Only where
two classes share a name, or a key is ``check``'s own, does a key name another field:

- ``seed`` sets both seeds (the calibration's split and bootstrap, the Hessian's probes);
- ``eigen_method`` sets the Hessian's ``method`` (``method`` is the calibration's);
- ``trace`` is true, false or a trace method: the Hessian's ``trace`` and ``trace_method``;
- ``fit_data`` is the dataset spec (``data``) of the data the maps are fitted on.

``params`` is a glob or a list of them; ``resize`` and ``crop`` a size or ``"none"``, as their
options take.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.check import CheckSettings
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import NO_RESIZE, DataSettings
from curvcal.settings.fields import (
    Settings,
    Spec,
    default_of,
    field_kind,
    field_policy_keys,
    settings_fields,
    spelled_now,
)
from curvcal.settings.hessian import MAX_SEED, HessianSettings

#: a settings class and the name of one of its fields
Target = tuple[type[Settings], str]


#: the settings classes whose fields a policy may set (:attr:`~curvcal.settings.fields.Spec.policy`),
#: in the order their keys are gathered
POLICY_CLASSES: tuple[type[Settings], ...] = (
    CheckpointSettings,
    DataSettings,
    CalibrationSettings,
    CheckSettings,
    HessianSettings,
)

#: The order in which a check resolves and shows the keys, as it was when they were listed by
#: hand (the fields' own order differs: ``max_samples``, ``fit_data`` and the calibration's keys
#: would move, and with them every report's ``settings``). A key not named here follows these,
#: in the order of the fields that declare it.
SHOWN_ORDER = (
    "arch", "arch_kwargs", "num_classes", "state_dict_key", "device", "dtype",
    "data", "data_root", "max_samples", "mean", "std", "resize", "crop",
    "x_key", "y_key", "text_key", "label_key", "text_pair_key", "tokenizer", "max_length",
    "batch_size", "prompt_key", "choices_key", "choices", "template", "choice_delimiter",
    "choice_score", "fit_data", "val_split", "seed", "bins", "edges", "method", "objective",
    "focal_objective", "gammas", "nan_policy", "bootstrap", "histogram_bins", "histogram_scheme",
    "laplace_structure", "laplace_predictive", "laplace_samples", "laplace_prior", "judge",
    "top_k", "eigen_method", "tol", "max_iter", "probes", "trace", "loss", "gamma", "params",
    "memory_budget",
)  # fmt: skip


def policy_keys() -> dict[str, tuple[Target, ...]]:
    """Every key of ``[settings]`` with the fields it sets, gathered from the fields' own
    :attr:`~curvcal.settings.fields.Spec.policy` over :data:`POLICY_CLASSES`, in
    :data:`SHOWN_ORDER`."""
    found: dict[str, list[Target]] = {}
    for cls in POLICY_CLASSES:
        for field, spec in settings_fields(cls):
            for key in field_policy_keys(field, spec):
                found.setdefault(key, []).append((cls, field.name))
    rank = {key: index for index, key in enumerate(SHOWN_ORDER)}
    ordered = sorted(found, key=lambda key: rank.get(key, len(rank)))  # stable: new keys last
    return {key: tuple(found[key]) for key in ordered}


#: Every key of ``[settings]``, in the order a check resolves and shows them, with the fields
#: it sets.
KEYS: dict[str, tuple[Target, ...]] = policy_keys()

#: ``trace``'s words: a trace method (``--trace-method``'s choices), or true/false
TRACE_KEY = "trace"
#: keys that take a size or ``"none"`` (kept as :data:`~curvcal.settings.data.NO_RESIZE`)
SIZE_KEYS = ("resize", "crop")
#: keys that take a string or a list of strings (one string is a list of one)
STRINGS_KEYS = ("params", "choices")


def field_value(key: str, value: Any) -> Any:
    """A policy's value of ``key`` as its field holds it: ``"none"`` of a size as
    :data:`~curvcal.settings.data.NO_RESIZE`, one glob of ``params`` as a list of one, a list
    of numbers as floats."""
    if key in SIZE_KEYS and isinstance(value, str) and value.strip().lower() == "none":
        return NO_RESIZE
    if key in STRINGS_KEYS and isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(_number_in(v, None, None, False, False) for v in value):
        return [float(v) for v in value]
    return value


def field_of(target: Target) -> tuple[dataclasses.Field[Any], Spec]:
    """The field and spec of ``(class, field name)``."""
    cls, name = target
    for field, spec in settings_fields(cls):
        if field.name == name:
            return field, spec
    raise KeyError(name)


def key_of(cls: type[Settings]) -> dict[str, str]:
    """``{field name: policy key}`` of the fields of ``cls`` a policy sets (the first key that
    sets it: ``data`` rather than ``fit_data``, which sets the fit data's)."""
    named: dict[str, str] = {}
    for key, targets in KEYS.items():
        for c, name in targets:
            if c is cls:
                named.setdefault(name, key)
    return named


def default(key: str) -> Any:
    """The default of ``key``: its field's (``gammas``: ``None``, the class's grid)."""
    if key == "gammas":
        return None
    return default_of(field_of(KEYS[key][0])[0])


def choices(key: str) -> tuple[str, ...] | None:
    """The words ``key`` takes (its field's choices), or ``None`` where any value of its type
    goes (``trace``'s words are :func:`trace_methods`)."""
    if key == TRACE_KEY:
        return None
    return field_of(KEYS[key][0])[1].choices


def spelled_key_value(key: str, value: Any, said: str) -> Any:
    """``value`` of ``key`` in today's spelling: a former word of a field it sets
    (:attr:`~curvcal.settings.fields.Spec.former_words`; ``trace``: of ``trace_method``) read
    as today's, with a :class:`~curvcal.errors.FormerSpellingWarning` naming ``said``."""
    targets = ((HessianSettings, "trace_method"),) if key == TRACE_KEY else KEYS[key]
    for cls, name in targets:
        value = spelled_now(cls, name, value, said, stacklevel=4)
    return value


def trace_methods() -> tuple[str, ...]:
    """The trace methods ``trace`` may name: ``--trace-method``'s choices."""
    choices = field_of((HessianSettings, "trace_method"))[1].choices
    assert choices is not None
    return choices


# --------------------------------------------------------------------------- a value's kind


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a key's value must be, as a policy file writes it: ``base`` (``str``, ``int``,
    ``float``, ``dict``, ``list``, or ``str|bool``), the range (the tightest of its fields';
    whole numbers at most 2**63-1 in any case), and the words for it."""

    base: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def text(self) -> str:
        if self.base == "str":
            return "a string"
        if self.base == "dict":
            return "a table"
        if self.base == "str|bool":
            return "a string or true/false"
        if self.base == "strs":
            return "a string or a non-empty list of strings"
        if self.base == "size":
            return 'a whole number >= 1 or "none"'
        if self.base == "list":
            low = "" if self.low is None else f" >= {_number(self.low)}"
            return f"a non-empty list of numbers{low}"
        if self.base == "int":
            text = f"a whole number >= {_number(self.low or 0)}"
            if self.high is None:
                return text
            return f"{text} and <= {'2**63-1' if self.high == MAX_SEED else _number(self.high)}"
        if self.low_open and self.high_open and self.low is not None and self.high is not None:
            return f"a number between {_number(self.low)} and {_number(self.high)} (exclusive)"
        if self.low is not None:
            return f"a number {'>' if self.low_open else '>='} {_number(self.low)}"
        return "a number"

    def accepts(self, value: Any) -> bool:
        if self.base == "str":
            return isinstance(value, str)
        if self.base == "dict":
            return isinstance(value, dict)
        if self.base == "str|bool":
            return isinstance(value, str | bool)
        if self.base == "strs":
            strings = (
                isinstance(value, list)
                and bool(value)
                and all(isinstance(item, str) for item in value)
            )
            return isinstance(value, str) or strings
        if self.base == "size":
            if isinstance(value, str):
                return value.strip().lower() == "none"
            return _number_in(value, 1, MAX_SEED, False, False) and isinstance(value, int)
        if self.base == "list":
            return (
                isinstance(value, list)
                and bool(value)
                and all(_number_in(item, self.low, None, False, False) for item in value)
            )
        if self.base == "int":
            whole = isinstance(value, int) and not isinstance(value, bool)
            low = -MAX_SEED - 1 if self.low is None else self.low
            high = MAX_SEED if self.high is None else self.high
            return whole and low <= value <= high
        return _number_in(value, self.low, self.high, self.low_open, self.high_open)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer a float cannot hold
        return False


def _number_in(
    value: Any, low: float | None, high: float | None, low_open: bool, high_open: bool
) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        return False
    if low is not None and (value <= low if low_open else value < low):
        return False
    return not (high is not None and (value >= high if high_open else value > high))


def _base(target: Target) -> str:
    kind, _optional = field_kind(target[0], target[1])
    if kind in (str, Path) or kind is object:
        return "str"
    if kind is dict:
        return "dict"
    if kind is tuple:
        return "list"
    return {int: "int", float: "float", bool: "str|bool"}[kind]


def kind(key: str) -> Kind:
    """What ``key``'s value must be: its fields' type and declared range (the tightest where
    it sets two). ``trace`` is a string or true/false."""
    if key == TRACE_KEY:
        return Kind("str|bool")
    if key in SIZE_KEYS:
        return Kind("size")
    if key in STRINGS_KEYS:
        return Kind("strs")
    targets = KEYS[key]
    specs = [field_of(target)[1] for target in targets]
    lows = [s for s in specs if s.low is not None]
    highs = [s for s in specs if s.high is not None]
    low = max(lows, key=lambda s: (s.low, s.low_open)) if lows else None
    high = min(highs, key=lambda s: (s.high, not s.high_open)) if highs else None
    return Kind(
        _base(targets[0]),
        low=None if low is None else low.low,
        high=None if high is None else high.high,
        low_open=bool(low and low.low_open),
        high_open=bool(high and high.high_open),
    )


def kinds() -> Mapping[str, Kind]:
    """Every key's :class:`Kind`."""
    return {key: kind(key) for key in KEYS}
