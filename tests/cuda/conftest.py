"""The CUDA tests: every command on ``--device cuda`` against the same command on the CPU.

Marked ``cuda`` (``pytest -m cuda``) and skipped where ``torch.cuda.is_available()`` is False.
``CURVCAL_CUDA_TESTS_DEVICE=cpu`` runs them with the CPU standing in for the device (CPU against
CPU) at the smaller sizes of :mod:`tests.cuda.sizes`, so that every command line, option and
file of the tests runs on a machine without a GPU (``make test-cuda-standin``, part of
``make test``).

What the stand-in puts in place of the device, and so cannot check:

* ``torchrun`` and the FSDP2 test take gloo where the device takes NCCL (curvcal picks the
  backend from ``--device``): NCCL's collectives, tensors moved to the rank's GPU for them, and
  the mapping of ``LOCAL_RANK`` to a device are not run;
* batches are never pinned (``--cache host`` and ``none`` pin on CUDA only), ``--cache auto``
  keeps the data where it is instead of sizing a device cache from free memory, and free
  memory (``--memory-budget 50%``) is the host's ``MemAvailable``, not
  ``torch.cuda.mem_get_info``;
* the out-of-memory test raises ``torch.cuda.OutOfMemoryError`` itself rather than having the
  CUDA allocator fail on a petabyte, and ``torch.cuda.empty_cache`` is not called;
* TF32 does not exist on the CPU: the test checks only that the caller's flags are restored;
* bfloat16 λmax is the CPU kernels' rounding, not cuBLAS's;
* CPU against CPU gives the same numbers bit for bit, so the tolerances (1e-5 relative, 1e-9)
  are computed and compared but never tested by a second device's rounding.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.cuda.sizes import STAND_IN, Sizes, sizes_for


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
