"""Saved reports read as baselines: a report's JSON document -> the gated metrics it holds.

The same path table reads a measurement's analyses (:func:`measured_values`), so a check and a
later comparison of saved reports judge the same numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curvcal.errors import InputError, shorten
from curvcal.jsontext import loads as load_json_text
from curvcal.paths import read_text_file
from curvcal.policy.evaluate import MetricValue
from curvcal.policy.parse import CALIBRATION_METRICS, STAGES, UNCALIBRATED, metric_domain
from curvcal.results import SCHEMA_VERSION, to_jsonable
from curvcal.settings.fields import word_today

# Where each gated metric lives in a saved report's JSON document, as dotted paths tried in
# order (the first one present wins). THIS TABLE IS THE ONE PLACE TO CHANGE when a command's
# result layout changes. A value at a path is a number, or an object with ``estimate`` (and
# ``ci95``/``interval``, a two-number list) or ``value``.
#
# The layouts: ``calibrate`` and ``metrics`` write a CalibrationAnalysis as ``results``
# (``evaluation.<stage>.<metric>``, ``fits.ts``, ``fits.focal_ts``); ``hessian`` writes a
# HessianAnalysis as ``results`` (``lambda_max``, ``trace.{estimate,ci95}``); ``demo`` nests the
# two under ``results.calibration`` and ``results.hessian``. ``check`` and ``compare`` documents
# are read from their verdict rows instead (see :func:`metric_values`).
_CALIBRATION_PATHS: dict[str, tuple[str, ...]] = {
    stage: (
        f"results.evaluation.{stage}.{{metric}}",
        f"results.calibration.evaluation.{stage}.{{metric}}",
    )
    for stage in STAGES
}
_OTHER_PATHS: dict[str, tuple[str, ...]] = {
    "lambda_max": ("results.lambda_max", "results.hessian.lambda_max"),
    "trace": ("results.trace", "results.hessian.trace"),
    "temperature": ("results.fits.ts.temperature", "results.calibration.fits.ts.temperature"),
    "focal_gamma": ("results.fits.focal_ts.gamma", "results.calibration.fits.focal_ts.gamma"),
    "focal_temperature": (
        "results.fits.focal_ts.temperature",
        "results.calibration.fits.focal_ts.temperature",
    ),
}


def metric_paths() -> dict[str, tuple[str, ...]]:
    """Every gated metric key (``ece``, ``ts.ece``, ``trace``, ...) with its candidate paths."""
    paths: dict[str, tuple[str, ...]] = {}
    for stage, templates in _CALIBRATION_PATHS.items():
        for metric in CALIBRATION_METRICS:
            key = metric if stage == UNCALIBRATED else f"{stage}.{metric}"
            paths[key] = tuple(template.format(metric=metric) for template in templates)
    paths.update(_OTHER_PATHS)
    return paths


VERDICT_COMMANDS = ("check", "compare")

#: Rounding a saved value may carry past the edge of its metric's range (an ECE summed in
#: float64 can end a few ulps below 0).
_DOMAIN_ROUNDING = 1e-9


@dataclass(frozen=True)
class _Reader:
    """Reads the values of a report's document. With ``source`` (the file it was read from)
    every value read is checked as a saved file's fields are, and a fault is an
    :class:`InputError` naming the file and the value's path; without, a value that is no
    number reads as missing (a measurement of this run, read through the same table)."""

    source: str | None = None

    def fail(self, where: str, why: str) -> None:
        if self.source is not None:
            raise InputError(
                self.source,
                f"{where}: {why}",
                "curvcal writes no such report: write it again with -o",
            )

    def number(self, item: Any, where: str, metric: str | None) -> float | None:
        """A value: a number, or ``None`` for null (a non-finite value is saved as null)."""
        if item is None:
            return None
        if isinstance(item, bool) or not isinstance(item, int | float):
            self.fail(where, f"must be a number or null, not {shorten(repr(item))}")
            return None
        value = float(item)
        if not math.isfinite(value):
            self.fail(where, f"{value} is no value a report holds (it saves one as null)")
            return None
        domain = metric_domain(metric) if metric is not None else None
        if domain is not None:
            low, high = domain
            if not low - _DOMAIN_ROUNDING <= value <= high + _DOMAIN_ROUNDING:
                self.fail(where, f"{value:g} is outside the range of {metric}, [{low:g}, {high:g}]")
        return value

    def interval(self, item: Any, where: str, metric: str | None) -> tuple[float, float] | None:
        if item is None:
            return None
        if not isinstance(item, list | tuple) or len(item) != 2:
            self.fail(where, f"must be a list of two numbers or null, not {shorten(repr(item))}")
            return None
        low = self.number(item[0], f"{where}[0]", metric)
        high = self.number(item[1], f"{where}[1]", metric)
        if low is None or high is None:
            return None
        if low > high:
            self.fail(where, f"its low end {low:g} is above its high end {high:g}")
            return None
        return (low, high)

    def metric_value(self, item: Any, where: str, metric: str | None) -> MetricValue:
        """A number, or an object with ``estimate`` or ``value`` and ``ci95`` or ``interval``."""
        if isinstance(item, Mapping):
            key = "estimate" if "estimate" in item else "value"
            bounds = "ci95" if "ci95" in item else "interval"
            return MetricValue(
                self.number(item.get(key), f"{where}.{key}", metric),
                self.interval(item.get(bounds), f"{where}.{bounds}", metric),
            )
        return MetricValue(self.number(item, where, metric))


def metric_values(report: Mapping[str, Any], source: str | None = None) -> dict[str, MetricValue]:
    """The gated metrics found in a report's JSON document, by key.

    A ``check``/``compare`` document carries the values it judged in its verdict rows
    (``results.rows``); any other document is read through :func:`metric_paths`, a calibration
    stage's metric with its bootstrap interval (``intervals.<metric>`` beside it). Metrics the
    document lacks are left out; one present as ``null`` (a non-finite number) maps to
    ``MetricValue(None)``. With ``source``, the file the document was read from, each value
    read is checked (:class:`_Reader`): a number or null within its metric's range, an interval
    of two with its low end first, verdict rows that are objects naming their metric, and rows
    of one metric (one per bound) that agree.
    """
    read = _Reader(source)
    found: dict[str, MetricValue] = {}
    if report.get("command") in VERDICT_COMMANDS:
        results = report.get("results")
        rows = results.get("rows") if isinstance(results, Mapping) else None
        if rows is not None and not isinstance(rows, list):
            read.fail("results.rows", f"must be a list of verdict rows, not {type(rows).__name__}")
        for i, row in enumerate(rows if isinstance(rows, list) else []):
            where = f"results.rows[{i}]"
            if not isinstance(row, Mapping) or not isinstance(row.get("metric"), str):
                read.fail(where, "must be an object naming its metric")
                continue
            metric = row["metric"]
            value = read.metric_value(row, where, metric)
            if metric in found and found[metric] != value:
                read.fail(where, f"gives {metric} another value than an earlier row")
            found.setdefault(metric, value)
        return found
    for key, paths in metric_paths().items():
        for path in paths:
            present, item = _lookup(report, path)
            if present:
                found[key] = read.metric_value(item, path, key)
                if found[key].interval is None:  # a calibration stage's bootstrap interval
                    parent, _dot, name = path.rpartition(".")
                    place = f"{parent}.intervals.{name}"
                    _present, interval = _lookup(report, place)
                    found[key] = MetricValue(found[key].value, read.interval(interval, place, key))
                break
    found.update(improvements(report, read))
    return found


_RANKING_PATHS = ("results.ranking.stages", "results.calibration.ranking.stages")


def improvements(report: Mapping[str, Any], read: _Reader | None = None) -> dict[str, MetricValue]:
    """Each calibrated stage's improvement over uncalibrated from a report's ``ranking``:
    ``{"ts.ece.improvement": metric(uncalibrated) − metric(ts), with its paired interval}``
    for every ranked score (the ranking holds stage − uncalibrated; the sign and the
    interval's ends are flipped). ``read``: how values are read (:func:`metric_values`)."""
    read = read or _Reader()
    found: dict[str, MetricValue] = {}
    for path in _RANKING_PATHS:
        present, stages = _lookup(report, path)
        if not present or not isinstance(stages, list):
            continue
        for i, ranked in enumerate(stages):
            against = ranked.get("vs_uncalibrated") if isinstance(ranked, Mapping) else None
            if not isinstance(against, Mapping):
                continue
            if ranked.get("stage") not in STAGES:
                read.fail(f"{path}[{i}].stage", f"names no stage of {', '.join(STAGES)}")
                continue
            for score, difference in against.items():
                where = f"{path}[{i}].vs_uncalibrated.{score}"
                measured = read.metric_value(difference, where, None)
                value = None if measured.value is None else -measured.value
                interval = measured.interval
                flipped = None if interval is None else (-interval[1], -interval[0])
                prefix = "" if ranked["stage"] == UNCALIBRATED else f"{ranked['stage']}."
                found[f"{prefix}{score}.improvement"] = MetricValue(value, flipped)
        break
    return found


def _lookup(document: Any, path: str) -> tuple[bool, Any]:
    item = document
    for part in path.split("."):
        if not isinstance(item, Mapping) or part not in item:
            return False, None
        item = item[part]
    return True, item


def report_origin(document: Mapping[str, Any]) -> dict[str, Any]:
    """Where a saved report came from, as a run that reads it records it beside the file's
    digest: the ``command`` that made it and, when it was made in a CI job, the ``revision``
    (``commit``, ``tag``) from its ``environment``. Missing parts are left out."""
    origin: dict[str, Any] = {}
    if isinstance(document.get("command"), str):
        origin["command"] = document["command"]
    environment = document.get("environment")
    revision = environment.get("revision") if isinstance(environment, Mapping) else None
    if isinstance(revision, Mapping):
        kept = {k: str(v) for k, v in revision.items() if k in ("commit", "tag") and v}
        if kept:
            origin["revision"] = kept
    return origin


def load_report(path: Path) -> dict[str, Any]:
    """Read a saved curvcal JSON report, checking that it is one, that its schema is one this
    version reads (same major version) and that every value a check or compare judges in it
    is one a report can hold (:func:`metric_values` with the file as ``source``)."""
    text = read_text_file(path, "report")
    try:
        document = load_json_text(text, str(path))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}", f"not valid JSON: {exc.msg}", "give a curvcal JSON report"
        ) from None
    if not isinstance(document, dict) or not {"schema", "command", "results"} <= document.keys():
        raise InputError(
            str(path),
            "not a curvcal report (no schema, command and results)",
            "write one with --output",
        )
    if not isinstance(document["results"], dict):
        raise InputError(
            str(path),
            f"not a curvcal report: its results are {type(document['results']).__name__}, "
            "not an object",
            "write one with --output",
        )
    schema = str(document["schema"])
    if schema.split(".")[0] not in READ_MAJORS:
        raise InputError(
            str(path),
            f"report schema {schema} is not readable by this curvcal (it reads "
            f"{' and '.join(major + '.x' for major in READ_MAJORS)})",
        )
    metric_values(document, str(path))  # every value a run judges, checked as it is read
    return document


