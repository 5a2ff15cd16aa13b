"""CI gate: policies (what to measure, which bounds must hold), and verdicts.

A policy is a TOML file (``--policy FILE``) or the ``[tool.curvcal]`` table of a
``pyproject.toml``. It holds

* ``[settings]``: the evaluation settings (checkpoint loading, data, split, bins, probes, seed,
  method, ...), so that a release's gate can be rerun from the repository alone;
* one table per gated metric with any of the bounds ``max``, ``min`` (on the value itself),
  ``max_increase`` (value − baseline ≤ bound), ``max_rel_increase``
  ((value − baseline)/|baseline| ≤ bound, a fraction: 0.1 is 10 %), ``max_decrease``
  (baseline − value ≤ bound) and ``max_rel_decrease`` ((baseline − value)/|baseline| ≤ bound);
  the decrease bounds guard metrics where higher is better, such as ``accuracy``.

Calibration metrics are measured at a *stage*: ``[ece]`` (same as ``[uncalibrated.ece]``) gates
the uncalibrated model, ``[ts.ece]`` the model after temperature scaling and ``[focal_ts.ece]``
after focal temperature scaling (``[vector.ece]``, ``[matrix.ece]``, ``[histogram.ece]``,
``[isotonic_ovr.ece]``, ``[platt.ece]``, …: after that map). Their keys in values and verdicts are ``ece``, ``ts.ece`` and ``focal_ts.ece``. The other metrics (``lambda_max``, ``trace``, ``temperature``, ``focal_gamma``,
``focal_temperature``) take no stage.

Example::

    [settings]
    arch = "curvcal:DigitsCNN"
    data = "digits:test"
    seed = 0

    [ece]
    max = 0.05
    [ts.ece]
    max = 0.02
    [lambda_max]
    max_rel_increase = 0.10

A calibrated stage's table may also demand a *significant improvement* over the uncalibrated
model: ``require_improvement = "ece"`` (or ``"nll"``, or a list of both) under ``[ts]`` passes
only when the whole paired bootstrap interval of ece(uncalibrated) − ece(ts) lies above 0
(:mod:`curvcal.calibration.ranking`; the policy must set ``bootstrap`` under ``[settings]``)::

    [ts]
    require_improvement = "ece"

This module reads and validates policies; :mod:`curvcal.policy.evaluate` judges numbers that
the caller measured or read from a saved report with
:func:`curvcal.policy.baseline.metric_values`.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from curvcal.errors import InputError
from curvcal.paths import read_text_file
from curvcal.policy.keys import Kind, kinds, spelled_key_value
from curvcal.results import CALIBRATION_METRIC_FIELDS

#: Metrics of the scores that no bound judges a release by: ``mean_confidence`` describes the
#: model rather than its calibration, and ``rms_ce_debiased`` is a diagnostic beside ``rms_ce``.
_NOT_GATED = frozenset({"mean_confidence", "rms_ce_debiased"})
CALIBRATION_METRICS = tuple(name for name in CALIBRATION_METRIC_FIELDS if name not in _NOT_GATED)
"""Metrics of predicted probabilities (those of
:data:`~curvcal.results.CALIBRATION_METRIC_FIELDS` a policy gates); each can be gated at any
stage of :data:`STAGES`."""

CURVATURE_METRICS = ("lambda_max", "trace")
SCALING_METRICS = ("temperature", "focal_gamma", "focal_temperature")
METRICS = CALIBRATION_METRICS + CURVATURE_METRICS + SCALING_METRICS

UNCALIBRATED = "uncalibrated"
# The policy layer reads no calibration module (no torch), so the stages are spelled here; a
# test holds them equal to the stages the registry's maps give a run
# (:data:`curvcal.calibration.analysis.STAGES`).
STAGES = (
    UNCALIBRATED,
    "ts",
    "focal_ts",
    "vector",
    "matrix",
    "laplace",
    "histogram",
    "histogram_ovr",
    "isotonic",
    "isotonic_ovr",
    "platt",
    "beta",
    "dirichlet",
    "dirichlet_l2",
    "ets",
    "bbq",
    "venn_abers",
)
"""``uncalibrated``: the model's own probabilities; ``ts``: after temperature scaling;
``focal_ts``: after focal temperature scaling; ``vector``/``matrix``: after vector or matrix
scaling; ``laplace``: the last-layer Laplace predictive (fitted from the model's features); ``histogram``/``histogram_ovr``, ``isotonic``/``isotonic_ovr``, ``platt``, ``beta``:
after that map (a policy gates one map other than TS and focal TS, and not with ``ts`` or
``focal_ts``: ``--method`` fits one of them alone)."""

IMPROVEMENT = "require_improvement"
#: The scores a stage can be required to improve: those ranked with paired intervals
#: (:data:`curvcal.calibration.ranking.RANK_SCORES`).
IMPROVEMENT_SCORES = ("nll", "ece")

BOUNDS = ("max", "min", "max_increase", "max_rel_increase", "max_decrease", "max_rel_decrease")
CHANGE_BOUNDS = BOUNDS[2:]

# The range a metric can take; a bound outside it can never (or always) be met.
_DOMAIN: dict[str, tuple[float, float]] = {
    **{name: (0.0, 1.0) for name in ("ece", "adaece", "mce", "classwise_ece", "rms_ce")},
    "smooth_ece": (0.0, 1.0),
    **{name: (0.0, 1.0) for name in ("ks_ce", "kuiper", "mmce", "aurc", "e_aurc")},
    "accuracy": (0.0, 1.0),
    "nll": (0.0, math.inf),
    "brier": (0.0, 2.0),
    "lambda_max": (-math.inf, math.inf),
    "trace": (-math.inf, math.inf),
    "temperature": (0.0, math.inf),
    "focal_gamma": (0.0, math.inf),
    "focal_temperature": (0.0, math.inf),
}


def metric_domain(key: str) -> tuple[float, float] | None:
    """The range the gated metric ``key`` (``ece``, ``ts.nll``, ``trace``) can take
    (:data:`_DOMAIN`); ``None`` for an improvement (``ts.ece.improvement``, a difference) or a
    name this version does not gate."""
    name = key.rsplit(".", 1)[-1]
    return None if name == "improvement" else _DOMAIN.get(name)


# Evaluation settings a policy may hold under [settings], with the kind each must have: the
# fields they set (curvcal.policy.keys) give both. The values themselves (an architecture's
# name, a dataset spec, a word of a setting's choices) are checked when a check runs, naming
# where the value came from, as if they had been given as options.
SETTINGS: dict[str, Kind] = dict(kinds())


@dataclass(frozen=True)
class Rule:
    """The bounds on one metric. ``stage`` is one of :data:`STAGES` for a calibration metric and
    ``None`` for the others; unset bounds are ``None``."""

    metric: str
    max: float | None = None
    min: float | None = None
    max_increase: float | None = None
    max_rel_increase: float | None = None
    max_decrease: float | None = None
    max_rel_decrease: float | None = None
    stage: str | None = None
    require_improvement: bool = False
    """Pass only when the paired bootstrap interval of metric(uncalibrated) − metric(stage)
    lies wholly above 0."""

    @property
    def key(self) -> str:
        """The metric's name in values and verdicts: ``ece``, ``ts.ece``, ``lambda_max``."""
        if self.stage is None or self.stage == UNCALIBRATED:
            return self.metric
        return f"{self.stage}.{self.metric}"

    @property
    def improvement_key(self) -> str:
        """The key of the stage's improvement over uncalibrated: ``ts.ece.improvement``."""
        return f"{self.key}.improvement"


@dataclass(frozen=True)
class Policy:
    """A parsed policy: evaluation settings and the rules to judge."""

    path: Path
    settings: dict[str, Any]
    rules: tuple[Rule, ...]

    @property
    def metric_keys(self) -> frozenset[str]:
        """The metrics (stage-qualified) the policy gates: what a check has to measure."""
        return frozenset(rule.key for rule in self.rules)


# --------------------------------------------------------------------------------------------
# Policy files


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file.

    A file named ``pyproject.toml`` is read from its ``[tool.curvcal]`` table; any other file is a
    policy as a whole. Errors are :class:`InputError` with ``what`` = ``FILE:LINE``.
    """
    text = read_text_file(path, "policy")
    try:
        document = tomllib.loads(text)
    except RecursionError:  # tomllib recurses once per level of nested arrays or inline tables
        raise InputError(str(path), "not valid TOML: nested too deep") from None
    except ValueError as exc:  # TOMLDecodeError, or an integer of more than 4,300 digits
        # tomllib's message ends with "(at line L, column C)".
        found = re.search(r"at line (\d+)", str(exc))
        where = f"{path}:{found.group(1)}" if found else str(path)
        raise InputError(where, f"not valid TOML: {exc}") from None
    prefix: tuple[str, ...] = ()
    if path.name == "pyproject.toml":
        prefix = ("tool", "curvcal")
        table = document.get("tool", {}).get("curvcal")
        if not isinstance(table, dict):
            raise InputError(str(path), "has no [tool.curvcal] table", "add one or pass --policy")
        document = table
    return _Parser(path, text, prefix).policy(document)


def setting_location(policy: Policy, name: str) -> str:
    """``FILE:LINE`` where ``policy`` sets ``[settings] name`` (just ``FILE`` when the line
    cannot be found), for messages about a setting's value."""
    prefix = ("tool", "curvcal") if policy.path.name == "pyproject.toml" else ()
    try:
        lines = policy.path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError):
        return str(policy.path)
    line = _find_line(lines, (*prefix, "settings", name))
    return f"{policy.path}:{line}" if line else str(policy.path)


