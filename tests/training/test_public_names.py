"""``curvcal.training``'s public names are the objects themselves, whatever was imported before."""

from __future__ import annotations

import importlib
import inspect


def test_measure_is_the_function_even_after_its_module_was_imported() -> None:
    """Importing the module that defines ``measure`` (as the callbacks do) must not put the
    module in the function's place: ``from curvcal.training import measure`` is callable."""
    module = importlib.import_module("curvcal.training.measurement")
    from curvcal.training import QUANTITIES, measure

    assert inspect.isfunction(measure) and measure is module.measure
    assert QUANTITIES is module.QUANTITIES
