"""Wall time and peak device memory of a step of the GPU run, shared by its parts."""

from __future__ import annotations

import time
from typing import Any


class Meter:
    """Wall time with ``torch.cuda.synchronize`` and, on CUDA, the peak allocated bytes
    (``peak``; None on the CPU), the cache emptied and the peak reset on entry."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.peak: int | None = None

    def __enter__(self) -> Meter:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.peak = self.torch.cuda.max_memory_allocated()
        self.seconds = time.perf_counter() - self.start
