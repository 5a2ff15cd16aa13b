"""The logits a calibration is measured on: one inference pass of a model over a dataset.

:func:`predict` runs a user's model over a DataLoader (or a list of ``(x, y)`` batches, or one
``(x, y)`` pair) in eval mode and hands back every logit and label, ready for
:func:`~curvcal.calibration.metrics.calibration_metrics` and the scaling fits. The model is
left as it was handed in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from curvcal import rows
from curvcal.errors import InputError


def predict(model: nn.Module, data: Any) -> tuple[Tensor, Tensor]:
    """Logits (N, K) and integer labels (N,) of ``model`` over every batch of ``data``, in order.

    ``data``: a DataLoader or any re-iterable of ``(x, y)`` batches, or one ``(x, y)`` pair
    (``x`` a tensor, or a mapping of named tensors with the same rows, passed to the model as
    its one argument). The model runs in eval mode (BatchNorm's running statistics, dropout
    off) without gradients; each module's training flag is restored afterwards, and an
    eval-mode forward changes no parameter or buffer. Inputs are moved to the device of the
    model's first parameter, floating ones cast to its dtype. The logits come back on the CPU
    in the model's dtype, the labels as int64.

    >>> import torch
    >>> model = torch.nn.Linear(4, 3)
    >>> logits, labels = predict(model, (torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])))
    >>> tuple(logits.shape), labels.tolist()
    ((5, 3), [0, 1, 2, 0, 1])
    """
    if not isinstance(model, nn.Module):
        raise InputError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else None
    flags = [(module, module.training) for module in model.modules()]
    logits: list[Tensor] = []
    labels: list[Tensor] = []
    try:
        model.eval()
        with torch.no_grad():
            for index, batch in enumerate(rows.as_batches(data)):
                x, y = _pair(batch, index)
                out = model(rows.to_device(x, device, dtype))
                if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != len(y):
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise InputError(
                        "model",
                        f"batch {index}: expected logits of shape ({len(y)}, classes), got {got}",
                    )
                logits.append(out.detach().cpu())
                labels.append(y.detach().cpu().long())
    finally:
        for module, flag in flags:
            module.training = flag
    if not logits:
        raise InputError("data", "holds no batch", "pass a DataLoader or a list of (x, y) pairs")
    return torch.cat(logits), torch.cat(labels)


def _pair(batch: Any, index: int) -> tuple[rows.Inputs, Tensor]:
    """``batch`` as ``(inputs, labels)``, else :class:`InputError` naming the batch."""
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise InputError("data", f"batch {index} is not an (x, y) pair")
    x, y = batch
    problem = rows.input_problem(x)
    if problem is not None:
        raise InputError("data", f"batch {index}: {problem}")
    if not isinstance(y, Tensor) or y.ndim != 1 or y.shape[0] != rows.n_rows(x):
        raise InputError(
            "data", f"batch {index}: the labels must be a 1-D tensor with one label per input row"
        )
    return x, y
