"""Sizes typed as text: a memory budget in bytes with a unit, or a share of the free memory;
and the host memory such a share is taken of.

Torch-free, so that settings can be checked before any model is loaded.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from curvcal.errors import SettingsError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class MemoryBudget:
    """A budget in ``bytes``, or as a ``fraction`` (0 < f ≤ 1) of the free memory."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, free: int | None) -> int | None:
        """Bytes, given the free memory (``None`` when unknown: a fraction then resolves to None)."""
        if self.bytes is not None:
            return self.bytes
        if self.fraction is None or free is None:
            return None
        return int(free * self.fraction)


def parse_memory_budget(text: str | int | MemoryBudget) -> MemoryBudget:
    """``"4GiB"``, ``"512MB"``, ``"1.5G"``, ``"2000000"`` (bytes) or ``"50%"`` (of the free
    memory) as a :class:`MemoryBudget`; decimal units are powers of 10, ``KiB``/``MiB``/``GiB``/
    ``TiB`` powers of 2. Raises :class:`~curvcal.errors.SettingsError` (``memory_budget``) for anything else, zero or a
    share above 100%."""
    if isinstance(text, MemoryBudget):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise SettingsError("memory_budget", f"must be at least 1 byte, got {text}")
        return MemoryBudget(bytes=text)
    hint = "give bytes with a unit (4GiB, 512MB) or a share of the free memory (50%)"
    match = _BUDGET.match(text) if isinstance(text, str) else None
    if match is None:
        raise SettingsError("memory_budget", f"cannot read {text!r}", hint)
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        if not 0 < number <= 100:
            raise SettingsError(
                "memory_budget", f"a share must be in (0%, 100%], got {text!r}", hint
            )
        return MemoryBudget(fraction=number / 100)
    if unit not in _UNITS:
        raise SettingsError("memory_budget", f"unknown unit {match.group(2)!r} in {text!r}", hint)
    value = number * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise SettingsError("memory_budget", f"must be at least 1 byte, got {text!r}", hint)
    return MemoryBudget(bytes=int(value))


def host_memory(pages: str = "SC_AVPHYS_PAGES") -> int | None:
    """Bytes of host memory available to a new allocation: ``MemAvailable`` of /proc/meminfo on
    Linux, elsewhere ``os.sysconf(pages)`` pages (``SC_AVPHYS_PAGES`` the free ones,
    ``SC_PHYS_PAGES`` all of them); ``None`` when the system says neither."""
    try:
        with open("/proc/meminfo", encoding="ascii") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf(pages)) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
