"""The library behind ``curvcal check``: measure what a policy gates, and judge it.

:func:`run_check` reads the evaluation settings (command-line overrides first, then the policy's
``[settings]``, then the defaults of :data:`DEFAULTS`), loads the checkpoint and the data with
the ordinary loaders, and measures **only what the rules need** (see :func:`needs`):

* calibration metrics of the uncalibrated model: one inference pass, no fit (every sample of
  ``data`` is evaluated, as ``curvcal calibrate --method none`` does);
* any ``ts.*`` metric or ``temperature``: a temperature-scaling fit; any ``focal_ts.*`` metric,
  ``focal_gamma`` or ``focal_temperature``: a focal-temperature-scaling fit. Maps are fitted on a
  stratified ``val_split`` of ``data`` (default 0.5) or on ``fit_data``, and every stage is then
  measured on the evaluation split only, as ``curvcal calibrate`` does;
* ``lambda_max``: the Hessian's top eigenvalues (``top_k``, default 1), without the trace;
  ``trace``: the Hutchinson trace as well (the analysis always finds λmax, so a trace-only policy
  costs one extra eigenvalue search at ``top_k`` 1).

Values are read from the analyses through :func:`curvcal.check.metric_values`, the same table
that reads saved reports, so ``check`` and ``compare`` judge the same numbers. Nothing here
prints; progress goes through the ``on_step`` hook.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.check import (
    CALIBRATION_METRICS,
    MetricValue,
    Policy,
    Rule,
    Verdict,
    evaluate,
    metric_values,
    setting_location,
)
from curvcal.errors import InputError, NumericalError
from curvcal.results import to_jsonable

if TYPE_CHECKING:
    import torch

    from curvcal.calibration.analysis import CalibrationAnalysis, CalibrationSettings
    from curvcal.curvature.analysis import HessianSettings
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.load.checkpoint import LoadedModel
    from curvcal.load.data import LoadedData

DEFAULT_VAL_SPLIT = 0.5

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
    "batch_size": 256,
    "fit_data": None,
    "val_split": None,
    "seed": 0,
    "bins": 15,
    "edges": "left",
    "method": None,
    "objective": "nll",
    "focal_objective": "ece",
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
    "edges": ("left", "right"),
    "method": ("ts", "focal-ts", "both", "none"),
    "objective": ("nll", "ece", "adaece"),
    "focal_objective": ("ece", "nll", "adaece"),
    "eigen_method": ("power", "lanczos"),
    "loss": ("ce", "focal", "own"),
}
_TRACE_METHODS = ("hutchpp", "xtrace", "hutchinson")

OnStep = Callable[[str, int], None]
"""Progress: the stage (``inference``, ``calibration``, ``hessian:<stage>``) and a count."""


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


@dataclass(frozen=True)
class CheckResult:
    """A policy judged on a checkpoint.

    ``verdict``: every bound's row; ``values``: the gated metrics measured (key as
    :attr:`~curvcal.check.Rule.key`); ``hessian``/``calibration``: the analyses that produced
    them (``None`` when the policy needed none); ``settings``: the evaluation settings used and
    ``sources``: where each came from (``option``, ``policy`` or ``default``); ``nonfinite``: the
    gated metrics whose value came out NaN or infinite (a numerical failure); ``unconverged``:
    the Hessian estimates that missed their tolerance; ``warnings``: messages for the user;
    ``inputs``: the checkpoint and data as loaded; ``timings``: wall seconds by stage (``load``,
    ``calibration``, ``hessian``).
    """

    verdict: Verdict
    values: dict[str, MetricValue]
    hessian: HessianAnalysis | None
    calibration: CalibrationAnalysis | None
    settings: dict[str, Any]
    sources: dict[str, str]
    nonfinite: tuple[str, ...] = ()
    unconverged: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    inputs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict[str, Any]:
        """The ``results`` of a check report: ``passed`` and ``rows`` (what ``compare`` and a
        later ``--baseline`` read), ``values``, ``nonfinite``, ``unconverged``, ``sources``,
        and the ``hessian`` and ``calibration`` analyses in their own layouts."""
        return {
            "passed": self.verdict.passed,
            "rows": self.verdict.rows,
            "values": {
                key: {"value": value.value, "interval": value.interval}
                for key, value in sorted(self.values.items())
            },
            "nonfinite": list(self.nonfinite),
            "unconverged": list(self.unconverged),
            "sources": self.sources,
            "hessian": self.hessian,
            "calibration": self.calibration,
        }


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


def run_check(
    policy: Policy,
    checkpoint: Path,
    overrides: Mapping[str, Any] | None = None,
    baseline: Mapping[str, MetricValue] | None = None,
    *,
    trust: bool = False,
    allow_globals: tuple[str, ...] = (),
    on_step: OnStep | None = None,
) -> CheckResult:
    """Measure what ``policy`` gates on ``checkpoint`` and judge it, with ``baseline`` (the
    values of an earlier report, from :func:`~curvcal.check.metric_values`) for change bounds.

    Raises :class:`InputError` for unusable settings (naming the policy line or the option) and
    files, and :class:`~curvcal.errors.NumericalError` when the Hessian's loss or a product is
    NaN/Inf. A gated metric that comes out non-finite is listed in ``nonfinite`` (its rows fail).
    """
    from curvcal.load.checkpoint import CheckpointOptions, load_model
    from curvcal.load.data import DataOptions, check_labels, load_dataset

    settings, sources = resolve_settings(policy, overrides)
    where = _Locator(policy, sources)
    _check_choices(settings, where)
    need = needs(policy.rules)
    method = _method(settings, need, where)
    if settings["data"] is None:
        raise InputError(
            str(policy.path),
            "no data to measure on",
            'add data = "SPEC" under [settings] or pass --data SPEC',
        )
    hessian_settings = _hessian_settings(settings, need, where) if need.hessian else None
    calibration_settings = (
        _calibration_settings(settings, method, where) if need.predictions else None
    )

    timings: dict[str, float] = {}
    began = time.perf_counter()
    loaded = load_model(
        checkpoint,
        CheckpointOptions(
            arch=settings["arch"],
            arch_kwargs=dict(settings["arch_kwargs"]),
            num_classes=settings["num_classes"],
            state_dict_key=settings["state_dict_key"],
            trust=trust,
            allow_globals=allow_globals,
            device=settings["device"],
            dtype=settings["dtype"],
        ),
    )
    data_options = DataOptions(
        spec=settings["data"],
        root=Path(settings["data_root"]) if settings["data_root"] else None,
        max_samples=settings["max_samples"],
        trust=trust,
    )
    data = load_dataset(data_options)
    check_labels(data, loaded.num_classes)
    inputs: dict[str, Any] = {"checkpoint": loaded.describe(), "data": data.describe()}
    messages: list[str] = []
    timings["load"] = time.perf_counter() - began

    calibration = None
    began = time.perf_counter()
    if calibration_settings is not None:
        fit = None
        if method != "none" and settings["fit_data"] is not None:
            fit = load_dataset(dataclasses.replace(data_options, spec=settings["fit_data"]))
            check_labels(fit, loaded.num_classes)
            inputs["fit_data"] = fit.describe()
        elif method == "none" and (settings["fit_data"] or settings["val_split"]):
            messages.append(
                "the policy gates no calibrated stage, so nothing is fitted: val_split and "
                "fit_data are unused and every sample is evaluated"
            )
        calibration = _calibrate(loaded, data, fit, settings, calibration_settings, method, on_step)
        timings["calibration"] = time.perf_counter() - began

    hessian = None
    if hessian_settings is not None:
        began = time.perf_counter()
        hessian, hessian_messages = _hessian(loaded, data, settings, hessian_settings, on_step)
        messages.extend(hessian_messages)
        timings["hessian"] = time.perf_counter() - began

    values = measured_values(hessian, calibration)
    gated = {rule.key for rule in policy.rules}
    nonfinite = tuple(sorted(key for key in gated if key in values and values[key].value is None))
    verdict = evaluate(policy.rules, values, baseline)
    return CheckResult(
        verdict=verdict,
        values={key: value for key, value in values.items() if key in gated},
        hessian=hessian,
        calibration=calibration,
        settings=settings,
        sources=sources,
        nonfinite=nonfinite,
        unconverged=tuple(hessian.unconverged) if hessian is not None else (),
        warnings=tuple(messages),
        inputs=inputs,
        timings=timings,
    )


def measured_values(
    hessian: HessianAnalysis | None, calibration: CalibrationAnalysis | None
) -> dict[str, MetricValue]:
    """Every gateable metric of these analyses, read through the same path table as a saved
    report (the analyses laid out as ``curvcal demo`` saves them: ``results.hessian`` and
    ``results.calibration``). A non-finite number maps to ``MetricValue(None)``."""
    document = {
        "command": "measurement",
        "results": to_jsonable({"hessian": hessian, "calibration": calibration}),
    }
    return metric_values(document)


# --------------------------------------------------------------------------------------------
# settings


class _Locator:
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


def _check_choices(settings: Mapping[str, Any], where: _Locator) -> None:
    for name, choices in _CHOICES.items():
        value = settings[name]
        if choices and value is not None and value not in choices:
            raise InputError(
                where(name),
                f"{name} {value!r} is not one of {', '.join(choices)}",
            )
    trace = settings["trace"]
    if isinstance(trace, str) and trace not in _TRACE_METHODS:
        raise InputError(
            where("trace"),
            f"trace {trace!r} is not true, false, {' or '.join(_TRACE_METHODS)}",
        )


def _method(settings: Mapping[str, Any], need: Needs, where: _Locator) -> str:
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


def _calibration_settings(
    settings: Mapping[str, Any], method: str, where: _Locator
) -> CalibrationSettings:
    from curvcal.calibration.analysis import CalibrationSettings

    gammas = settings["gammas"]
    try:
        base = CalibrationSettings(
            method=method,
            objective=settings["objective"],
            focal_objective=settings["focal_objective"],
            bins=settings["bins"],
            edges=settings["edges"],
            seed=settings["seed"],
        )
        if gammas is None:
            return base
        return dataclasses.replace(base, gammas=tuple(float(g) for g in gammas))
    except InputError as error:
        name = error.what.lstrip("-").replace("-", "_")
        raise InputError(where(name) if name in DEFAULTS else error.what, error.why) from None


def _hessian_settings(settings: Mapping[str, Any], need: Needs, where: _Locator) -> HessianSettings:
    from curvcal.curvature.analysis import HessianSettings

    trace = settings["trace"]
    if need.trace and trace is False:
        raise InputError(where("trace"), "trace = false, but the policy gates [trace]")
    loss, gamma = settings["loss"], settings["gamma"]
    if loss == "focal" and gamma is None:
        raise InputError(where("loss"), "loss 'focal' needs gamma under [settings]")
    if loss != "focal" and gamma not in (None, 0, 0.0):
        raise InputError(where("gamma"), f"gamma {gamma} is only used with loss 'focal'")
    try:
        return HessianSettings(
            top_k=settings["top_k"],
            method=settings["eigen_method"],
            tol=float(settings["tol"]),
            max_iter=settings["max_iter"],
            trace=need.trace,
            trace_method=trace if isinstance(trace, str) else "hutchpp",
            probes=settings["probes"],
            seed=settings["seed"],
            criterion="ce" if loss == "own" else loss,
            gamma=float(gamma or 0.0),
        )
    except InputError as error:
        renamed = {"method": "eigen_method", "trace_method": "trace", "criterion": "loss"}
        name = renamed.get(error.what, error.what)
        raise InputError(where(name) if name in DEFAULTS else error.what, error.why) from None


# --------------------------------------------------------------------------------------------
# measurements


def _calibrate(
    loaded: LoadedModel,
    data: LoadedData,
    fit: LoadedData | None,
    settings: Mapping[str, Any],
    calibration_settings: CalibrationSettings,
    method: str,
    on_step: OnStep | None,
) -> CalibrationAnalysis:
    """Predict and run the calibration analysis exactly as ``curvcal calibrate`` would."""
    from curvcal.calibration.analysis import analyse_calibration, analyse_val_split
    from curvcal.load.data import stratified_split

    logits, labels = _predict(loaded, data, settings["batch_size"], on_step)
    source = f"data {data.spec}"
    if method == "none":
        return analyse_calibration(
            None, None, logits, labels, "logits", calibration_settings, "none", eval_source=source
        )
    if fit is not None:
        fit_logits, fit_labels = _predict(loaded, fit, settings["batch_size"], on_step)
        return analyse_calibration(
            fit_logits,
            fit_labels,
            logits,
            labels,
            "logits",
            calibration_settings,
            "fit-data",
            fit_source=f"fit_data {fit.spec}",
            eval_source=source,
        )
    fraction = settings["val_split"] or DEFAULT_VAL_SPLIT
    fit_idx, eval_idx = stratified_split(labels, fraction, settings["seed"])
    return analyse_val_split(
        logits,
        labels,
        fit_idx,
        eval_idx,
        "logits",
        calibration_settings,
        fraction,
        f"{source}",
    )


def _predict(
    loaded: LoadedModel, data: LoadedData, batch_size: int, on_step: OnStep | None
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    from curvcal.inference import predict_logits
    from curvcal.load.data import iter_batches

    advance = None if on_step is None else (lambda n: on_step("inference", n))
    logits, labels = predict_logits(
        loaded.module, iter_batches(data.dataset, batch_size), loaded.device, advance
    )
    finite = torch.isfinite(logits).all(dim=1)
    if not bool(finite.all()):
        first = int((~finite).nonzero()[0, 0])
        raise NumericalError(
            str(loaded.path),
            f"the model's logits on data {data.spec} contain NaN or infinity (first at sample "
            f"{first})",
            "check the weights and the input normalisation",
        )
    return logits, labels


def _hessian(
    loaded: LoadedModel,
    data: LoadedData,
    settings: Mapping[str, Any],
    hessian_settings: HessianSettings,
    on_step: OnStep | None,
) -> tuple[HessianAnalysis, list[str]]:
    """The Hessian analysis, with its convergence warnings returned as messages."""
    from curvcal.curvature.analysis import analyse_hessian_with_messages
    from curvcal.load.checkpoint import recorded_loss
    from curvcal.load.data import iter_batches

    if settings["loss"] == "own":
        criterion, gamma = recorded_loss(loaded)
        hessian_settings = dataclasses.replace(hessian_settings, criterion=criterion, gamma=gamma)
    batch_size = settings["batch_size"]

    def batches() -> Any:
        return iter_batches(data.dataset, batch_size)

    hook = None if on_step is None else (lambda stage, n: on_step(f"hessian:{stage}", n))
    return analyse_hessian_with_messages(loaded.module, batches, hessian_settings, on_step=hook)


__all__ = [
    "DEFAULTS",
    "CheckResult",
    "Needs",
    "measured_values",
    "needs",
    "resolve_settings",
    "run_check",
]
