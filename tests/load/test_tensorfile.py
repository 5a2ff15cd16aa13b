"""Tensor files: corrupt bytes are called corrupt, not 'Python objects'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from curvcal.errors import InputError
from curvcal.load.files.tensorfile import read_tensor_file


def test_random_bytes_in_a_pt_file_are_reported_as_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with pytest.raises(InputError) as refused:
        read_tensor_file(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: cannot be read as a .pt file")
    assert "Python objects" not in message and "weights_only" not in message


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"hello\n", "cannot be read as a .npz file (it is not a zip archive of arrays)"),
        (b"", "cannot be read as a .npz file (it is empty)"),
        (b"PK\x03\x04\x14\x00", "cannot be read as a .npz file (the zip archive is cut short)"),
        ("npy", "is one .npy array, not an .npz archive"),
    ],
)
def test_a_file_named_npz_that_is_not_an_archive_says_what_it_is(
    tmp_path: Path, content: bytes | str, why: str
) -> None:
    """numpy reads a non-zip .npz as a pickle (the message spoke of pickled data) or as one
    array (a context-manager error); the file's first bytes say which it is."""
    path = tmp_path / "data.npz"
    if content == "npy":
        with open(path, "wb") as handle:
            np.save(handle, np.zeros(3))
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_tensor_file(path)
    assert info.value.what == str(path) and info.value.why == why
    assert "pickled" not in str(info.value)
