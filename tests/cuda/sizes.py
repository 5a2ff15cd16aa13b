"""How much work the CUDA tests do: the device's sizes, or the stand-in's.

On a CUDA device the tests read all 797 bundled digits in batches of 300. With the CPU standing
in (``CURVCAL_CUDA_TESTS_DEVICE=cpu``, ``make test-cuda-standin``) the same command lines run on
fewer digits and smaller batches: only ``--max-samples`` is added and the ``--batch-size`` value
changes, so every option, tolerance and file of the device run is exercised in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: the environment variable that names the device standing in for CUDA (``cpu``)
STAND_IN = "CURVCAL_CUDA_TESTS_DEVICE"


@dataclass(frozen=True)
class Sizes:
    """The sizes one run of the CUDA tests uses; their options, tolerances and files are fixed."""

    #: digits each command reads: ``None`` all 797 of ``curvcal:digits``, else ``--max-samples``
    samples: int | None
    #: digits ``curvcal check`` reads (enough for the demo policy's bounds to hold)
    policy_samples: int | None
    #: ``--batch-size`` of the ``hessian`` commands: several batches either way
    batch_size: int
    #: rows per batch in the out-of-memory test, which refuses more than a third of them
    oom_batch: int

    def subset(self, policy: bool = False) -> tuple[str, ...]:
        """The options that take the digits down to this size (none at full size)."""
        samples = self.policy_samples if policy else self.samples
        return () if samples is None else ("--max-samples", str(samples))


#: on a CUDA device: the whole digits, three batches of at most 300
DEVICE_SIZES = Sizes(samples=None, policy_samples=None, batch_size=300, oom_batch=300)
#: on the stand-in: about a second of CPU per command, still several batches and two halvings
STAND_IN_SIZES = Sizes(samples=100, policy_samples=400, batch_size=40, oom_batch=48)


def sizes_for(device: str) -> Sizes:
    """The device's sizes on CUDA (``cuda``, ``cuda:1``), the stand-in's on any other device."""
    return DEVICE_SIZES if torch.device(device).type == "cuda" else STAND_IN_SIZES
