"""A policy's evaluation settings and what its rules need measured.

A setting's value comes from the command line first, then the policy's ``[settings]``, then
:data:`DEFAULTS` (the defaults of the fields the keys set, :mod:`curvcal.policy.keys`);
:func:`settings_of` builds a settings class from them, checking each value through its field
first so that an error names where the value came from (the option, or the policy's line).
:func:`needs` says which measurements the rules call for, so that a check measures nothing
more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from curvcal.errors import InputError
from curvcal.policy import keys
from curvcal.policy.parse import CALIBRATION_METRICS, STAGES, Policy, Rule, setting_location
from curvcal.settings.fields import Settings, field_kind, from_mapping, option_name

S = TypeVar("S", bound=Settings)

#: Every evaluation setting ``check`` reads, with its default (``None``: unset): the default of
#: the field it sets (:mod:`curvcal.policy.keys`).
DEFAULTS: dict[str, Any] = {key: keys.default(key) for key in keys.KEYS}


@dataclass(frozen=True)
class Needs:
    """What a policy's rules need measured."""

    predictions: bool
    ts: bool
    focal_ts: bool
    hessian: bool
    trace: bool
    linear: tuple[str, ...] = ()
    """The maps other than TS and focal TS gated (``vector``, ``matrix``, ``histogram``, …),
    by stage."""

    @property
    def method(self) -> str:
        """The calibration maps to fit, spelled as ``--method`` spells them (``all`` when the
        rules gate maps that no narrower method fits together)."""
        if self.linear and (len(self.linear) > 1 or self.ts or self.focal_ts):
            return "all"
        if self.linear:
            return _option(self.linear[0])
        if self.ts and self.focal_ts:
            return "both"
        if self.ts:
            return "ts"
        return "focal-ts" if self.focal_ts else "none"


def needs(rules: tuple[Rule, ...] | list[Rule], where: str = "policy") -> Needs:
    """The measurements ``rules`` need (nothing more); ``where`` names the policy."""
    stages = {rule.stage for rule in rules if rule.metric in CALIBRATION_METRICS}
    metrics = {rule.metric for rule in rules}
    ts = "ts" in stages or "temperature" in metrics
    focal = "focal_ts" in stages or bool({"focal_gamma", "focal_temperature"} & metrics)
    trace = "trace" in metrics
    linear = tuple(stage for stage in STAGES[3:] if stage in stages)
    return Needs(
        predictions=bool(stages) or ts or focal,
        ts=ts,
        focal_ts=focal,
        hessian=trace or "lambda_max" in metrics,
        trace=trace,
        linear=linear,
    )


