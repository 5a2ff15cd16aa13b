"""Check that a path names a file curvcal can read, with one precise message per failure.

Every loader of a user's file (checkpoints, tensor and logits files, calibrators, policies,
reports) calls :func:`readable_file` before reading, so a symbolic-link loop, a permission
problem, a directory or a missing file is told apart the same way everywhere. The same call
records the file as an input of the run (:func:`curvcal.inputs.record`), so whatever a loader
reads through it is protected from the run's outputs without a list of its own; a loader that
hands a whole folder to a library records that folder with :func:`readable_folder`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from curvcal import inputs
from curvcal.errors import InputError


def path_argument(value: object, name: str) -> Path:
    """``value`` as a :class:`~pathlib.Path` when it names a file (a ``str`` or an
    ``os.PathLike``), else :class:`InputError` naming the Python argument ``name``."""
    if isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
        return Path(value)
    raise InputError(name, f"must be a file path (a str or a pathlib.Path), got {value!r}")


def readable_file(path: Path, noun: str = "file", expected: str | None = None) -> os.stat_result:
    """``path``'s status when it is a regular file this process may read; otherwise
    :class:`InputError` naming the path and saying which of these it is: missing (or a broken
    symbolic link), a symbolic-link loop, unreadable (permission denied), a directory, not a
    regular file (a FIFO, socket or device), a path through something that is not a folder, or
    a path too long for the file system. ``noun`` names the file in "no such ..." (``policy
    file``), ``expected`` what a directory is not (default ``noun``). A readable file is
    recorded as an input of the run, in the role ``expected`` (else ``noun``)."""
    what = str(path)
    try:
        status = path.stat()
    except OSError as exc:
        raise InputError(what, _why(path, exc, noun)) from None
    if stat.S_ISDIR(status.st_mode):
        raise InputError(what, f"is a directory, not a {expected or noun}")
    if not stat.S_ISREG(status.st_mode):
        raise InputError(what, "is not a regular file (a FIFO, socket or device)")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InputError(what, _why(path, exc, noun)) from None
    inputs.record(path, expected or noun)
    return status


def readable_folder(path: Path, role: str) -> Path:
    """``path``, recorded as an input folder of the run read as ``role`` (``model folder``,
    ``tokenizer folder``): a library reads the files beneath it by itself, and no output may be
    written there. Nothing is checked here: the loaders tell a missing folder in their own
    words."""
    inputs.record(path, role)
    return path


def read_text_file(path: Path, noun: str) -> str:
    """The UTF-8 text of the file ``path`` (a ``noun``: ``policy``, ``report``), checked by
    :func:`readable_file` first; :class:`InputError` naming the path when it cannot be read or
    decoded. A byte-order mark an editor put first (Windows Notepad's) is not part of the
    text: tomllib read it as "Invalid statement (at line 1, column 1)"."""
    readable_file(path, f"{noun} file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read the {noun}: {exc}") from None


def _why(path: Path, exc: OSError, noun: str) -> str:
    if exc.errno == errno.ENOENT:
        if path.is_symlink():
            return f"is a broken symbolic link (it points to {os.readlink(path)}, which does not exist)"
        return f"no such {noun}"
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop (too many levels of symbolic links)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied: this user may not read it"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path before the file name is not a directory"
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is too long for the file system"
    return f"cannot be read ({exc.strerror or type(exc).__name__})"
