"""Sizes checked before anything is allocated for them, so that a small file or option cannot
ask for more memory than there is (an out-of-memory kill, or an hour of swapping, otherwise).

- ``num_classes``: a classifier head of at most :data:`~curvcal.settings.checkpoint.MAX_CLASSES` rows.
- Zip archives (``.npz``, ``torch.save`` files): a member's uncompressed size is in the
  archive's central directory, so one that would inflate to gigabytes (a few kilobytes of
  deflated zeros) is refused before a reader allocates for it; so is a ``.npy`` member whose
  header claims a larger array than the member holds.
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


def check_zip_sizes(path: Path, limit: int | None = None) -> None:
    """Refuse a zip archive whose members would inflate to more than ``limit`` bytes in all
    (default: the memory available now), naming ``path`` and the largest member."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not readable as a zip here: the format's own reader says what is wrong
    total = sum(info.file_size for info in members)
    limit = available_memory() if limit is None else limit
    if limit is not None and total > limit:
        largest = max(members, key=lambda info: info.file_size)
        raise InputError(
            str(path),
            f"would inflate to {total / _GIB:.1f} GiB ({largest.filename!r} alone "
            f"{largest.file_size / _GIB:.1f} GiB), more than the {limit / _GIB:.1f} GiB of "
            "memory available",
            "is it the file you meant?",
        )


def check_npy_members(path: Path) -> None:
    """Refuse an ``.npz`` member whose ``.npy`` header claims more bytes of data than the
    member holds (numpy would allocate the claimed array first)."""
    import numpy as np
    from numpy.lib import format as npy

    try:
        archive = zipfile.ZipFile(path)
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
            if dtype.hasobject:
                continue  # refused by the loader (no pickles)
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
