"""``curvcal check``: measure what a policy gates on a checkpoint, and judge it.

:func:`check_checkpoint` is the command's run (read the baseline, measure and judge with
:func:`run_check`, build the report); :func:`run_check` is the library function ``demo`` and
scripts call.

:func:`run_check` reads the evaluation settings (command-line overrides first, then the policy's
``[settings]``, then the defaults of :data:`~curvcal.policy.settings.DEFAULTS`), loads the checkpoint and the data with
the ordinary loaders, and measures **only what the rules need** (see :func:`~curvcal.policy.settings.needs`):

* calibration metrics of the uncalibrated model: one inference pass, no fit (every sample of
  ``data`` is evaluated, as ``curvcal calibrate --method none`` does);
* any ``ts.*`` metric or ``temperature``: a temperature-scaling fit; any ``focal_ts.*`` metric,
  ``focal_gamma`` or ``focal_temperature``: a focal-temperature-scaling fit. Maps are fitted on a
  stratified ``val_split`` of ``data`` (default 0.5) or on ``fit_data``, and every stage is then
  measured on the evaluation split only, as ``curvcal calibrate`` does;
* ``lambda_max``: the Hessian's top eigenvalues (``top_k``, default 1), without the trace;
  ``trace``: the trace as well (``auto``: exact by Gauss–Newton where the model allows it,
  else its Gauss–Newton part exact and Hutch++ on the rest, else Hutch++) (the analysis always finds λmax, so a trace-only policy
  costs one extra eigenvalue search at ``top_k`` 1).

Values are read from the analyses through :func:`curvcal.policy.baseline.metric_values`, the same table
that reads saved reports, so ``check`` and ``compare`` judge the same numbers. Nothing here
prints; progress goes through the ``on_step`` hook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError, NumericalError
from curvcal.policy.baseline import measured_values
from curvcal.policy.evaluate import MetricValue, Verdict, evaluate
from curvcal.policy.parse import Policy
from curvcal.policy.settings import (
    DEFAULTS,
    Locator,
    Needs,
    calibration_method,
    check_choices,
    needs,
    resolve_settings,
)
from curvcal.progress import OnStageStep as OnStep  # stage: inference, calibration, hessian:<stage>
from curvcal.results import STATUS_ERROR, STATUS_FAIL, STATUS_PASS, Report
from curvcal.settings.fields import from_mapping
from curvcal.settings.hessian import HessianSettings

if TYPE_CHECKING:
    import torch

    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.console import Reporter
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.load.loaded_data import LoadedData
    from curvcal.load.loaded_model import LoadedModel
    from curvcal.settings.calibration import CalibrationSettings


@dataclass(frozen=True)
class CheckResult:
    """A policy judged on a checkpoint.

    ``verdict``: every bound's row; ``values``: the gated metrics measured (key as
    :attr:`~curvcal.policy.parse.Rule.key`); ``hessian``/``calibration``: the analyses that produced
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
    values of an earlier report, from :func:`~curvcal.policy.baseline.metric_values`) for change bounds.

    Raises :class:`InputError` for unusable settings (naming the policy line or the option) and
    files, and :class:`~curvcal.errors.NumericalError` when the Hessian's loss or a product is
    NaN/Inf. A gated metric that comes out non-finite is listed in ``nonfinite`` (its rows fail).
    """
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.text import text_model_of
    from curvcal.pipeline.fitness import check_fitness, single_class_warning
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

    settings, sources = resolve_settings(policy, overrides)
    where = Locator(policy, sources)
    check_choices(settings, where)
    need = needs(policy.rules)
    method = calibration_method(settings, need, where)
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
    with _blame_the_setting(where, sources):
        loaded = load_model(
            checkpoint,
            CheckpointSettings(
                arch=settings["arch"],
                arch_kwargs=dict(settings["arch_kwargs"]),
                num_classes=settings["num_classes"],
                state_dict_key=settings["state_dict_key"],
                trust_checkpoint=trust,
                allow_global=allow_globals,
                device=settings["device"],
                dtype=settings["dtype"],
            ),
        )
        data_options = DataSettings(
            data=settings["data"],
            data_root=Path(settings["data_root"]) if settings["data_root"] else None,
            max_samples=settings["max_samples"],
            trust_checkpoint=trust,
            text_key=settings["text_key"],
            label_key=settings["label_key"],
            text_pair_key=settings["text_pair_key"],
            tokenizer=Path(settings["tokenizer"]) if settings["tokenizer"] else None,
            max_length=settings["max_length"],
        )
        data = load_dataset(data_options, loaded.preprocessing, text_model_of(loaded))
    n_classes = check_fitness(loaded, data, "data")
    inputs: dict[str, Any] = {"checkpoint": loaded.describe(), "data": data.describe()}
    messages: list[str] = list(data.warnings)
    if n_classes == 1 and calibration_settings is not None:
        messages.append(single_class_warning(str(checkpoint)))
    fit = None
    if calibration_settings is not None and method != "none" and settings["fit_data"] is not None:
        fit = load_dataset(
            data_options.replace(data=settings["fit_data"]),
            loaded.preprocessing,
            text_model_of(loaded),
        )
        check_fitness(loaded, fit, "fit_data")
        messages.extend(fit.warnings)
        inputs["fit_data"] = fit.describe()
    timings["load"] = time.perf_counter() - began

    calibration = None
    began = time.perf_counter()
    if calibration_settings is not None:
        if method == "none" and (settings["fit_data"] or settings["val_split"]):
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


@dataclass(frozen=True)
class CheckRequest:
    """What ``curvcal check`` was asked: the policy as read, the settings typed on the command
    line (``overrides``), the report to take change bounds from, and the loading flags."""

    checkpoint: Path
    policy: Policy
    overrides: Mapping[str, Any] = field(default_factory=dict)
    baseline: Path | None = None
    trust: bool = False
    allow_globals: tuple[str, ...] = ()
    strict: bool = False


@dataclass(frozen=True)
class CheckRun:
    """A judged check: the ``result``, its ``report``, and the ``failure`` to raise once the
    report is out (a gated metric NaN/Inf, or an unconverged estimate under ``--strict``)."""

    result: CheckResult
    report: Report
    failure: NumericalError | None


def check_checkpoint(request: CheckRequest, reporter: Reporter) -> CheckRun:
    """Read the baseline, measure and judge the policy (progress on ``reporter``), and build
    the report; warnings (the run's, and settings the baseline was computed with differently)
    go to ``reporter``."""
    from curvcal.load.digest import file_info
    from curvcal.policy.baseline import load_report, metric_values, setting_differences
    from curvcal.provenance import environment

    began = time.perf_counter()
    baseline_report = load_report(request.baseline) if request.baseline is not None else None
    with reporter.progress("measuring", None) as advance:
        result = run_check(
            request.policy,
            request.checkpoint,
            request.overrides,
            metric_values(baseline_report) if baseline_report is not None else None,
            trust=request.trust,
            allow_globals=request.allow_globals,
            on_step=lambda _stage, _n: advance(1),
        )
    messages = list(result.warnings)
    if baseline_report is not None:
        messages += [
            f"the baseline was computed with different settings: {difference}"
            for difference in setting_differences({"settings": result.settings}, baseline_report)
        ]
    for message in messages:
        reporter.warn(message)
    failure = None
    if result.nonfinite:
        failure = NumericalError(
            ", ".join(result.nonfinite), "measured value is NaN or infinite", "see the report"
        )
    elif request.strict and result.unconverged:
        failure = NumericalError(
            "--strict",
            f"{', '.join(result.unconverged)} did not converge",
            "raise max_iter or probes, loosen tol, or drop --strict",
        )
    status = STATUS_PASS if result.passed else STATUS_FAIL
    if failure is not None:
        status = STATUS_ERROR
    described: dict[str, Any] = {**result.inputs, "policy": file_info(request.policy.path)}
    if request.baseline is not None:
        described["baseline"] = file_info(request.baseline)
    report = Report(
        command="check",
        results=result,
        status=status,
        inputs=described,
        settings={**result.settings, "rules": request.policy.rules, "strict": request.strict},
        timings={**result.timings, "total": time.perf_counter() - began},
        environment=environment(),
        warnings=messages,
    )
    return CheckRun(result, report, failure)


# --------------------------------------------------------------------------------------------
# settings


def _calibration_settings(
    settings: Mapping[str, Any], method: str, where: Locator
) -> CalibrationSettings:
    from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT
    from curvcal.settings.calibration import CalibrationSettings

    gammas = settings["gammas"]
    fraction = None  # recorded as calibrate records it: the fraction fitted on, if any
    if method != "none" and settings["fit_data"] is None:
        fraction = settings["val_split"] or DEFAULT_VAL_SPLIT
    with _at_the_setting(where):
        base = CalibrationSettings(
            method=method,
            objective=settings["objective"],
            focal_objective=settings["focal_objective"],
            bins=settings["bins"],
            edges=settings["edges"],
            seed=settings["seed"],
            val_split=fraction,
        )
        if gammas is None:
            return base
        return base.replace(gammas=tuple(float(g) for g in gammas))


@contextlib.contextmanager
def _at_the_setting(where: Locator, renamed: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-address a settings kernel's error (``probes: must be ...``, or ``--probes: ...``) to
    where the setting came from, naming the setting: the kernel's message names the value, the
    policy line alone would not say which setting it is. ``renamed``: the kernel's names of
    settings that the policy spells otherwise."""
    try:
        yield
    except InputError as error:
        kernel_name = error.what.lstrip("-").replace("-", "_")
        name = (renamed or {}).get(kernel_name, kernel_name)
        if name not in DEFAULTS:
            raise
        raise InputError(where(name), f"{name} {error.why}", error.hint) from None


@contextlib.contextmanager
def _blame_the_setting(where: Locator, sources: Mapping[str, str]) -> Iterator[None]:
    """Re-address a loader's error about an option (``--device: ...``) to the policy's line
    when the value came from the policy, not from that option."""
    try:
        yield
    except InputError as error:
        option = error.what.split(" ")[0]
        name = option.lstrip("-").replace("-", "_")
        if not option.startswith("--") or name not in DEFAULTS or sources.get(name) != "policy":
            raise
        raise type(error)(where(name), error.why, error.hint) from None


#: policy keys that set a HessianSettings field of another name
_HESSIAN_SPELLING = {"eigen_method": "method"}
#: policy keys named like a HessianSettings field but meaning something else: ``method`` is the
#: calibration's; ``trace`` is true, false or a trace method (``trace_method``)
_NOT_HESSIAN = ("method", "trace")


def _hessian_settings(settings: Mapping[str, Any], need: Needs, where: Locator) -> HessianSettings:
    """The Hessian settings of a policy: each key that is a field's name sets that field
    (:func:`~curvcal.settings.fields.from_mapping`), ``eigen_method`` sets ``method``,
    ``trace`` sets ``trace_method`` when it names one, and the trace is measured when a rule
    gates it."""
    trace = settings["trace"]
    if need.trace and trace is False:
        raise InputError(where("trace"), "trace = false, but the policy gates [trace]")
    loss, gamma = settings["loss"], settings["gamma"]
    if loss == "focal" and gamma is None:
        raise InputError(where("loss"), "loss 'focal' needs gamma under [settings]")
    if loss != "focal" and gamma not in (None, 0, 0.0):
        raise InputError(where("gamma"), f"gamma {gamma} is only used with loss 'focal'")
    values = {key: value for key, value in settings.items() if key not in _NOT_HESSIAN}
    for key, name in _HESSIAN_SPELLING.items():
        values[name] = values.pop(key)
    policy_key = {name: key for key, name in _HESSIAN_SPELLING.items()} | {"trace_method": "trace"}
    with _at_the_setting(where, policy_key):
        return from_mapping(
            HessianSettings,
            values,
            trace=need.trace,
            trace_method=trace if isinstance(trace, str) else "auto",
            tol=float(settings["tol"]),
            gamma=None if loss != "focal" else float(gamma),
        )


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
    from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT, analyse

    logits, labels = _predict(loaded, data, settings["batch_size"], on_step)
    source = f"data {data.spec}"
    if method == "none":
        return analyse(logits, labels, "logits", calibration_settings, source)
    if fit is not None:
        return analyse(
            logits,
            labels,
            "logits",
            calibration_settings,
            source,
            fit=_predict(loaded, fit, settings["batch_size"], on_step),
            fit_source=f"fit_data {fit.spec}",
        )
    fraction = settings["val_split"] or DEFAULT_VAL_SPLIT
    return analyse(logits, labels, "logits", calibration_settings, source, fraction=fraction)


def _predict(
    loaded: LoadedModel, data: LoadedData, batch_size: int, on_step: OnStep | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of every sample; a NaN or infinite logit is a numerical failure."""
    import torch

    from curvcal.pipeline.runtime import predict

    advance = None if on_step is None else (lambda n: on_step("inference", n))
    predictions = predict(loaded, data, batch_size, advance)
    assert predictions is not None  # one process: every sample is predicted here
    logits, labels = predictions
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
    from curvcal.load.batches import iter_batches
    from curvcal.pipeline.session import default_params, resolve_loss

    hessian_settings = resolve_loss(loaded, hessian_settings)
    params, choice, say_choice = default_params(loaded, hessian_settings.params)
    hessian_settings = dataclasses.replace(hessian_settings, params=params)
    batch_size = settings["batch_size"]

    def batches() -> Any:
        return iter_batches(data.dataset, batch_size)

    hook = None if on_step is None else (lambda stage, n: on_step(f"hessian:{stage}", n))
    analysis, messages = analyse_hessian_with_messages(
        loaded.module, batches, hessian_settings, on_step=hook
    )
    return analysis, ([f"Hessian over {choice}"] if say_choice and params else []) + messages


__all__ = ["CheckRequest", "CheckResult", "CheckRun", "OnStep", "check_checkpoint", "run_check"]