#: the major schema versions a baseline may have: 1.x (settings flat for hessian, nested
#: otherwise, with older names) and today's
READ_MAJORS = ("1", SCHEMA_VERSION.split(".")[0])

#: option names a 1.x report spelled otherwise
_V1_NAMES = {
    "trust": "trust_checkpoint",
    "allow_globals": "allow_global",
    "spec": "data",
    "root": "data_root",
    "engine": "hvp",
    "distribution": "probe_dist",
}
#: keys of a 1.x hessian report's flat settings that are no setting (resolved values)
_V1_RESOLVED = ("criterion", "params_choice", "world_size")


def _v1_group(name: str) -> str | None:
    """The settings group of a 1.x hessian report's flat key."""
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.settings.fields import defaults
    from curvcal.settings.hessian import HessianSettings

    for cls in (CheckpointSettings, DataSettings, HessianSettings):
        if name in defaults(cls):
            return cls.GROUP
    return None


#: a 1.x ``check`` (and ``demo``) report's flat keys that are no policy key, by group
_V1_VERDICT_KEYS = {"rules": "check", "strict": "check", "policy": "compare"}
#: policy keys a 1.x check recorded as the policy set them, ``None`` meaning "chosen by the
#: check" (the maps the rules need, the class's γ grid, the default split), not a value
_V1_CHOSEN = ("method", "gammas", "val_split")


