"""Progress hooks: the one type every long computation reports its progress through.

A hook is called with the count done so far (products, probes, steps or modules, as the
function that takes it documents); a staged computation also names the stage running. Both are
optional arguments: ``None`` means nobody is listening. Kernels call them, never print. A hook
may raise :class:`Stopped` to end a staged computation early with the stages it finished.
"""

from __future__ import annotations

from collections.abc import Callable

OnStep = Callable[[int], None] | None
"""Progress of one computation: the count done so far, or ``None`` for no hook."""

OnStageStep = Callable[[str, int], None] | None
"""Progress of a staged computation: the stage running and the count done so far in all stages,
or ``None`` for no hook."""


#: The stage name of the warm start's products (:mod:`curvcal.curvature.warm_start`), made on
#: a sample of the data: each costs about the sample's share of a full product.
WARM_STAGE = "warm start"


class Stopped(Exception):
    """Raised by a progress hook to stop a staged computation between products (Ctrl-C in
    the CLI). The computation raises it again with ``finished``, the result of the stages it
    finished (``None`` if none), and ``stage``, the one it stopped in."""

    def __init__(self, finished: object = None, stage: str = "") -> None:
        super().__init__(stage)
        self.finished = finished
        self.stage = stage
