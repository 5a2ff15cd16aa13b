"""One batched inference pass: a model and batches in, logits and labels out (on the CPU)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from curvcal.console import StepCallback
from curvcal.errors import InputError, NumericalError


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


def check_model_runs(
    model: torch.nn.Module, sample: object, device: torch.device, where: str
) -> int:
    """Run ``model`` on one input ``sample`` (no batch dimension) and return its number of
    logits K, before any real work is done.

    A model that cannot take the inputs (wrong channels or image size, say) raises
    :class:`InputError` naming ``where`` — the dataset option — with torch's reason, instead of
    failing deep inside a pass; so does an output that is not ``(batch, K)`` logits.
    """
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    sample = torch.as_tensor(sample)
    x = sample.unsqueeze(0).to(device=device)
    if x.is_floating_point():
        x = x.to(dtype)
    hint = "check --data (and --resize/--crop) against the architecture"
    try:
        with torch.inference_mode():
            out = model(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise InputError(
            where, f"the model cannot run on inputs of shape {tuple(sample.shape)}: {reason}", hint
        ) from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 1:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InputError(
            where,
            f"the model's output for one input has shape {shape}, not (1, classes) logits",
            hint,
        )
    return int(out.shape[1])