def _v1_verdict_settings(
    document: Mapping[str, Any], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """A 1.x ``check``, ``demo`` or ``compare`` report's flat settings (policy keys) as
    today's ``group.option``: each key under the fields it sets (:mod:`curvcal.policy.keys`;
    ``seed`` under both seeds), the check's and compare's own under ``check``/``compare``."""
    from curvcal.policy.keys import KEYS

    command = str(document.get("command"))
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _V1_VERDICT_KEYS:
            group = "compare" if command == "compare" else _V1_VERDICT_KEYS[key]
            flat[f"{group}.{key}"] = value
        elif key == "fit_data":
            flat["check.fit_data"] = value
        elif key == "trace":  # true/false, or the trace method
            flat["hessian.trace" if isinstance(value, bool) else "hessian.trace_method"] = value
        elif key in KEYS:
            if value is None and key in _V1_CHOSEN:
                continue
            for cls, name in KEYS[key]:
                flat[f"{cls.GROUP}.{name}"] = value
        else:
            flat[key] = value
    return flat


def _spelled_today(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded settings ``{group.field: value}`` in today's spelling: a report written before a
    choice was renamed (``hutch++``) compares equal to one written after (``hutchpp``). Read
    silently: the report's author typed nothing."""
    from curvcal.policy.keys import POLICY_CLASSES

    groups = {cls.GROUP: cls for cls in POLICY_CLASSES}
    today = {}
    for name, value in flat.items():
        group, _dot, field = name.rpartition(".")
        cls = groups.get(group)
        today[name] = value if cls is None else word_today(cls, field, value)
    return today


def flat_settings(document: Mapping[str, Any]) -> dict[str, Any]:
    """A report's ``settings`` as ``{"group.option": value}`` (``option`` alone where a report
    records a setting outside a group), 1.x reports read with today's names and groups: a
    hessian report's flat options under their settings' groups, a check's (and demo's)
    policy keys under the fields they set, so that any two reports compare the same
    settings."""
    settings = document.get("settings")
    if not isinstance(settings, Mapping):
        return {}
    v1 = str(document.get("schema", "")).split(".")[0] == "1"
    if v1 and document.get("command") in ("check", "compare", "demo"):
        return _spelled_today(_v1_verdict_settings(document, settings))
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and not (v1 and key == "arch_kwargs"):
            for name, item in value.items():
                flat[f"{key}.{_V1_NAMES.get(name, name) if v1 else name}"] = item
        elif v1 and document.get("command") == "hessian":
            if key in _V1_RESOLVED:
                continue
            name = str(_V1_NAMES.get(key, key))
            group = _v1_group(name)
            flat[f"{group}.{name}" if group else name] = value
        else:
            flat[key] = value
    return _spelled_today(flat)


#: groups a report records that say how it was judged or written, not how its numbers were
#: measured: never a difference worth a warning (two policies differ in their rules)
_UNMEASURED_GROUPS = ("check", "compare")


def setting_differences(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """The measured settings both reports record with different values (a comparison of
    numbers computed differently may mean little), each named by its option, old value first:
    ``["--probes: 100 → 50", "--seed: 0 → 7"]``, sorted by option. A setting two groups record
    alike (``seed``) is said once; one two groups record differently is named with its group
    (``--method (hessian): power → lanczos``). Empty when every shared setting is the same."""
    new_settings, old_settings = flat_settings(new), flat_settings(old)
    found: dict[tuple[str, str, str], set[str]] = {}
    for name in sorted(new_settings.keys() & old_settings.keys()):
        group, _dot, field = name.rpartition(".")
        if group in _UNMEASURED_GROUPS or new_settings[name] == old_settings[name]:
            continue
        option = "--" + field.replace("_", "-")
        change = (option, _option_text(old_settings[name]), _option_text(new_settings[name]))
        found.setdefault(change, set()).add(group)
    options = [option for option, _old, _new in found]
    lines = []
    for (option, before, after), named in sorted(found.items()):
        label = option
        if options.count(option) > 1 and named != {""}:
            label = f"{option} ({', '.join(sorted(g for g in named if g))})"
        lines.append(f"{label}: {before} → {after}")
    return sorted(lines)


def _option_text(value: Any) -> str:
    """A recorded setting as its option is typed: words and numbers as they are, true/false,
    lists comma-separated, tables as JSON, an unset value (or empty list) as ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(_option_text(item) for item in value) if value else "unset"
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def measured_values(hessian: object | None, calibration: object | None) -> dict[str, MetricValue]:
    """Every gateable metric of a Hessian analysis and a calibration analysis (either may be
    ``None``), read through the same path table as a saved report (the analyses laid out as
    ``curvcal demo`` saves them: ``results.hessian`` and ``results.calibration``). A non-finite
    number maps to ``MetricValue(None)``."""
    document = {
        "command": "measurement",
        "results": to_jsonable({"hessian": hessian, "calibration": calibration}),
    }
    return metric_values(document)
