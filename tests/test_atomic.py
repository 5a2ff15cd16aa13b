"""Atomic writes: whole file or nothing, ordinary permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from curvcal.atomic import atomic_output


def test_new_file_gets_the_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    old = os.umask(0o022)
    try:
        with atomic_output(target) as stream:
            stream.write(b"{}")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_error_inside_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target) as stream:
        stream.write(b"half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dangling symlink"])
def test_a_path_that_is_not_a_regular_file_is_refused_and_kept(tmp_path: Path, kind: str) -> None:
    """Replacing a link, a pipe or a device would destroy it rather than write through it."""
    from curvcal.errors import InputError

    target = tmp_path / "out.json"
    kept = tmp_path / "kept.json"
    kept.write_text("mine")
    if kind == "symlink":
        target.symlink_to(kept)
    elif kind == "dangling symlink":
        target.symlink_to(tmp_path / "nowhere.json")
    else:
        os.mkfifo(target)
    before = target.lstat()
    with pytest.raises(InputError, match="not a regular file"), atomic_output(target) as stream:
        stream.write(b"{}")
    after = target.lstat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert kept.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "out.json"]


def test_a_name_too_long_is_an_input_error(tmp_path: Path) -> None:
    from curvcal.errors import InputError

    with (
        pytest.raises(InputError, match="cannot be written"),
        atomic_output(tmp_path / ("x" * 300)) as stream,
    ):
        stream.write(b"{}")


def test_the_temporary_file_of_a_long_name_fits(tmp_path: Path) -> None:
    """A name of 250 characters is legal; its temporary file's name must be too."""
    target = tmp_path / ("y" * 250)
    with atomic_output(target) as stream:
        stream.write(b"{}")
    assert target.read_bytes() == b"{}"
