"""Tensor files: corrupt bytes are called corrupt, not 'Python objects'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from curvcal.errors import InputError
from curvcal.load.tensorfile import read_tensor_file


def test_random_bytes_in_a_pt_file_are_reported_as_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "d.pt"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with pytest.raises(InputError) as refused:
        read_tensor_file(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: cannot be read as a .pt file")
    assert "Python objects" not in message and "weights_only" not in message
