"""The logits a calibration is measured on: one inference pass of a model over a dataset.

:func:`batch_logits` is the one inference loop (the command line's pass,
:func:`curvcal.pipeline.inference.predict_logits`, runs it too). :func:`predict` runs a user's
model over a DataLoader (or a list of ``(x, y)`` batches, or one ``(x, y)`` pair) in eval mode
and hands back every logit and label, ready for
:func:`~curvcal.calibration.metrics.calibration_metrics` and the scaling fits. The model is
left as it was handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from curvcal import rows
from curvcal.errors import CurvcalError, InputError, NumericalError


def batch_logits(
    model: nn.Module,
    batches: Iterable[tuple[rows.Inputs, Tensor]],
    device: torch.device,
    dtype: torch.dtype | None,
    on_step: Callable[[int], None] | None = None,
    *,
    error: type[CurvcalError] = NumericalError,
    where: str = "model output",
) -> tuple[Tensor, Tensor]:
    """Concatenated logits ``(N, K)`` and labels ``(N,)`` of ``model`` over ``batches``.

    The model is used as it is (its train/eval mode untouched), without gradients. Inputs are
    moved to ``device``, floating ones cast to ``dtype`` (``None``: kept). An output that is
    not ``(batch, K)`` logits raises ``error`` naming ``where`` and the batch. Logits come
    back on the CPU in the model's dtype, labels as int64; ``on_step`` receives the number of
    samples of each finished batch. No batch: empty tensors ``(0, 0)`` and ``(0,)``.
    """
    logits: list[Tensor] = []
    labels: list[Tensor] = []
    with torch.no_grad():
        for index, (x, y) in enumerate(batches):
            out = model(rows.to_device(x, device, dtype, non_blocking=True))
            if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != len(y):
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise error(
                    where, f"batch {index}: expected logits of shape ({len(y)}, classes), got {got}"
                )
            logits.append(out.detach().cpu())
            labels.append(y.detach().cpu().long())
            if on_step is not None:
                on_step(len(y))
    if not logits:
        return torch.empty(0, 0, dtype=dtype or torch.float32), torch.empty(0, dtype=torch.long)
    return torch.cat(logits), torch.cat(labels)


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
    n_batches = 0

    def pairs() -> Any:
        nonlocal n_batches
        for index, batch in enumerate(rows.as_batches(data)):
            n_batches += 1
            yield _pair(batch, index)

    try:
        model.eval()
        logits, labels = batch_logits(
            model, pairs(), device, dtype, error=InputError, where="model"
        )
    finally:
        for module, flag in flags:
            module.training = flag
    if not n_batches:
        raise InputError("data", "holds no batch", "pass a DataLoader or a list of (x, y) pairs")
    return logits, labels


def _pair(batch: Any, index: int) -> tuple[rows.Inputs, Tensor]:
    """``batch`` as ``(inputs, labels)`` (:func:`curvcal.rows.batch_problem`), else
    :class:`InputError` naming the batch."""
    problem = rows.batch_problem(batch)
    if problem is not None:
        raise InputError("data", f"batch {index}: {problem}")
    x, y = batch
    if y.ndim != 1 or y.shape[0] != rows.n_rows(x):
        raise InputError(
            "data", f"batch {index}: the labels must be a 1-D tensor with one label per input row"
        )
    return x, y
