"""Atomic file output: a reader sees the old file or the whole new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from curvcal.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary stream whose content replaces ``path`` when the block ends without error.

    The bytes go to a temporary file in the same directory, are flushed to disk, given the
    permissions an ordinary new file would get (0666 less the umask; ``mkstemp`` alone would
    leave them private), and moved into place with ``os.replace``. On any error, Ctrl-C
    included, the temporary file is removed and ``path`` is untouched; an operating-system
    error (no such folder, no permission, disk full) becomes an :class:`InputError` naming
    ``path``.
    """
    parent = path.parent if str(path.parent) else Path(".")
    try:
        handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as error:
        raise _cannot_write(path, error) from error
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())
        os.replace(temp_name, path)
    except BaseException as error:
        Path(temp_name).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _cannot_write(path, error) from error
        raise


def _cannot_write(path: Path, error: OSError) -> InputError:
    return InputError(str(path), f"cannot be written: {error.strerror or error}")
