"""One batched inference pass: a model and batches in, logits and labels out (on the CPU)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from curvcal.console import StepCallback
from curvcal.errors import NumericalError


def predict_logits(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    on_step: StepCallback | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated logits ``(N, K)`` and labels ``(N,)`` of ``model`` over ``batches``.

    The model is used as it is (the loader hands over a module in eval mode); no gradients are
    kept. Logits come back on the CPU in the model's dtype; ``on_step`` receives the number of
    samples of each finished batch.
    """
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    logits_parts: list[torch.Tensor] = []
    label_parts: list[torch.Tensor] = []
    with torch.inference_mode():
        for x, y in batches:
            out = model(x.to(device=device, dtype=dtype, non_blocking=True))
            if not isinstance(out, torch.Tensor) or out.dim() != 2:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise NumericalError(
                    "model output", f"expected logits of shape (batch, classes), got {shape}"
                )
            logits_parts.append(out.detach().cpu())
            label_parts.append(y.detach().cpu().long())
            if on_step is not None:
                on_step(len(y))
    if not logits_parts:
        return torch.empty(0, 0, dtype=dtype), torch.empty(0, dtype=torch.long)
    return torch.cat(logits_parts), torch.cat(label_parts)
