"""One check for every input path: each way a path can fail has its own message."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.paths import readable_file


def _message(path: Path, **kwargs: str) -> str:
    with pytest.raises(InputError) as raised:
        readable_file(path, **kwargs)
    return raised.value.message


def test_a_readable_file_passes_and_gives_its_size(tmp_path: Path) -> None:
    path = tmp_path / "f.pt"
    path.write_bytes(b"12345")
    assert readable_file(path).st_size == 5
    link = tmp_path / "link.pt"
    link.symlink_to(path)
    assert readable_file(link).st_size == 5


def test_each_failure_has_its_own_message(tmp_path: Path) -> None:
    loop = tmp_path / "loop.pt"
    loop.symlink_to(loop)
    broken = tmp_path / "broken.pt"
    broken.symlink_to(tmp_path / "gone.pt")
    (tmp_path / "file").write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _message(tmp_path / "absent.pt") == f"{tmp_path / 'absent.pt'}: no such file"
    assert _message(tmp_path / "p.toml", noun="policy file").endswith(": no such policy file")
    assert _message(loop) == f"{loop}: is a symbolic link loop (too many levels of symbolic links)"
    assert "is a broken symbolic link (it points to " in _message(broken)
    assert _message(tmp_path, expected="checkpoint file").endswith(
        ": is a directory, not a checkpoint file"
    )
    assert _message(tmp_path / "file" / "x.pt").endswith(": a part of the path before the file "
                                                         "name is not a directory")  # fmt: skip
    assert _message(fifo).endswith(": is not a regular file (a FIFO, socket or device)")
    assert _message(tmp_path / ("d" * 300)).endswith("the path is too long for the file system")


def test_permission_denied_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated: the tests may run as root, who reads any file whatever its mode."""
    path = tmp_path / "secret.pt"
    path.write_bytes(b"x")

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    assert _message(path) == f"{path}: permission denied: this user may not read it"
