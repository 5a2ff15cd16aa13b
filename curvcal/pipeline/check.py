"""``curvcal check``: measure what a policy gates on a checkpoint, and judge it.

:func:`check_checkpoint` is the command's run (read the baseline, measure and judge with
:func:`run_check`, build the report); :func:`run_check` is the library function ``demo`` and
scripts call.

:func:`run_check` reads the evaluation settings (command-line overrides first, then the policy's
``[settings]``, then the defaults of :data:`~curvcal.policy.settings.DEFAULTS`), builds the
settings objects of the fields they set (each value checked first, an error naming the option or
the policy line), and in one run session (:mod:`curvcal.pipeline.session`: torchrun, the NaN
policy, each input loaded once and checked against the model before any pass) measures **only
what the rules need** (see :func:`~curvcal.policy.settings.needs`):

* calibration metrics of the uncalibrated model: one inference pass, no fit (every sample of
  ``data`` is evaluated, as ``curvcal calibrate --method none`` does);
* any ``ts.*`` metric or ``temperature``: a temperature-scaling fit; any ``focal_ts.*`` metric,
  ``focal_gamma`` or ``focal_temperature``: a focal-temperature-scaling fit. Maps are fitted on a
  stratified ``val_split`` of ``data`` (default 0.5) or on ``fit_data``, and every stage is then
  measured on the evaluation split only, as ``curvcal calibrate`` does; any other map's metric
  (``vector.*``, ``laplace.*``, ...): that map (Laplace from the inputs of the model's last
  ``nn.Linear``, caught in the same inference pass);
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
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.curvature.progress import (
    OnStageStep as OnStep,  # stage: inference, calibration, hessian
)
from curvcal.errors import InputError, NumericalError
from curvcal.policy.baseline import measured_values
from curvcal.policy.evaluate import MetricValue, Verdict, evaluate
from curvcal.policy.parse import Policy
from curvcal.policy.settings import (
    Locator,
    Needs,
    calibration_method,
    check_choices,
    needs,
    resolve_settings,
    settings_of,
)
from curvcal.results import STATUS_ERROR, STATUS_FAIL, STATUS_PASS, Report
from curvcal.settings.calibration import CalibrationSettings
from curvcal.settings.check import CheckSettings
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import DataSettings
from curvcal.settings.fields import Settings, groups
from curvcal.settings.hessian import HessianSettings

if TYPE_CHECKING:
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.console import Reporter
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.pipeline.session import Session


@dataclass(frozen=True)
class CheckResult:
    """A policy judged on a checkpoint.

    ``verdict``: every bound's row; ``values``: the gated metrics measured (key as
    :attr:`~curvcal.policy.parse.Rule.key`); ``hessian``/``calibration``: the analyses that produced
    them (``None`` when the policy needed none); ``settings``: the evaluation settings used, by
    policy key, and ``sources``: where each came from (``option``, ``policy`` or ``default``);
    ``record``: the settings objects the check ran with, as a report records them
    (``{group: {option: value}}``, :func:`~curvcal.settings.fields.groups`); ``nonfinite``:
    the gated metrics whose value came out NaN or infinite (a numerical failure);
    ``unconverged``: the Hessian estimates that missed their tolerance; ``warnings``: messages
    for the user, of which the first ``said`` were already said on stderr as they came;
    ``inputs``: the checkpoint and data as loaded; ``timings``: wall seconds by stage (``load``,
    ``calibration``, ``hessian``); ``is_main``: whether this process speaks for the run (rank 0
    under torchrun).
    """

    verdict: Verdict
    values: dict[str, MetricValue]
    hessian: HessianAnalysis | None
    calibration: CalibrationAnalysis | None
    settings: dict[str, Any]
    sources: dict[str, str]
    record: dict[str, dict[str, Any]] = field(default_factory=dict)
    nonfinite: tuple[str, ...] = ()
    unconverged: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    said: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    is_main: bool = True

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


@dataclass(frozen=True)
class _Plan:
    """The settings objects of a check, built and checked before anything is loaded."""

    checkpoint: CheckpointSettings
    data: DataSettings
    fit_data: DataSettings | None
    calibration: CalibrationSettings | None
    hessian: HessianSettings | None
    method: str
    check: CheckSettings
    gated: tuple[str, ...] = ()
    """The calibrated stages the rules gate other than TS and focal TS (``laplace``, ...)."""


def _run_settings(plan: _Plan) -> tuple[Settings, ...]:
    """The settings objects of ``plan`` but the checkpoint's (which the session holds)."""
    parts = (plan.data, plan.fit_data, plan.calibration, plan.hessian, plan.check)
    return tuple(part for part in parts if part is not None)