def find_pyproject_policy(directory: Path) -> Path | None:
    """``directory/pyproject.toml`` when it exists and has a ``[tool.curvcal]`` table."""
    candidate = directory / "pyproject.toml"
    if not candidate.is_file():
        return None
    try:
        document = tomllib.loads(candidate.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, RecursionError, ValueError):
        return candidate  # let load_policy report what is wrong with it
    tool = document.get("tool", {})
    return candidate if isinstance(tool, dict) and "curvcal" in tool else None


def policy_file(given: Path | None, directory: Path) -> Path:
    """The policy a command follows: ``given`` (``--policy``), else ``directory/pyproject.toml``
    when it has a ``[tool.curvcal]`` table; :class:`InputError` naming ``--policy`` when neither."""
    if given is not None:
        return given
    found = find_pyproject_policy(directory)
    if found is None:
        raise InputError(
            "--policy",
            "no policy given and ./pyproject.toml has no [tool.curvcal] table",
            "pass --policy FILE",
        )
    return found


def _misplaced(key: str, stage: str | None) -> str | None:
    """Where a key of a stage's table belongs when it was put in a metric's table instead."""
    if key != IMPROVEMENT:
        return None
    if stage is None or stage == UNCALIBRATED:
        return f"{key} belongs to a calibrated stage's table, such as [ts] (not a metric's)"
    return f"{key} belongs to the stage's table: put it under [{stage}], not a metric's"


