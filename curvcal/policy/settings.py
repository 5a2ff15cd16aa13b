"""A policy's evaluation settings and what its rules need measured.

A setting's value comes from the command line first, then the policy's ``[settings]``, then
:data:`DEFAULTS`; errors about a value name where it came from (the option, or the policy's
line). :func:`needs` says which measurements the rules call for, so that a check measures
nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from curvcal.errors import InputError
from curvcal.policy.parse import CALIBRATION_METRICS, Policy, Rule, setting_location
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.fields import defaults, settings_fields

#: The calibration settings a policy may set: fields of
#: :class:`~curvcal.settings.calibration.CalibrationSettings`, whose defaults and choices they
#: take (``gammas`` too, but unset by default: the class's grid).
CALIBRATION_KEYS = ("val_split", "seed", "bins", "edges", "method", "objective", "focal_objective")
_CALIBRATION_DEFAULTS = defaults(CalibrationSettings)
_CALIBRATION_CHOICES = {
    field.name: spec.choices
    for field, spec in settings_fields(CalibrationSettings)
    if spec.choices is not None
}

#: Every evaluation setting ``check`` reads, with its default (``None``: unset).
DEFAULTS: dict[str, Any] = {
    "arch": None,
    "arch_kwargs": {},
    "num_classes": None,
    "state_dict_key": None,
    "device": "auto",
    "dtype": "float32",
    "data": None,
    "data_root": None,
    "max_samples": None,
    "text_key": "text",
    "label_key": "label",
    "text_pair_key": None,
    "tokenizer": None,
    "max_length": None,
    "batch_size": 256,
    "fit_data": None,
    **{name: _CALIBRATION_DEFAULTS[name] for name in CALIBRATION_KEYS},
    "gammas": None,
    "top_k": 1,
    "eigen_method": None,
    "tol": 1e-4,
    "max_iter": None,
    "probes": 100,
    "trace": True,
    "loss": "ce",
    "gamma": None,
}

# Settings whose value must be one of a few words.
_CHOICES: dict[str, tuple[str, ...]] = {
    "device": (),  # checked by the loader (auto, cpu, cuda, cuda:N)
    "dtype": ("float32", "float64"),
    **{
        name: _CALIBRATION_CHOICES[name]
        for name in CALIBRATION_KEYS
        if name in _CALIBRATION_CHOICES
    },
    "eigen_method": ("power", "lanczos"),
    "loss": ("ce", "focal", "own"),
}

#: the ``trace`` setting's method names, ``--trace-method``'s (held equal to
#: ``curvcal.choices.TRACE_METHODS`` by a test: a policy imports no other part of curvcal)
TRACE_METHODS = (
    "auto",
    "gauss-newton",
    "gauss-newton+hutchpp",
    "gauss-newton+xtrace",
    "hutchpp",
    "xtrace",
    "hutchinson",
)


@dataclass(frozen=True)
class Needs:
    """What a policy's rules need measured."""

    predictions: bool
    ts: bool
    focal_ts: bool
    hessian: bool
    trace: bool

    @property
    def method(self) -> str:
        """The calibration maps to fit, spelled as ``--method`` spells them."""
        if self.ts and self.focal_ts:
            return "both"
        if self.ts:
            return "ts"
        return "focal-ts" if self.focal_ts else "none"


def needs(rules: tuple[Rule, ...] | list[Rule]) -> Needs:
    """The measurements ``rules`` need (nothing more)."""
    stages = {rule.stage for rule in rules if rule.metric in CALIBRATION_METRICS}
    metrics = {rule.metric for rule in rules}
    ts = "ts" in stages or "temperature" in metrics
    focal = "focal_ts" in stages or bool({"focal_gamma", "focal_temperature"} & metrics)
    trace = "trace" in metrics
    return Needs(
        predictions=bool(stages) or ts or focal,
        ts=ts,
        focal_ts=focal,
        hessian=trace or "lambda_max" in metrics,
        trace=trace,
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


def check_choices(settings: Mapping[str, Any], where: Locator) -> None:
    for name, choices in _CHOICES.items():
        value = settings[name]
        if choices and value is not None and value not in choices:
            raise InputError(
                where(name),
                f"{name} {value!r} is not one of {', '.join(choices)}",
            )
    trace = settings["trace"]
    if isinstance(trace, str) and trace not in TRACE_METHODS:
        raise InputError(
            where("trace"),
            f"trace {trace!r} is not true, false, {' or '.join(TRACE_METHODS)}",
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
    fits_ts, fits_focal = given in ("ts", "both"), given in ("focal-ts", "both")
    missing = [
        name
        for name, needed, fitted in (
            ("ts", need.ts, fits_ts),
            ("focal_ts", need.focal_ts, fits_focal),
        )
        if needed and not fitted
    ]
    if missing:
        raise InputError(
            where("method"),
            f"method {given!r} fits no {' or '.join(missing)} map, which the policy gates",
            'use method = "both" or leave method out',
        )
    return str(given)
