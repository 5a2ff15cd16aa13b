"""Atomic file output: a reader sees the old file or the whole new one, never half of one.

Two rules beyond atomicity:

* **exclusive creation.** An output the CLI checked without ``--force`` (see
  :func:`mark_output`) is published with ``os.link`` from its temporary file, which fails
  when the name exists: a file that appeared while the run worked (another run with the same
  ``-o``, say) is never replaced, and of two concurrent runs exactly one wins; the other stops
  with "already exists". Elsewhere (``--force``, or the library used directly) the file is
  replaced with ``os.replace``.
* **modes.** A replaced file keeps its permission bits (a private, mode-600 report stays
  private); a new file gets 0666 less the umask, as any new file would.

A temporary file is removed on SIGTERM as on Ctrl-C. In a CLI run :mod:`curvcal.interrupt`
handles SIGTERM for the whole run (temporary files and outputs alike); elsewhere, while a
temporary file exists, SIGTERM raises :class:`Terminated` in the main thread (the same clean-up
path as an error), then the signal is delivered again to the handler that was in place before,
so the process still ends by it.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from curvcal import inputs, interrupt
from curvcal.errors import InputError

#: resolved paths that must be created, never replaced (checked without ``--force``)
_EXCLUSIVE: set[Path] = set()


class Terminated(BaseException):
    """SIGTERM arrived while a temporary output file existed (raised to clean it up)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _key(path: Path) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


def mark_output(path: Path, replace: bool) -> None:
    """Record how the write at the end of the run publishes ``path``: ``replace=False`` (checked
    to be absent, no ``--force``) creates it exclusively, so :func:`atomic_output` refuses a
    file that took the name in the meantime; ``replace=True`` (``--force``) replaces it."""
    if replace:
        _EXCLUSIVE.discard(_key(path))
    else:
        _EXCLUSIVE.add(_key(path))


@contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary stream whose content replaces ``path`` when the block ends without error.

    The bytes go to a temporary file in the same directory, are flushed to disk, given the
    permissions of the file they replace (or, for a new file, 0666 less the umask; ``mkstemp``
    alone would leave them private), and moved into place: with ``os.link`` when ``path`` was
    marked by :func:`mark_output` (an :class:`InputError` "already exists" when a file
    took the name meanwhile), else with ``os.replace``. Both files are registered with
    :mod:`curvcal.interrupt`, which removes them if the run is interrupted or fails before its
    exit code is decided. On any error, Ctrl-C and SIGTERM included, the temporary file is
    removed and ``path`` is untouched; an operating-system
    error (no such folder, no permission, disk full) becomes an :class:`InputError` naming
    ``path``. A ``path`` that exists and is not a regular file (a symbolic link, a device, a
    pipe, a socket, a folder) is refused before anything is written: replacing it would destroy
    it, not write through it. So is a ``path`` that is an input of the run or lies inside an
    input folder (:func:`curvcal.inputs.refuse_output`), whatever ``--force`` says.
    """
    parent = path.parent if str(path.parent) else Path(".")
    refuse_special(path)
    inputs.refuse_output(path)  # an input of the run, whenever it was opened: never replaced
    with _terminate_raises():
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
            with interrupt.held():  # the output and its registration appear together
                replaced = _publish(Path(temp_name), path)
                interrupt.temporary_gone(temp_name)
                interrupt.output_written(path, replaced)
        except BaseException as error:
            Path(temp_name).unlink(missing_ok=True)
            interrupt.temporary_gone(temp_name)
            if isinstance(error, OSError):
                raise _cannot_write(path, error) from error
            raise


def _publish(temp: Path, path: Path) -> str | None:
    """Move the finished ``temp`` to ``path``: exclusively when so marked, else replacing.
    Returns the name of a hard link to the file replaced, inside a CLI run (None otherwise)."""
    if _key(path) not in _EXCLUSIVE:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
            old = None
        else:
            old = _link_old(path) if interrupt.active() else None
        os.chmod(temp, mode)
        try:
            os.replace(temp, path)
        except BaseException:
            if old is not None:
                Path(old).unlink(missing_ok=True)
            raise
        return old
    os.chmod(temp, 0o666 & ~_umask())
    try:
        os.link(temp, path)
    except FileExistsError:
        raise _created_meanwhile(path) from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        return _publish_without_links(temp, path)
    temp.unlink()
    return None


def _link_old(path: Path) -> str | None:
    """A hidden hard link beside ``path`` to the file it names, which a failed run puts back
    (:func:`curvcal.interrupt.discard`): with ``--force`` the old file is replaced only once
    the run has ended with a result. None where the file system has no hard links (there the
    old file is replaced at once, as before)."""
    for _ in range(16):
        name = path.parent / f"{temp_prefix(path)}{secrets.token_hex(4)}.old"
        try:
            os.link(path, name)
        except FileExistsError:
            continue
        except OSError:
            return None
        return str(name)
    return None


def _created_meanwhile(path: Path) -> InputError:
    """The error for an output that another process created while this run worked."""
    return InputError(
        str(path),
        "already exists (it was created while this run worked)",
        "pass --force to overwrite it, or name another file",
    )


def _publish_without_links(temp: Path, path: Path) -> str | None:
    """Where hard links are not supported: claim the name with ``O_EXCL``, then replace the
    (empty) claimed file with the finished one."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise _created_meanwhile(path) from None
    os.replace(temp, path)
    return None


@contextmanager
def _terminate_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` (so ``finally`` and ``except``
    clauses clean up); afterwards the previous handler is restored and, when the signal came,
    it is delivered again so the process ends as it would have. Nothing changes outside the
    main thread, where SIGTERM is ignored, or where :mod:`curvcal.interrupt` handles it (a CLI
    run: its handler honours :func:`~curvcal.interrupt.held` and removes every registered file;
    raising here instead, between creating a temporary file and registering it, lost it)."""
    if threading.current_thread() is not threading.main_thread() or interrupt.handles_terminate():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return

    def raise_terminated(_signum: int, _frame: FrameType | None) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


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
