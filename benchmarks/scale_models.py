"""The large benchmark models and their data, shared by bench_scale.py and bench_hessian.py.

torchvision's ResNet-18 and a small VisionTransformer, both with random weights and 10
classes, on CIFAR-size random data: 3×32×32 inputs uniform in [0, 1) normalised as
(x − 0.5)/0.25, labels uniform over the 10 classes (fixed seed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torchvision
from torch import Tensor, nn

Batches = list[tuple[Tensor, Tensor]]


def tiny_vit() -> nn.Module:
    return torchvision.models.VisionTransformer(
        image_size=32, patch_size=4, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
        num_classes=10,
    )  # fmt: skip


MODELS: dict[str, Callable[[], nn.Module]] = {
    "vit_tiny": tiny_vit,
    "resnet18": lambda: torchvision.models.resnet18(num_classes=10),
}


def fake_data(samples: int, batch: int, device: torch.device) -> Batches:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(samples, 3, 32, 32, generator=generator)
    x = (x - 0.5) / 0.25
    y = torch.randint(0, 10, (samples,), generator=generator)
    return [
        (x[i : i + batch].to(device), y[i : i + batch].to(device)) for i in range(0, samples, batch)
    ]
