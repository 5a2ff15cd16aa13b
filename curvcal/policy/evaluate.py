"""Judge measured values against a policy's bounds: one verdict row per bound.

Pure: the values come from a measurement or from a saved report
(:func:`curvcal.policy.baseline.metric_values`); nothing here reads a file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from curvcal.policy.parse import BOUNDS, CALIBRATION_METRICS, CHANGE_BOUNDS, IMPROVEMENT, Rule

_RELATIVE_BOUNDS = ("max_rel_increase", "max_rel_decrease")


@dataclass(frozen=True)
class MetricValue:
    """A measured metric: ``value`` (``None`` when missing or not finite) and, for estimates such
    as the trace and calibration metrics measured with a bootstrap, its 95 % ``interval``.
    Bounds are judged on ``value``, or for a calibration metric on its interval as
    :func:`evaluate`'s ``judge`` says."""

    value: float | None
    interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class VerdictRow:
    """One bound judged: ``bound`` is one of :data:`BOUNDS` and ``limit`` its number;
    ``change`` is value − baseline for ``max_increase``/``max_decrease`` and
    (value − baseline)/|baseline| for ``max_rel_increase``/``max_rel_decrease`` (``None`` for
    ``max``/``min``). A decrease is a negative change."""

    metric: str
    bound: str
    limit: float
    value: float | None
    interval: tuple[float, float] | None
    baseline: float | None
    change: float | None
    passed: bool
    reason: str

    @property
    def bound_text(self) -> str:
        """The bound for people: ``<= 0.05``, ``>= 0.9``, ``change <= +0.01``,
        ``change <= +10%``, ``change >= -0.01``, ``change >= -10%``."""
        if self.bound == "max":
            return f"<= {self.limit:.4g}"
        if self.bound == "min":
            return f">= {self.limit:.4g}"
        if self.bound == "max_increase":
            return f"change <= {self.limit:+.4g}"
        if self.bound == "max_rel_increase":
            return f"change <= {100 * self.limit:+.4g}%"
        if self.bound == "max_decrease":
            return f"change >= {-self.limit:+.4g}"
        if self.bound == IMPROVEMENT:
            return "uncal − stage > 0 (whole interval)"
        return f"change >= {-100 * self.limit:+.4g}%"

    @property
    def borderline(self) -> bool:
        """Whether the 95 % interval straddles a ``max``/``min`` bound (lo ≤ limit ≤ hi): the
        estimate's side of the bound is not shown, whichever way the row was judged. Change
        bounds and the improvement are judged on other numbers and are never borderline."""
        if self.interval is None or self.bound not in ("max", "min"):
            return False
        low, high = self.interval
        return low <= self.limit <= high


@dataclass(frozen=True)
class Verdict:
    """Every bound of a policy judged; ``passed`` when all rows passed."""

    passed: bool
    rows: tuple[VerdictRow, ...] = field(default_factory=tuple)

    @property
    def failed_rows(self) -> tuple[VerdictRow, ...]:
        return tuple(row for row in self.rows if not row.passed)


# --------------------------------------------------------------------------------------------
# Judging values