def _plan(
    policy: Policy,
    settings: Mapping[str, Any],
    where: Locator,
    need: Needs,
    trust: bool,
    allow_globals: tuple[str, ...],
) -> _Plan:
    """Every settings object the rules need, from the policy keys (each value checked through
    its field, errors naming the option or the policy line)."""
    check_choices(settings, where)
    method = calibration_method(settings, need, where)
    if settings["data"] is None:
        raise InputError(
            str(policy.path),
            "no data to measure on",
            'add data = "SPEC" under [settings] or pass --data SPEC',
        )
    data = settings_of(DataSettings, settings, where, trust_checkpoint=trust)
    fitted = need.predictions and method != "none" and settings["fit_data"] is not None
    improving = [rule.key for rule in policy.rules if rule.require_improvement]
    if improving and not settings["bootstrap"]:
        raise InputError(
            where("bootstrap"),
            f"require_improvement ({', '.join(improving)}) is judged on a paired bootstrap "
            "interval, but bootstrap is 0",
            "set bootstrap = 1000 under [settings]",
        )
    return _Plan(
        checkpoint=settings_of(
            CheckpointSettings, settings, where, trust_checkpoint=trust, allow_global=allow_globals
        ),
        data=data,
        fit_data=data.replace(data=settings["fit_data"]) if fitted else None,
        calibration=_calibration_settings(settings, method, where) if need.predictions else None,
        hessian=_hessian_settings(settings, need, where) if need.hessian else None,
        method=method,
        check=settings_of(CheckSettings, settings, where),
        gated=need.linear,
    )


