"""Architectures that ship with curvcal (safe to build without --trust-checkpoint).

Referenced from the command line as ``--arch curvcal:NAME``.
"""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """A small CNN for 8×8 grey-level digits (scikit-learn's digits data), about 10k parameters.

    Input: ``(N, 1, 8, 8)`` float tensors; output: ``(N, num_classes)`` logits.
    """

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 16, 32),
            nn.ReLU(),
            nn.Linear(32, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


BUILTIN_ARCHITECTURES: dict[str, type[nn.Module]] = {"DigitsCNN": DigitsCNN}