def resolve_settings(
    policy: Policy, overrides: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings a check uses and where each came from: ``overrides`` (command-line
    options) win over the policy's ``[settings]``, which win over :data:`DEFAULTS`."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise InputError("overrides", f"unknown settings {sorted(unknown)}")
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, default in DEFAULTS.items():
        if name in overrides and overrides[name] is not None:
            settings[name], sources[name] = overrides[name], "option"
        elif name in policy.settings:
            settings[name], sources[name] = policy.settings[name], "policy"
        else:
            settings[name], sources[name] = default, "default"
    return settings, sources


class Locator:
    """Names where a setting came from, for error messages: the option, or the policy line."""

    def __init__(self, policy: Policy, sources: Mapping[str, str]) -> None:
        self.policy = policy
        self.sources = sources

    def __call__(self, name: str) -> str:
        source = self.sources.get(name)
        if source == "option":
            return "--" + name.replace("_", "-")
        if source == "policy":
            return setting_location(self.policy, name)
        return f"{self.policy.path} (default {name} = {DEFAULTS.get(name)!r})"

    def of(self, cls: type[Settings]) -> Callable[[str], tuple[str, str] | None]:
        """Where each field of ``cls`` came from, by field name: the place of the policy key
        that set it and the key's name (``None`` for a field no key sets: the code set it)."""
        named = keys.key_of(cls)

        def where(field: str) -> tuple[str, str] | None:
            key = named.get(field)
            return None if key is None else (self(key), key)

        return where

    def option_errors(self, cls: type[Settings]) -> Callable[[InputError], InputError]:
        """For the errors a loader raises about the value of a field of ``cls`` (naming its
        option, ``--device``): the same error at the policy's line when the policy set that
        value, not the option the user never typed; any other error as it is."""
        policy_set = {
            option_name(field): self(key)
            for field, key in keys.key_of(cls).items()
            if self.sources.get(key) == "policy"
        }

        def readdress(error: InputError) -> InputError:
            where = policy_set.get(error.what)
            return error if where is None else type(error)(where, error.why, error.hint)

        return readdress


def overrides_of(cls: type[Settings], typed: Mapping[str, Any]) -> dict[str, Any]:
    """The policy keys that options of ``cls``'s fields typed on the command line set,
    ``{key: value}`` (fields no key sets are left out)."""
    named = keys.key_of(cls)
    return {named[field]: value for field, value in typed.items() if field in named}


def settings_of(cls: type[S], settings: Mapping[str, Any], where: Locator, **fixed: Any) -> S:
    """The ``cls`` settings of a check: each field a policy key sets takes that key's value
    (unset keys: the field's default), ``fixed`` the rest; every value is checked against its
    field before the object is built, an error naming the option or the policy line and the
    key (``probes must be an integer ≥ 4, got 1``)."""
    values: dict[str, Any] = {}
    for field, key in keys.key_of(cls).items():
        value = settings[key]
        if key == keys.TRACE_KEY:  # true/false, or a trace method (which means true)
            if field == "trace_method" and not isinstance(value, str):
                continue
            value = value if field == "trace_method" else value is not False
        if value is None and not field_kind(cls, field)[1]:
            continue  # unset: the field's default
        values[field] = keys.field_value(key, value)
    return from_mapping(cls, values, where.of(cls), **fixed)


def check_choices(settings: Mapping[str, Any], where: Locator) -> None:
    """Each setting that takes words against its field's choices (``trace``: true, false or
    a trace method), and the settings that exclude each other."""
    for name in keys.KEYS:
        choices, value = keys.choices(name), settings[name]
        if choices and value is not None and value not in choices:
            raise InputError(
                where(name),
                f"{name} {value!r} is not one of {', '.join(choices)}",
            )
    trace, methods = settings["trace"], keys.trace_methods()
    if isinstance(trace, str) and trace not in methods:
        raise InputError(
            where("trace"),
            f"trace {trace!r} is not true, false, {' or '.join(methods)}",
        )
    if settings["fit_data"] is not None and settings["val_split"] is not None:
        raise InputError(
            where("val_split"),
            f"val_split and fit_data ({where('fit_data')}) are both set: the maps are fitted "
            "on fit_data, or on a split of data, not both",
            "keep one of them",
        )


def calibration_method(settings: Mapping[str, Any], need: Needs, where: Locator) -> str:
    """The maps to fit: ``method`` when set (it must fit every stage the rules gate), else
    exactly the maps the rules need."""
    given = settings["method"]
    if given is None:
        return need.method
    fits_ts = given in ("ts", "both", "all")
    fits_focal = given in ("focal-ts", "both", "all")
    missing = [
        name
        for name, needed, fitted in (
            ("ts", need.ts, fits_ts),
            ("focal_ts", need.focal_ts, fits_focal),
            *((stage, True, given in (_option(stage), "all")) for stage in need.linear),
        )
        if needed and not fitted
    ]
    if missing:
        raise InputError(
            where("method"),
            f"method {given!r} fits no {' or '.join(missing)} map, which the policy gates",
            f'use method = "{need.method}" or leave method out'
            if need.linear
            else 'use method = "both" or leave method out',
        )
    return str(given)


def _option(stage: str) -> str:
    """The ``--method`` spelling of a stage (``histogram_ovr``: ``histogram-ovr``)."""
    return stage.replace("_", "-")
