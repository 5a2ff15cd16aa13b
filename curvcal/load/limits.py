"""Sizes checked before anything is allocated for them, so that a small file or option cannot
ask for more memory than there is (an out-of-memory kill, or an hour of swapping, otherwise).

- ``num_classes``: a classifier head of at most :data:`~curvcal.settings.checkpoint.MAX_CLASSES` rows.
- Zip archives (``.npz``, ``torch.save`` files, TorchScript and exported programs): every
  member's uncompressed size is in the archive's central directory, and every reader (Python's
  ``zipfile``, torch's and numpy's) allocates or reads at most that much for it. :func:`open_zip`,
  the one way curvcal opens an archive, refuses one whose members would inflate in all to more
  than :func:`inflation_limit` of its size (a few megabytes of deflated zeros declaring
  gigabytes) before any member is read; so is a ``.npy`` member whose header claims a larger
  array than the member holds.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from curvcal.errors import InputError
from curvcal.settings.checkpoint import MAX_CLASSES
from curvcal.settings.sizes import host_memory

_GIB = 2**30


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (``MemAvailable`` on Linux, else the
    physical memory); ``None`` when the system does not say."""
    return host_memory("SC_PHYS_PAGES")


#: the most an archive may inflate to, as a multiple of its size: ``torch.save`` stores its
#: members uncompressed (1×) and ``numpy.savez_compressed`` of scores or labels inflates a few
#: times; deflate itself reaches about 1,032× only on runs of one byte, which is what a zip
#: bomb is made of
MAX_INFLATION = 100
#: an archive that inflates to at most this many bytes in all is read whatever its ratio
#: (a small file of repeated values harms nobody)
SMALL_INFLATED = 64 * 2**20


def inflation_limit(file_size: int, available: int | None) -> int:
    """The most bytes an archive of ``file_size`` bytes may inflate to: ``MAX_INFLATION``
    times its size (at least ``SMALL_INFLATED``), and never more than the ``available``
    memory (``None``: no bound known)."""
    bound = max(SMALL_INFLATED, MAX_INFLATION * file_size)
    return bound if available is None else min(bound, available)


def open_zip(path: Path) -> zipfile.ZipFile:
    """``path`` opened as a zip archive, after its members' declared sizes are checked against
    :func:`inflation_limit`: an :class:`InputError` naming ``path`` and its largest member when
    they add up to more. A file that is not a zip raises :class:`zipfile.BadZipFile` (and an
    unreadable one :class:`OSError`), as ``zipfile.ZipFile`` does."""
    archive = zipfile.ZipFile(path)
    try:
        _refuse_inflation(path, archive.infolist(), available_memory())
    except BaseException:
        archive.close()
        raise
    return archive


def check_zip_sizes(path: Path) -> None:
    """:func:`open_zip`'s check alone, for readers that open the archive themselves
    (``torch.load``, ``numpy.load``); a file that is not a readable zip passes (the format's
    own reader says what is wrong with it)."""
    try:
        open_zip(path).close()
    except (zipfile.BadZipFile, OSError, ValueError):
        return


def _refuse_inflation(path: Path, members: list[zipfile.ZipInfo], available: int | None) -> None:
    total = sum(info.file_size for info in members)
    size = path.stat().st_size
    limit = inflation_limit(size, available)
    if total <= limit or not members:
        return
    largest = max(members, key=lambda info: info.file_size)
    inflates = (
        f"would inflate to {total / _GIB:.1f} GiB ({largest.filename!r} alone "
        f"{largest.file_size / _GIB:.1f} GiB)"
    )
    if available is not None and limit == available:
        raise InputError(
            str(path),
            f"{inflates}, more than the {limit / _GIB:.1f} GiB of memory available",
            "is it the file you meant?",
        )
    raise InputError(
        str(path),
        f"{inflates} from {size / 2**20:.1f} MiB, more than {MAX_INFLATION} times its size: "
        "checkpoints and tensor files do not compress so far, zip bombs do",
        "if it is the file you meant, save it uncompressed (numpy.savez, torch.save)",
    )


def check_npy_members(path: Path) -> None:
    """Refuse an ``.npz`` member whose ``.npy`` header claims more bytes of data than the
    member holds (numpy would allocate the claimed array first), or Python objects (a pickle,
    never read)."""
    import numpy as np
    from numpy.lib import format as npy

    try:
        archive = open_zip(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    with archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            try:
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    read_header = (
                        npy.read_array_header_1_0
                        if version == (1, 0)
                        else npy.read_array_header_2_0
                    )
                    shape, _order, dtype = read_header(member, max_header_size=2**16)
            except Exception:  # a corrupt header: numpy's own load names it
                continue
            if dtype.hasobject:  # numpy would say only "cannot be loaded when allow_pickle..."
                raise InputError(
                    str(path),
                    f"array '{info.filename.removesuffix('.npy')}' holds Python objects (dtype "
                    f"{dtype}), which only unpickling reads; curvcal reads numbers only",
                    "save arrays of numbers",
                )
            claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if claimed > info.file_size:
                name = info.filename.removesuffix(".npy")
                raise InputError(
                    str(path),
                    f"array '{name}' claims shape {tuple(shape)} ({claimed:,} bytes) but holds "
                    f"{info.file_size:,} bytes",
                    "is it truncated or corrupt?",
                )


def check_num_classes(kwargs: Mapping[str, Any], what: str) -> None:
    """Refuse a ``num_classes`` keyword that is not a whole number in 1..MAX_CLASSES before
    the architecture allocates a head of that many rows (an out-of-memory kill otherwise)."""
    if "num_classes" not in kwargs:
        return
    value = kwargs["num_classes"]
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or not 1 <= value <= MAX_CLASSES:
        raise InputError(
            what,
            f"num_classes {value!r} is not a whole number in 1..{MAX_CLASSES:,}",
            "give the number of classes the weights were trained with",
        )
