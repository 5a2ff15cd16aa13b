"""Progress hooks: the one type every long computation reports its progress through.

A hook is called with the count done so far (products, probes, steps or modules, as the
function that takes it documents); a staged computation also names the stage running. Both are
optional arguments: ``None`` means nobody is listening. Kernels call them, never print.
"""

from __future__ import annotations

from collections.abc import Callable

OnStep = Callable[[int], None] | None
"""Progress of one computation: the count done so far, or ``None`` for no hook."""

OnStageStep = Callable[[str, int], None] | None
"""Progress of a staged computation: the stage running and the count done so far in all stages,
or ``None`` for no hook."""
