"""Atomic file output: a reader sees the old file or the whole new one, never half of one."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from curvcal import interrupt
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
    leave them private), and moved into place with ``os.replace``. Both files are registered
    with :mod:`curvcal.interrupt`, which removes them if the run is interrupted or fails before
    its exit code is decided. On any error, Ctrl-C included, the temporary file is removed and
    ``path`` is untouched; an operating-system
    error (no such folder, no permission, disk full) becomes an :class:`InputError` naming
    ``path``. A ``path`` that exists and is not a regular file (a symbolic link, a device, a
    pipe, a socket, a folder) is refused before anything is written: replacing it would destroy
    it, not write through it.
    """
    parent = path.parent if str(path.parent) else Path(".")
    refuse_special(path)
    try:
        with interrupt.held():
            handle, temp_name = tempfile.mkstemp(
                prefix=temp_prefix(path), suffix=".tmp", dir=parent
            )
            interrupt.temporary_created(temp_name)
    except OSError as error:
        raise _cannot_write(path, error) from error
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())
        with interrupt.held():  # the output and its registration appear together
            os.replace(temp_name, path)
            interrupt.temporary_gone(temp_name)
            interrupt.output_written(path)
    except BaseException as error:
        Path(temp_name).unlink(missing_ok=True)
        interrupt.temporary_gone(temp_name)
        if isinstance(error, OSError):
            raise _cannot_write(path, error) from error
        raise


def refuse_special(path: Path) -> None:
    """Refuse an output ``path`` that exists and is not a regular file (a symbolic link, a
    folder, a device, a pipe, a socket), or whose name the system cannot take, with an
    :class:`InputError` naming it: an atomic write would replace such a file, not write into it."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as error:  # a name too long, a folder that cannot be searched
        raise _cannot_write(path, error) from error
    if stat.S_ISDIR(mode):
        raise InputError(str(path), "is a directory", "give a file name")
    if not stat.S_ISREG(mode):
        raise InputError(
            str(path),
            f"is {_kind(mode)}, not a regular file; curvcal writes its outputs only to new or "
            "regular files, which it replaces whole",
        )


def temp_prefix(path: Path) -> str:
    """The name a temporary file beside ``path`` starts with: hidden, and short enough that the
    whole name fits where ``path``'s does."""
    return f".{path.name[:32]}."


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def _cannot_write(path: Path, error: OSError) -> InputError:
    return InputError(str(path), f"cannot be written: {error.strerror or error}")