def evaluate(
    rules: Sequence[Rule],
    values: Mapping[str, MetricValue],
    baseline: Mapping[str, MetricValue] | None,
    judge: str = "estimate",
) -> Verdict:
    """Judge every bound of ``rules`` on ``values`` (keys as :attr:`Rule.key`).

    * ``max``: passes when value ≤ max; ``min``: when value ≥ min (a value exactly at the bound
      passes).
    * ``max_increase``: change = value − baseline, passes when change ≤ bound.
    * ``max_rel_increase``: change = (value − baseline)/|baseline|, passes when change ≤ bound; a
      zero baseline gives change 0 when the value is 0 too and ±∞ otherwise (any increase from 0
      fails).
    * ``max_decrease``: change = value − baseline, passes when change ≥ −bound;
      ``max_rel_decrease``: change = (value − baseline)/|baseline|, passes when change ≥ −bound
      (any decrease from a zero baseline fails).
    * A missing or non-finite value fails; a change bound with no baseline value (no baseline
      given, or the metric missing or non-finite in it) fails with reason ``no baseline``.

    * A ``max``/``min`` bound on a calibration metric with a 95 % interval [lo, hi] (a
      bootstrap's) is judged as ``judge`` says: ``interval``: ``max`` fails only when
      lo > max, ``min`` only when hi < min; ``whole-interval``: ``max`` passes only when
      hi ≤ max, ``min`` only when lo ≥ min; ``estimate``: on the value. The row's reason says
      where the interval and the value disagree. The trace and the change bounds are judged on
      the value.
    * ``require_improvement``: the value under :attr:`Rule.improvement_key` is
      metric(uncalibrated) − metric(stage) with its paired bootstrap interval; passes when the
      interval's lower end is above 0 (an interval touching 0 is no significant improvement);
      no interval fails with reason ``no paired interval``. The row's ``metric`` is the
      improvement key, its ``limit`` 0.

    One row per bound, in the order of ``rules`` and :data:`BOUNDS`, then the improvement.
    """
    rows: list[VerdictRow] = []
    for rule in rules:
        measured = values.get(rule.key)
        value = finite_value(measured.value if measured else None)
        interval = measured.interval if measured else None
        old = baseline.get(rule.key) if baseline is not None else None
        base = finite_value(old.value if old else None)
        for bound in BOUNDS:
            limit = getattr(rule, bound)
            if limit is None:
                continue
            change: float | None = None
            if value is None:
                passed = False
                reason = "not in the report" if measured is None else "value is not finite"
            elif bound in ("max", "min"):
                judged = interval if rule.metric in CALIBRATION_METRICS else None
                passed, reason = _absolute(bound, limit, value, judged, judge)
            elif base is None:
                passed, reason = False, "no baseline"
            else:
                change = _relative(value, base) if bound in _RELATIVE_BOUNDS else value - base
                if bound in ("max_increase", "max_rel_increase"):
                    passed = change <= limit
                    reason = "" if passed else "increase too large"
                else:
                    passed = change >= -limit
                    reason = "" if passed else "decrease too large"
            shown_base = base if bound in CHANGE_BOUNDS else None
            rows.append(
                VerdictRow(
                    metric=rule.key,
                    bound=bound,
                    limit=limit,
                    value=value,
                    interval=interval,
                    baseline=shown_base,
                    change=change,
                    passed=passed,
                    reason=reason,
                )
            )
        if rule.require_improvement:
            rows.append(_improvement_row(rule, values.get(rule.improvement_key)))
    return Verdict(passed=all(row.passed for row in rows), rows=tuple(rows))


def _absolute(
    bound: str, limit: float, value: float, interval: tuple[float, float] | None, judge: str
) -> tuple[bool, str]:
    """A ``max``/``min`` bound judged on ``value`` or on ``interval`` (see :func:`evaluate`):
    whether it passed, and the note saying in words what passed and why (empty only for a
    value without an interval that passed). ``estimate`` judges the value and says what the
    interval shows; ``interval`` passes what is not shown beyond the bound; ``whole-interval``
    passes only what is shown within it."""
    word = "above max" if bound == "max" else "below min"
    within = "below max" if bound == "max" else "above min"
    on_value = value <= limit if bound == "max" else value >= limit
    if interval is None:
        return on_value, "" if on_value else word
    low, high = interval
    shown_beyond = low > limit if bound == "max" else high < limit
    shown_within = high <= limit if bound == "max" else low >= limit
    if judge == "estimate":
        if on_value:
            if shown_within:
                return True, f"value {within}, shown: whole 95% interval {within}"
            return True, f"value {within}, not shown: 95% interval reaches {word}"
        if shown_beyond:
            return False, f"value {word}, shown: whole 95% interval {word}"
        return False, f"value {word}, not shown: 95% interval reaches {within}"
    if shown_beyond:
        return False, f"shown {word}: whole 95% interval {word}"
    if shown_within:
        return True, f"shown {within}: whole 95% interval {within}"
    if judge == "interval":  # passes what is not shown beyond the bound
        if on_value:
            return True, f"not shown {word}: 95% interval reaches across the bound"
        return True, f"value {word}, not shown {word}: 95% interval reaches across the bound"
    if on_value:  # whole-interval: passes only what is shown within the bound
        return False, f"value {within}, not shown {within}: 95% interval goes {word}"
    return False, f"{word}, not shown {within}: 95% interval goes {word}"


def _improvement_row(rule: Rule, measured: MetricValue | None) -> VerdictRow:
    """The verdict on ``rule``'s required improvement over uncalibrated."""
    value = finite_value(measured.value if measured else None)
    interval = measured.interval if measured else None
    if value is None:
        passed, reason = False, "not in the report" if measured is None else "not finite"
    elif interval is None:
        passed, reason = False, "no paired interval (set bootstrap)"
    else:
        passed = interval[0] > 0.0
        reason = "" if passed else "improvement not significant"
    return VerdictRow(
        metric=rule.improvement_key,
        bound=IMPROVEMENT,
        limit=0.0,
        value=value,
        interval=interval,
        baseline=None,
        change=None,
        passed=passed,
        reason=reason,
    )


def finite_value(value: float | None) -> float | None:
    """``value`` as a float when it is a finite number, else ``None`` (booleans are no numbers)."""
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _relative(value: float, base: float) -> float:
    if base == 0.0:
        return 0.0 if value == 0.0 else math.copysign(math.inf, value)
    return (value - base) / abs(base)
