"""Optional dependencies, imported only when a file needs them."""

from __future__ import annotations

from typing import Any

from curvcal.errors import InputError


def require(extra: str, module: str, needed_by: str) -> Any:
    """Import ``module`` (``transformers``, ``timm``, ``pyarrow``...) or raise
    :class:`InputError` naming ``needed_by`` (the file or option that needs it) and the
    optional extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(
            needed_by,
            f"needs {module}, which is not installed ({exc})",
            f"pip install 'curvcal[{extra}]'",
        ) from None
