"""The pace of countable work: the time left, revised as units finish, and the plain progress
lines written where no bar can be drawn (stderr not a terminal: a CI log, a pipe).

The estimate of the time left is (total − done) × (seconds per unit), the seconds per unit
measured from the first report of the current stage on (the first report comes after the first
unit, so loading and the setup before it are not counted), so it is revised at every report and
follows a stage whose units cost more or less than the last one's.

Part of a plan may be a typical count rather than a known one (the products an eigenvalue
solver needs depend on the spectrum): ``typical`` of the total, done first. While some of it is
left the time left is said as a range, that part counted at :data:`TYPICAL_LOW` to
:data:`TYPICAL_HIGH` times its typical size (``at least`` the low end when the plan says its
count has no such bound: power iteration converges at the unknown rate |λ2/λ1|). The units of
stages not yet begun (past ``stage_end``) may cost more or less than the current stage's: they
are counted at :data:`LATER_LOW` to :data:`LATER_HIGH` times its pace. A total that
the work outgrows is no longer a forecast: the count is said against the plan, with the time
left not known, rather than a false "0 s left".

Nothing here imports torch or rich; the clock is an argument, so tests drive it by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

#: a plain line at least every this fraction of the total, and every this many seconds
LINE_FRACTION = 0.1
LINE_SECONDS = 30.0
#: off a terminal, nothing is written in a run's first seconds (see Reporter._plain)
PLAIN_GRACE_SECONDS = 5.0
#: the span of a typical count's products, as fractions of it (Lanczos to 1e-3 on the
#: benchmark models: 0.43× to 1.1× of its typical 10 + 3k steps; benchmarks/bench_forecast.py)
TYPICAL_LOW = 0.4
TYPICAL_HIGH = 2.0
#: the span of a later stage's cost per unit, as fractions of the current stage's (ResNet-18 on
#: a CPU: a Hutchinson probe of a block cost 1.9× a Lanczos product; benchmarks/bench_forecast.py)
LATER_LOW = 0.5
LATER_HIGH = 2.0


def duration_text(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2.5 h``: a length of time at the precision a forecast has."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Pace:
    """Units done against a total (``None``: not countable), and the time left."""

    def __init__(
        self,
        total: int | None,
        clock: Clock = time.monotonic,
        typical: int = 0,
        typical_bounded: bool = True,
        stage_end: int | None = None,
    ) -> None:
        self._planned = total
        self._typical = typical
        self._typical_bounded = typical_bounded
        self._stage_end = stage_end
        self._clock = clock
        self.done = 0
        self._first: tuple[float, int] | None = None
        self._last: tuple[float, int] | None = None

    @property
    def total(self) -> int | None:
        """The planned total, or the count done once the work outgrew it."""
        if self._planned is None:
            return None
        return max(self._planned, self.done)

    def plan(
        self,
        total: int | None,
        typical: int = 0,
        typical_bounded: bool = True,
        stage_end: int | None = None,
    ) -> None:
        """A new total (the run resolved a setting that changes the work); ``typical`` of it,
        done first, is a typical count, within :data:`TYPICAL_HIGH` times itself when
        ``typical_bounded``; the units past ``stage_end`` (``None``: none) are of stages not
        yet begun."""
        self._planned = total
        self._typical = typical
        self._typical_bounded = typical_bounded
        self._stage_end = stage_end

    @property
    def outgrown(self) -> bool:
        """Whether more units are done than were planned (the plan is no forecast now)."""
        return self._planned is not None and self.done > self._planned

    def update(self, done: int) -> None:
        """``done`` units are finished now."""
        now = self._clock()
        self.done = done
        if self._first is None:
            self._first = (now, done)
        self._last = (now, done)

    def restart(self) -> None:
        """A new stage begins, whose units may cost more or less (a per-layer block's product
        is cheaper than a whole-model one): measure the pace again from the next report on,
        keeping the last one until two reports of the new stage have measured it."""
        self._previous = self.seconds_per_unit()
        self._first = None

    _previous: float | None = None

    def seconds_per_unit(self) -> float | None:
        """Seconds per unit since the first report of the stage (the previous stage's before
        two reports; None before any pace is measured)."""
        if self._first is None or self._last is None or self._last[1] <= self._first[1]:
            return self._previous
        (t0, n0), (t1, n1) = self._first, self._last
        return (t1 - t0) / (n1 - n0)

    def remaining(self) -> float | None:
        """Seconds left at the measured pace (None while it is not measured or not countable)."""
        per_unit = self.seconds_per_unit()
        total = self.total
        if per_unit is None or total is None:
            return None
        return max(total - self.done, 0) * per_unit

    def remaining_range(self) -> tuple[float, float | None] | None:
        """(fewest, most) seconds left at the measured pace, the typical part of the plan
        still to do counted at :data:`TYPICAL_LOW` and :data:`TYPICAL_HIGH` times its size
        (most ``None``: no bound) and the other units of stages not yet begun at
        :data:`LATER_LOW` and :data:`LATER_HIGH` times the pace; None while the pace is not
        measured or not countable, or once the work outgrew its plan."""
        per_unit = self.seconds_per_unit()
        if per_unit is None or self._planned is None or self.outgrown:
            return None
        typical_left = max(self._typical - self.done, 0)
        stage_end = self._planned if self._stage_end is None else self._stage_end
        later_left = max(self._planned - max(stage_end, self._typical, self.done), 0)
        known_left = max(self._planned - self.done - typical_left - later_left, 0)
        low = (known_left + TYPICAL_LOW * typical_left + LATER_LOW * later_left) * per_unit
        if not self._typical_bounded and typical_left:
            return low, None
        high = known_left + TYPICAL_HIGH * typical_left + LATER_HIGH * later_left
        return low, high * per_unit

    def text(self) -> str:
        """``24/114`` and, once measured, ``about 3 min left``; ``about 20 s to 2 min left``
        (or ``at least 20 s left``) while a typical count is left to do; ``130 (40 planned),
        time left not known`` once the work outgrew its plan."""
        if self.outgrown:
            return f"{self.done} ({self._planned} planned), time left not known"
        count = f"{self.done}" if self.total is None else f"{self.done}/{self.total}"
        span = self.remaining_range()
        if span is None:
            return count
        low, high = span
        if high is None:
            return f"{count}, at least {duration_text(low)} left"
        if duration_text(low) == duration_text(high):
            return f"{count}, about {duration_text(low)} left"
        return f"{count}, about {duration_text(low)} to {duration_text(high)} left"


class PlainLines:
    """Progress as plain lines for a stream that is not a terminal: one when the stage
    changes, then one each time :data:`LINE_FRACTION` more of the total is done or
    :data:`LINE_SECONDS` have passed since the last line, whichever comes first. A ``write``
    that returns False held the line back: it is due again at the next report. A revised
    total goes to its ``pace`` (:meth:`Pace.plan`)."""

    def __init__(
        self,
        description: str,
        total: int | None,
        write: Callable[[str], bool | None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.pace = Pace(total, clock)
        self._clock = clock
        self._write = write
        self._description = description
        self._last_time = clock()
        self._last_done = 0
        self._said_stage = False

    def describe(self, description: str) -> None:
        if description != self._description:
            self._description = description
            self._said_stage = False
            self.pace.restart()

    def advance(self, units: int) -> None:
        self.update(self.pace.done + units)

    def update(self, done: int) -> None:
        self.pace.update(done)
        now = self._clock()
        total = self.pace.total
        step = None if not total else max(1, int(total * LINE_FRACTION))
        due = (
            not self._said_stage
            or now - self._last_time >= LINE_SECONDS
            or (step is not None and done - self._last_done >= step)
        )
        if due:
            self._line(now)

    def finish(self) -> None:
        """The last count, unless the last line already said it."""
        if self.pace.done != self._last_done or not self._said_stage:
            self._line(self._clock())

    def _line(self, now: float) -> None:
        if self._write(f"curvcal: {self._description}: {self.pace.text()}") is False:
            return  # held back (the run's first seconds): due again at the next report
        self._last_time = now
        self._last_done = self.pace.done
        self._said_stage = True
