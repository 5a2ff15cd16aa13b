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
