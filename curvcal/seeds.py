"""Random generators from seeds: every seed a user gives reaches torch through here.

A seed is an integer in [−2⁶³, 2⁶³ − 1] (torch's and numpy's generators take 64 bits; a bool, a
float, a string or a larger integer is refused as :class:`~curvcal.errors.SettingsError` naming
the argument, instead of torch's own error from inside a kernel).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from curvcal.errors import SettingsError
from curvcal.settings.hessian import MAX_SEED


def checked_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int when it is an integer in [−2⁶³, 2⁶³ − 1] (a NumPy integer included),
    else :class:`SettingsError` naming ``name``."""
    if isinstance(seed, bool):
        raise SettingsError(name, f"must be an integer, got {seed!r}")
    try:
        value = operator.index(seed)
    except TypeError:
        raise SettingsError(name, f"must be an integer, got {seed!r}") from None
    if not -MAX_SEED - 1 <= value <= MAX_SEED:
        raise SettingsError(name, f"must lie in [-2**63, 2**63-1], got {value}")
    return value


def seeded_generator(seed: Any, name: str = "seed") -> torch.Generator:
    """A CPU generator seeded with ``seed`` (:func:`checked_seed`)."""
    return torch.Generator().manual_seed(checked_seed(seed, name))