class _Parser:
    """Validates a policy's tables, naming the file and line of every fault."""

    def __init__(self, path: Path, text: str, prefix: tuple[str, ...]) -> None:
        self.path = path
        self.lines = text.splitlines()
        self.prefix = prefix

    def policy(self, document: Mapping[str, Any]) -> Policy:
        settings: dict[str, Any] = {}
        rules: dict[str, Rule] = {}
        improvements: list[tuple[str, str]] = []
        for name, value in document.items():
            if name == "settings":
                settings = self._settings(value)
            elif name in STAGES:
                if not isinstance(value, dict):
                    self._fail((name,), f"'{name}' must be a table of metrics, like [{name}.ece]")
                for metric, bounds in value.items():
                    if metric == IMPROVEMENT:
                        improvements += [(name, s) for s in self._improvement(name, bounds)]
                    else:
                        self._add(rules, self._rule(metric, name, bounds, (name, metric)))
            elif name in METRICS:
                stage = UNCALIBRATED if name in CALIBRATION_METRICS else None
                self._add(rules, self._rule(name, stage, value, (name,)))
            elif name in SETTINGS:
                self._fail(
                    (name,),
                    f"'{name}' is an evaluation setting, not a metric",
                    "put it under [settings]",
                )
            else:
                self._fail(
                    (name,), f"unknown metric or table '{name}'", _choices("metrics", METRICS)
                )
        for stage, score in improvements:
            key = Rule(metric=score, stage=stage).key
            rule = rules.get(key, Rule(metric=score, stage=stage))
            rules[key] = replace(rule, require_improvement=True)
        if not rules:
            self._fail(
                (), "the policy gates no metric", "add a table such as [ece] with max = 0.05"
            )
        return Policy(self.path, settings, tuple(rules.values()))

    def _settings(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self._fail(("settings",), "'settings' must be a table")
        for key, item in value.items():
            kind = SETTINGS.get(key)
            if kind is None:
                self._fail(
                    ("settings", key),
                    f"unknown setting '{key}'",
                    _choices("settings", tuple(SETTINGS)),
                )
            if not kind.accepts(item):
                self._fail(("settings", key), f"setting '{key}' must be {kind.text}, not {item!r}")
        return {key: self._spelled_now(key, item) for key, item in value.items()}

    def _spelled_now(self, key: str, value: Any) -> Any:
        """A setting's value in today's spelling (a former word of its field read with a
        :class:`~curvcal.errors.FormerSpellingWarning` naming the policy's line and key)."""
        line = _find_line(self.lines, (*self.prefix, "settings", key))
        said = f"{self.path}:{line}: {key}" if line else f"{self.path}: {key}"
        return spelled_key_value(key, value, said)

    def _improvement(self, stage: str, value: Any) -> list[str]:
        """The scores of ``[stage] require_improvement``: one of :data:`IMPROVEMENT_SCORES`
        or a list of them."""
        where = (stage, IMPROVEMENT)
        if stage == UNCALIBRATED:
            self._fail(
                where,
                "uncalibrated cannot improve on itself",
                f"put {IMPROVEMENT} under a calibrated stage, such as [ts]",
            )
        scores = [value] if isinstance(value, str) else value
        if (
            not isinstance(scores, list)
            or not scores
            or any(score not in IMPROVEMENT_SCORES for score in scores)
        ):
            self._fail(
                where,
                f"{stage}.{IMPROVEMENT} must be one of {', '.join(IMPROVEMENT_SCORES)} or a "
                f"list of them, not {value!r}",
            )
        return list(dict.fromkeys(scores))

    def _rule(self, metric: str, stage: str | None, bounds: Any, where: tuple[str, ...]) -> Rule:
        if metric not in METRICS:
            self._fail(where, f"unknown metric '{metric}'", _choices("metrics", METRICS))
        if stage is not None and metric not in CALIBRATION_METRICS:
            self._fail(
                where,
                f"'{metric}' takes no stage ({stage}): only calibration metrics do",
                f"use [{metric}]",
            )
        label = ".".join(where)
        if not isinstance(bounds, dict):
            hint = "evaluation settings go under [settings]" if label in SETTINGS else None
            self._fail(
                where, f"'{label}' must be a table of bounds, like [{label}] max = 0.1", hint
            )
        numbers: dict[str, Any] = {}  # bound -> float
        for key, item in bounds.items():
            if key not in BOUNDS:
                self._fail(
                    (*where, key),
                    f"unknown bound '{key}' in [{label}]",
                    _misplaced(key, stage) or _choices("bounds", BOUNDS),
                )
            if isinstance(item, bool) or not isinstance(item, int | float):
                self._fail((*where, key), f"bound {label}.{key} must be a number, not {item!r}")
            if not _finite(item):
                shown = (
                    repr(item)
                    if isinstance(item, float)
                    else f"an integer of {int(item.bit_length() * math.log10(2)) + 1} digits"
                )
                self._fail((*where, key), f"bound {label}.{key} must be finite, not {shown}")
            numbers[key] = float(item)
        if not numbers:
            self._fail(where, f"[{label}] sets no bound", _choices("bounds", BOUNDS))
        low, high = _DOMAIN[metric]
        upper, lower = numbers.get("max"), numbers.get("min")
        if upper is not None and lower is not None and lower > upper:
            self._fail(
                (*where, "min"),
                f"[{label}] min {lower:g} is above max {upper:g}: nothing can pass",
            )
        if upper is not None and upper < low:
            self._fail(
                (*where, "max"),
                f"[{label}] max {upper:g} is below {low:g}, the least {metric} can be",
            )
        if lower is not None and lower > high:
            self._fail(
                (*where, "min"),
                f"[{label}] min {lower:g} is above {high:g}, the most {metric} can be",
            )
        for key in CHANGE_BOUNDS:
            if numbers.get(key, 0.0) < 0:
                self._fail(
                    (*where, key),
                    f"[{label}] {key} {numbers[key]:g} is negative",
                    "an allowed change is >= 0; use max/min to demand an improvement",
                )
        return Rule(metric=metric, stage=stage, **numbers)

    def _add(self, rules: dict[str, Rule], rule: Rule) -> None:
        if rule.key in rules:
            self._fail(
                (UNCALIBRATED, rule.metric),
                f"'{rule.key}' is gated twice ([{rule.metric}] and [uncalibrated.{rule.metric}] "
                "are the same metric)",
            )
        rules[rule.key] = rule

    def _fail(self, where: tuple[str, ...], why: str, hint: str | None = None) -> NoReturn:
        line = _find_line(self.lines, self.prefix + where)
        raise InputError(f"{self.path}:{line}" if line else str(self.path), why, hint)


def _finite(number: float) -> bool:
    """Whether ``number`` is a finite float, or an integer a float holds (10**400 is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _choices(what: str, names: Sequence[str]) -> str:
    return f"known {what}: {', '.join(names)}"


# tomllib reports no positions, so the line of a table or key is found by scanning the text:
# table headers set the current table, ``a.b = ...`` lines define keys below it. Multi-line
# strings and arrays are not parsed; a policy is a handful of short tables.
_HEADER = re.compile(r"^\s*\[\[?(?P<name>[^\]]*)\]\]?\s*(?:#.*)?$")
_KEY = re.compile(
    r"""^\s*(?P<key>(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_PART = re.compile(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""")


def _key_parts(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip("'\"") for part in _PART.findall(dotted))


def _find_line(lines: Sequence[str], target: tuple[str, ...]) -> int | None:
    """1-based line where ``target`` (a table or key path) is defined; when it is not written on
    a line of its own (a key inside an inline table), the line of its nearest enclosing table."""
    for depth in range(len(target), 0, -1):
        wanted = target[:depth]
        table: tuple[str, ...] = ()
        for number, line in enumerate(lines, start=1):
            header = _HEADER.match(line)
            if header:
                table = _key_parts(header.group("name"))
                if table[:depth] == wanted:
                    return number
                continue
            key = _KEY.match(line)
            if key and (table + _key_parts(key.group("key")))[:depth] == wanted:
                return number
    return None
