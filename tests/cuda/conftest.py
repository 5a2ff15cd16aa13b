"""The CUDA tests: every command on ``--device cuda`` against the same command on the CPU.

Marked ``cuda`` (``pytest -m cuda``) and skipped where ``torch.cuda.is_available()`` is False.
``CURVCAL_CUDA_TESTS_DEVICE=cpu`` runs them with the CPU standing in for the device (CPU against
CPU) at the smaller sizes of :mod:`tests.cuda.sizes`, so that every command line, option and
file of the tests runs on a machine without a GPU (``make test-cuda-standin``, part of
``make test``).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.cuda.sizes import Sizes, sizes_for

STAND_IN = "CURVCAL_CUDA_TESTS_DEVICE"


@pytest.fixture(scope="session")
def device() -> str:
    """``cuda`` when a device is present, the stand-in device when one is named, else skip."""
    stand_in = os.environ.get(STAND_IN)
    if stand_in:
        return stand_in
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    return "cuda"


@pytest.fixture(scope="session")
def sizes(device: str) -> Sizes:
    """The device's sizes on CUDA, the stand-in's elsewhere (:func:`tests.cuda.sizes.sizes_for`)."""
    return sizes_for(device)
