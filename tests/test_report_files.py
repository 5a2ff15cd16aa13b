"""Output files: refused before any work when they cannot be written, errors not tracebacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.report.tables import check_output_path, write_atomic


def _unwritable(tmp_path: Path) -> Path:
    """A folder no file can be created in: permissions do not stop root, /proc does."""
    if os.geteuid() == 0:
        return Path("/proc")
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def test_an_unwritable_folder_is_refused_up_front(tmp_path: Path) -> None:
    target = _unwritable(tmp_path) / "report.json"
    with pytest.raises(InputError, match="is not writable") as refused:
        check_output_path(target, force=False)
    assert refused.value.what == str(target)
    with pytest.raises(InputError, match="cannot be written"):
        write_atomic(target, "{}")
    assert not target.exists()


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    check_output_path(tmp_path / "report.json", force=False)
    assert list(tmp_path.iterdir()) == []
    write_atomic(tmp_path / "report.json", "{}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
