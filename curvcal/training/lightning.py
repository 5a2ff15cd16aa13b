"""A PyTorch Lightning callback that measures curvature and calibration on a held-out loader
every N epochs or training steps and logs them with ``pl_module.log`` (so they reach every
logger of the trainer and ``trainer.callback_metrics``, where a checkpoint or early-stopping
callback can monitor them). Needs the ``lightning`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from curvcal.load.extras import require
from curvcal.training.measurement import CallbackMeasurement

_pl = require("lightning", "lightning.pytorch", "CurvatureCallback")


class CurvatureCallback(_pl.Callback, CallbackMeasurement):  # type: ignore[name-defined]
    """Every ``every_n_epochs`` epochs (at the end of the training epoch) and/or every
    ``every_n_train_steps`` optimizer steps, measure ``quantities`` of the module on ``loader``
    (:func:`curvcal.training.measurement.measure`: eval mode, training flags, ``.grad`` and random
    states put back) and log each as ``prefix + name``.

    ``model``: a function from the LightningModule to the classifier to measure (default: the
    LightningModule itself, whose ``forward(x)`` must return logits). ``bins``/``edges`` for the
    calibration metrics; every other keyword is a ``HessianSettings`` field (``top_k=3``,
    ``probes=50``, ``trace_method="hutchpp"``, ``params="head.*"``, ``seed``, ``loss``).
    Each measurement is also appended to :attr:`history` as ``(epoch, global_step, values)``.
    """

    every_n_epochs: int | None
    every_n_train_steps: int | None

    def __init__(
        self,
        loader: Any,
        *,
        every_n_epochs: int | None = 1,
        every_n_train_steps: int | None = None,
        quantities: Sequence[str] = ("lambda_max", "ece"),
        prefix: str = "curvcal/",
        model: Callable[[Any], nn.Module] | None = None,
        bins: int = 15,
        edges: str = "left",
        **overrides: Any,
    ) -> None:
        super().__init__()
        counts = {"every_n_epochs": every_n_epochs, "every_n_train_steps": every_n_train_steps}
        self.configure(loader, quantities, prefix, model, bins, edges, overrides, **counts)
        self.history: list[tuple[int, int, dict[str, float]]] = []

    def _measure(self, trainer: Any, pl_module: Any, on_step: bool) -> None:
        target = pl_module if self.model is None else self.model(pl_module)
        values, logs = self.measured(target)
        self.history.append((trainer.current_epoch, trainer.global_step, values))
        pl_module.log_dict(
            # float64 tensors: a bare float would be logged as float32
            {name: torch.tensor(value, dtype=torch.float64) for name, value in logs.items()},
            on_step=on_step,
            on_epoch=not on_step,
            batch_size=1,
        )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = self.every_n_train_steps
        if n is not None and trainer.global_step % n == 0:
            self._measure(trainer, pl_module, on_step=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        n = self.every_n_epochs
        if n is not None and (trainer.current_epoch + 1) % n == 0:
            self._measure(trainer, pl_module, on_step=False)
