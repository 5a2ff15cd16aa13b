"""The settings of ``curvcal check`` alone: how a bound is judged when its value carries a
95 % interval (a calibration metric measured with ``bootstrap``), declared once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from curvcal.settings.fields import Settings, setting

#: ``judge``'s words: ``interval``: a bound fails only when the whole interval is beyond it;
#: ``whole-interval``: a bound passes only when the whole interval is within it;
#: ``estimate``: the bound is judged on the value alone.
JUDGES = ("estimate", "interval", "whole-interval")


@dataclass(frozen=True)
class CheckSettings(Settings):
    """How a check judges a ``max``/``min`` bound on a calibration metric that carries a 95 %
    bootstrap interval [lo, hi] (``bootstrap`` > 0; ECE, AdaECE, MCE and NLL):

    * ``interval``: ``max`` fails when lo > max, ``min`` fails when hi < min (the whole
      interval is beyond the bound);
    * ``whole-interval``: ``max`` passes when hi ≤ max, ``min`` passes when lo ≥ min (the
      whole interval is within the bound);
    * ``estimate`` (the default): the value, as for every metric without an interval; the
      note says whether the interval shows the value's side of the bound. Chosen from the
      false-pass and false-fail rates simulated in docs/guide/check.md: at N = 500 ``interval``
      passed every model 25% over a bound and ``whole-interval`` failed every calibrated one.

    Change bounds (``max_increase``, ...) are judged on the values: the interval of a change
    is not measured. The trace is judged on its estimate.
    """

    GROUP: ClassVar[str] = "check"

    judge: str = setting(
        "estimate",
        "How a bound on a metric with a bootstrap interval is judged: estimate (the value; the "
        "note says what the interval shows), interval (fails only when the whole 95% interval "
        "is beyond it) or whole-interval (passes only when the whole interval is within it).",
        choices=JUDGES,
        policy=True,
    )
