"""A fixture factory shared by the tests of the cell lookups (top-label histogram bins and
top-label isotonic interpolation): every test runs twice, once with the cell lookup taken at
every size (the test data are small) and once as shipped (numpy's own search below the
module's threshold)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


def cell_path_at_every_size(module: ModuleType, threshold: str) -> Callable[..., None]:
    """An autouse fixture, parametrised ``cells`` / ``as-shipped``, that sets ``module``'s
    ``threshold`` (the fewest scores that take the cell lookup) to 0 for ``cells``."""

    @pytest.fixture(autouse=True, params=["cells", "as-shipped"])
    def fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
        if request.param == "cells":
            monkeypatch.setattr(module, threshold, 0)

    return fixture
