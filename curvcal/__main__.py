"""`python -m curvcal` (also what `torchrun -m curvcal` runs).

``python -m`` puts the working directory first on ``sys.path``, so a file there named like a
module curvcal imports later (``tomllib.py``, ``json.py``) would be imported and run in its
place. The entry is dropped before anything else is imported; a folder of your own modules
(``py:`` architectures and datasets) goes on ``PYTHONPATH``, which is kept.

Ctrl-C is taken over right after (see :mod:`curvcal.interrupt`): an interrupt during the imports
of click, numpy or torch ends the run with exit 130 like any other, instead of surfacing as a
half-imported module's error.
"""

import os
import sys


def _drop_working_directory() -> None:
    """Remove the working-directory entry ``python -m`` put first on ``sys.path`` (not one the
    user named in ``PYTHONPATH``, which comes after it; nothing under ``python -P``)."""
    if sys.flags.safe_path or not sys.path:
        return
    first = sys.path[0]
    try:
        here = os.getcwd()
    except OSError:  # a working directory that was removed: nothing can be imported from it
        here = None
    if first in ("", ".") or (here is not None and os.path.abspath(first) == here):
        del sys.path[0]


if __name__ == "__main__":
    _drop_working_directory()

    from curvcal import interrupt

    interrupt.install()

    from curvcal.cli import run

    run()