def run_check(
    policy: Policy,
    checkpoint: Path,
    overrides: Mapping[str, Any] | None = None,
    baseline: Mapping[str, MetricValue] | None = None,
    *,
    trust: bool = False,
    allow_globals: tuple[str, ...] = (),
    on_step: OnStep | None = None,
    reporter: Reporter | None = None,
) -> CheckResult:
    """Measure what ``policy`` gates on ``checkpoint`` and judge it, with ``baseline`` (the
    values of an earlier report, from :func:`~curvcal.policy.baseline.metric_values`) for change
    bounds. Progress and the notes of the run go to ``reporter`` (default: quiet); ``on_step``
    hears each stage as it ends.

    Raises :class:`InputError` for unusable settings (naming the policy line or the option) and
    files, and :class:`~curvcal.errors.NumericalError` when the model's logits (under the
    policy's ``nan_policy``), the Hessian's loss or a product are NaN/Inf. A gated metric that
    comes out non-finite is listed in ``nonfinite`` (its rows fail).
    """
    from curvcal.console import Reporter
    from curvcal.pipeline.calibration_warnings import analysis_warnings
    from curvcal.pipeline.compatibility import single_class_warning
    from curvcal.pipeline.session import open_session

    settings, sources = resolve_settings(policy, overrides)
    where = Locator(policy, sources)
    need = needs(policy.rules, str(policy.path))
    plan = _plan(policy, settings, where, need, trust, allow_globals)

    timings: dict[str, float] = {}
    messages: list[str] = []
    said: list[str] = []
    calibration = hessian = None
    with (
        _at_the_policy(where),
        open_session(plan.checkpoint, reporter or Reporter(True), _run_settings(plan)) as session,
    ):
        loaded = _model(session, checkpoint, need)
        resolved = None
        if plan.hessian is not None:  # impossible requests refused before the data is read
            resolved = session.hessian_settings(loaded, plan.hessian)
        data = session.dataset(loaded, plan.data, "data")
        fit = None if plan.fit_data is None else session.dataset(loaded, plan.fit_data, "fit_data")
        inputs: dict[str, Any] = {"checkpoint": loaded.describe(), "data": data.describe()}
        if fit is not None:
            inputs["fit_data"] = fit.describe()
        timings["load"] = session.timings.get("load", 0.0)

        if plan.calibration is not None:
            began = time.perf_counter()
            if plan.method == "none" and (settings["fit_data"] or settings["val_split"]):
                messages.append(
                    "the policy gates no calibrated stage, so nothing is fitted: val_split and "
                    "fit_data are unused and every sample is evaluated"
                )
            calibration, n_classes = _calibrate(
                session, loaded, data, fit, settings, plan, messages
            )
            _refuse_skipped_gates(policy, calibration)
            if n_classes == 1:
                messages.append(single_class_warning(str(checkpoint)))
            if calibration is not None:
                # what calibrate says of the same fits (a temperature at its bracket's end, a
                # map with no minimum or not converged, an infinite NLL), said of the gated ones
                named = "max_samples" if sources.get("max_samples") == "policy" else None
                messages += analysis_warnings(calibration, data.subset, named)
            timings["calibration"] = time.perf_counter() - began
            if on_step is not None:
                on_step("calibration", 1)

        if resolved is not None:
            began = time.perf_counter()
            curvature = session.hessian(loaded, data, resolved, plan.data.batch_size, option="data")
            hessian = curvature.analysis
            choice = resolved.choice
            said += [f"Hessian over {choice}"] if choice and resolved.settings.params else []
            said += curvature.notes
            messages += curvature.messages
            timings["hessian"] = time.perf_counter() - began
            if on_step is not None:
                on_step("hessian", 1)
    said = session.warnings + said

    values = measured_values(hessian, calibration)
    gated = {rule.key for rule in policy.rules}
    nonfinite = tuple(sorted(key for key in gated if key in values and values[key].value is None))
    verdict = evaluate(policy.rules, values, baseline, plan.check.judge)
    used: list[Settings] = [
        plan.checkpoint.replace(device=str(session.device)),
        plan.data,
        *(item for item in (plan.calibration, plan.hessian) if item is not None),
    ]
    return CheckResult(
        verdict=verdict,
        values={key: value for key, value in values.items() if key in gated},
        hessian=hessian,
        calibration=calibration,
        settings=settings,
        sources=sources,
        record=groups(*used),
        nonfinite=nonfinite,
        unconverged=tuple(hessian.unconverged) if hessian is not None else (),
        warnings=tuple(said + messages),
        said=len(said),
        inputs=inputs,
        timings=timings,
        is_main=session.is_main,
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
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.pipeline.provenance import environment
    from curvcal.policy.baseline import (
        load_report,
        metric_values,
        report_origin,
        setting_differences,
    )
    from curvcal.results import SCHEMA_VERSION

    began = time.perf_counter()
    baseline_report = load_report(request.baseline) if request.baseline is not None else None
    result = run_check(
        request.policy,
        request.checkpoint,
        request.overrides,
        metric_values(baseline_report) if baseline_report is not None else None,
        trust=request.trust,
        allow_globals=request.allow_globals,
        reporter=reporter,
    )
    settings: dict[str, Any] = {
        **result.record,
        "check": {
            "policy": str(request.policy.path),
            "fit_data": result.settings["fit_data"],
            "rules": request.policy.rules,
            "strict": request.strict,
            "judge": result.settings["judge"],
        },
    }
    messages = list(result.warnings)
    if baseline_report is not None:
        new = {"schema": SCHEMA_VERSION, "command": "check", "settings": settings}
        messages += [
            "the baseline was computed with different settings (baseline → this check): "
            + difference
            for difference in setting_differences(new, baseline_report)
        ]
    if result.is_main:
        for message in messages[result.said :]:
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
        assert baseline_report is not None
        described["baseline"] = {
            **asdict(file_info(request.baseline)),
            **report_origin(baseline_report),
        }
    report = Report(
        command="check",
        results=result,
        status=status,
        inputs=described,
        settings=settings,
        timings={**result.timings, "total": time.perf_counter() - began},
        environment=environment(),
        warnings=messages,
    )
    return CheckRun(result, report, failure)


# --------------------------------------------------------------------------------------------
# settings


@contextlib.contextmanager
def _at_the_policy(where: Locator) -> Iterator[None]:
    """A loader's error about the value of a setting (``--device: ...``) at the policy's line
    when the policy set that value, not at the option the user never typed."""
    classes = (CheckpointSettings, DataSettings, HessianSettings, CalibrationSettings)
    try:
        yield
    except InputError as error:
        for cls in classes:
            readdressed = where.option_errors(cls)(error)
            if readdressed is not error:
                raise readdressed from None
        raise


def _calibration_settings(
    settings: Mapping[str, Any], method: str, where: Locator
) -> CalibrationSettings:
    """The calibration settings of a policy (``method``: the maps the rules need); the
    fraction fitted on recorded as ``calibrate`` records it (``None`` when nothing is fitted
    on a split)."""
    from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT

    fraction = None
    if method != "none" and settings["fit_data"] is None:
        fraction = settings["val_split"] or DEFAULT_VAL_SPLIT
    return settings_of(CalibrationSettings, settings, where, method=method, val_split=fraction)


def _hessian_settings(settings: Mapping[str, Any], need: Needs, where: Locator) -> HessianSettings:
    """The Hessian settings of a policy: each key sets the field of its name
    (:mod:`curvcal.policy.keys`: ``eigen_method`` sets ``method``, ``trace`` the switch or the
    ``trace_method``), and the trace is measured when a rule gates it."""
    trace = settings["trace"]
    if need.trace and trace is False:
        raise InputError(where("trace"), "trace = false, but the policy gates [trace]")
    loss, gamma = settings["loss"], settings["gamma"]
    if loss == "focal" and gamma is None:
        raise InputError(where("loss"), "loss 'focal' needs gamma under [settings]")
    if loss != "focal" and gamma not in (None, 0, 0.0):
        raise InputError(where("gamma"), f"gamma {gamma} is only used with loss 'focal'")
    return settings_of(
        HessianSettings,
        settings,
        where,
        trace=need.trace,
        trace_method=trace if isinstance(trace, str) else "auto",
        gamma=None if loss != "focal" else float(gamma),
    )


# --------------------------------------------------------------------------------------------
# measurements


def _calibrate(
    session: Session,
    loaded: LoadedModel,
    data: LoadedData,
    fit: LoadedData | None,
    settings: Mapping[str, Any],
    plan: _Plan,
    messages: list[str],
) -> tuple[CalibrationAnalysis | None, int]:
    """Predict (under the policy's ``nan_policy``) and run the calibration analysis exactly as
    ``curvcal calibrate`` would; also the number of logits K. ``(None, 0)`` on the ranks but
    0, which get no predictions. The warnings calibrate gives of the data (a split lacking
    some of the model's classes) are added to ``messages``."""
    from curvcal.pipeline.calibration import DEFAULT_VAL_SPLIT, analyse, predict_with_fit
    from curvcal.pipeline.calibration_warnings import missing_classes

    assert plan.calibration is not None
    calibration, batch_size = plan.calibration, plan.data.batch_size
    # the Laplace map reads the model's last-layer inputs, caught in the same inference pass;
    # with method "all" and no rule on it, a model without such a head only skips it
    wants = plan.method in ("laplace", "all")
    optional = plan.method == "all" and "laplace" not in plan.gated
    predicted, features, fit_predicted, fit_features = predict_with_fit(
        session,
        loaded,
        (data, fit),
        batch_size,
        ("data", "fit_data"),
        calibration.nan_policy,
        wants,
        optional,
        predict=_predict,
    )
    if predicted is None:
        return None, 0
    logits, labels, _dropped = predicted
    source, n_classes = f"data {data.spec}", int(logits.shape[1])
    splits = [(source, labels)]
    if fit is not None and fit_predicted is not None:
        splits.append((f"fit_data {fit.spec}", fit_predicted[1]))
    for where, rows in splits:  # what calibrate says of a set lacking some classes
        missing = missing_classes(rows, n_classes, where)
        if missing:
            messages.append(missing)
    if plan.method == "none":
        return analyse(logits, labels, "logits", calibration, source), n_classes
    if fit is not None and fit_predicted is not None:
        analysis = analyse(
            logits,
            labels,
            "logits",
            calibration,
            source,
            fit=fit_predicted[:2],
            fit_source=f"fit_data {fit.spec}",
            features=features,
            fit_features=fit_features,
        )
        return analysis, n_classes
    fraction = settings["val_split"] or DEFAULT_VAL_SPLIT
    analysis = analyse(
        logits, labels, "logits", calibration, source, fraction=fraction, features=features
    )
    return analysis, n_classes


def _refuse_skipped_gates(policy: Policy, analysis: CalibrationAnalysis | None) -> None:
    """A rule on a map that the run fitting every map skipped (Platt scaling on ten classes,
    say) is refused as the policy's fault, with the map's reason, as it is when that map is
    gated alone: judged, it would fail as 'not in the report', a broken bound (exit 1) that
    no model can meet."""
    if analysis is None or analysis.ranking is None:
        return
    reasons = {skipped.stage: skipped.reason for skipped in analysis.ranking.skipped}
    for rule in policy.rules:
        if rule.stage in reasons:
            raise InputError(
                str(policy.path),
                f"[{rule.key}] gates the {rule.stage} map, which does not apply here: "
                f"{reasons[rule.stage]}",
                "remove the rule, or check a model the map applies to",
            )


def _model(session: Session, checkpoint: Path, need: Needs) -> LoadedModel:
    """The checkpoint as the session loads it; a file that is no model but a logits file,
    under a policy that gates the Laplace map (fitted from the model itself), is refused with
    that reason rather than the loader's."""
    try:
        return session.model(checkpoint)
    except InputError:
        if "laplace" not in need.linear or not _holds_logits(checkpoint):
            raise
        raise InputError(
            str(checkpoint),
            "holds logits and labels, not a model: the policy's laplace rules need the model's "
            "last layer and its inputs",
            "check the checkpoint itself, or gate the logits' maps with curvcal metrics",
        ) from None


def _holds_logits(path: Path) -> bool:
    """Whether ``path`` reads as a logits file (scores and labels)."""
    from curvcal.load.scores.logits import load_logits

    try:
        load_logits(path)
    except (InputError, NumericalError, OSError, ValueError):
        return False
    return True


def _predict(
    session: Session,
    loaded: LoadedModel,
    data: LoadedData,
    batch_size: int,
    option: str,
    *rest: Any,
) -> tuple[Any, Any]:
    """:func:`~curvcal.pipeline.calibration.predict_with_features` of the same arguments (the
    predictions, and the inputs of the model's last layer when asked), whose stop names the
    checkpoint, as a check's numerical failures do (the policy, not an option, named the data)."""
    from curvcal.pipeline.calibration import predict_with_features

    try:
        return predict_with_features(session, loaded, data, batch_size, option, *rest)
    except NumericalError as error:
        raise NumericalError(
            str(loaded.path),
            f"on {option} {data.spec}: {error.why}",
            error.hint,
        ) from None


__all__ = ["CheckRequest", "CheckResult", "CheckRun", "OnStep", "check_checkpoint", "run_check"]
