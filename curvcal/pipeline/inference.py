"""One batched inference pass: a model and batches in, logits and labels out (on the CPU);
and the one-sample check that a model runs on a dataset's inputs."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from curvcal import rows
from curvcal.console import StepCallback
from curvcal.errors import CurvcalError, InputError


def predict_logits(
    model: torch.nn.Module,
    batches: Iterable[tuple[rows.Inputs, torch.Tensor]],
    device: torch.device,
    on_step: StepCallback | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated logits ``(N, K)`` and labels ``(N,)`` of ``model`` over ``batches``, by the
    one inference loop :func:`~curvcal.calibration.inference.batch_logits`.

    The model is used as it is (the loader hands over a module in eval mode); no gradients are
    kept. Inputs are cast to the model's dtype; logits come back on the CPU in that dtype; an
    output that is not ``(batch, K)`` logits is a :class:`~curvcal.errors.NumericalError`; ``on_step``
    receives the number of samples of each finished batch.
    """
    from curvcal.calibration.inference import batch_logits

    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    return batch_logits(model, batches, device, dtype, on_step)


#: how torch says an operation has no kernel for a dtype
_DTYPE_REFUSALS = (
    "not implemented for 'Half'",
    "not implemented for 'BFloat16'",
    "Low precision dtypes not supported",
    "Unsupported dtype Half",
    "Unsupported dtype BFloat16",
)


def _unsupported_dtype(reason: str) -> bool:
    """Whether torch's error ``reason`` says an operation has no half-precision kernel."""
    return any(refusal in reason for refusal in _DTYPE_REFUSALS)


def check_model_runs(
    model: torch.nn.Module, x: rows.Inputs, device: torch.device, where: str
) -> int:
    """Run ``model`` on a batch ``x`` of one sample (a tensor with its batch dimension, or a
    mapping of them) and return its number of logits K, before any real work is done.

    A model with an operation torch has no bfloat16/float16 kernel for on the device raises
    :class:`InputError` naming ``--dtype``. A model that cannot take the inputs (wrong channels
    or image size, say) raises :class:`InputError` naming ``where`` — the dataset option — with torch's reason, instead of
    failing deep inside a pass; so does an output that is not ``(batch, K)`` logits.
    """
    from curvcal.sharding import is_sharded

    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    shape = rows.describe_shape(x)
    if isinstance(x, torch.Tensor):
        shape = str(tuple(x.shape[1:]))  # one sample's shape, as the dataset holds it
    hint = "check --data (and --resize/--crop) against the architecture"
    try:
        # no_grad, not inference_mode, on a sharded model: FSDP2 keeps the root unit's gathered
        # parameters after a forward, and inference tensors there could not be written later
        with torch.no_grad() if is_sharded(model) else torch.inference_mode():
            out = model(rows.to_device(x, device, dtype))
    except (CurvcalError, MemoryError):
        raise
    except Exception as exc:  # the model's code (a py: class is the user's) refused the input
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        if not isinstance(exc, RuntimeError | ValueError | TypeError | IndexError):
            reason = f"{type(exc).__name__}: {reason}"  # a KeyError's text alone is the key
        if dtype in (torch.bfloat16, torch.float16) and _unsupported_dtype(reason):
            name = str(dtype).removeprefix("torch.")
            raise InputError(
                "--dtype",
                f"the model cannot run in {name} on {device.type}: {reason}",
                "use --dtype float32 (or float16/bfloat16 on a device that supports the operation)",
            ) from exc
        raise InputError(
            where, f"the model cannot run on inputs of shape {shape}: {reason}", hint
        ) from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 1:
        got = str(tuple(out.shape)) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InputError(
            where,
            f"the model's output for one input has shape {got}, not (1, classes) logits",
            hint,
        )
    return int(out.shape[1])
