"""A Hugging Face ``transformers.TrainerCallback`` that measures curvature and calibration on a
held-out loader every N optimizer steps or epochs and logs them into the trainer's log
(``state.log_history``, and through ``Trainer.log`` to every ``report_to`` integration when the
callback is attached with :meth:`CurvatureTrainerCallback.attach`). Needs the ``hf`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from curvcal.errors import InputError
from curvcal.load.extras import require
from curvcal.training.measurement import CallbackMeasurement

_transformers = require("hf", "transformers", "CurvatureTrainerCallback")


def logits_model(model: nn.Module) -> nn.Module:
    """``model`` as a module whose forward returns logits: a transformers
    ``PreTrainedModel`` (whose forward returns a ``ModelOutput``) is wrapped so that a mapping
    of inputs goes in as keyword arguments and ``.logits`` comes out
    (:class:`~curvcal.load.models.hf.LogitsModule`); any other module is measured as it is."""
    if isinstance(model, _transformers.PreTrainedModel):
        from curvcal.load.models.hf import LogitsModule

        return LogitsModule(model, "text")
    return model


class CurvatureTrainerCallback(
    _transformers.TrainerCallback,  # type: ignore[name-defined]
    CallbackMeasurement,
):
    """Every ``every_n_steps`` optimizer steps and/or every ``every_n_epochs`` epochs, measure
    ``quantities`` of the trainer's model on ``loader`` (:func:`curvcal.training.measurement.measure`:
    eval mode, training flags, ``.grad`` and random states put back) and log each as
    ``prefix + name``.

    ``loader`` yields ``(inputs, labels)`` batches, ``inputs`` a tensor (the model's main input)
    or a mapping of tensors (``input_ids``, ``attention_mask``) passed as keywords.
    ``model``: a function from the trainer's model to the classifier to measure (default
    :func:`logits_model`). ``bins``/``edges`` for the calibration metrics; every other keyword is
    a ``HessianSettings`` field (``top_k=3``, ``probes=50``, ``params="classifier.*"``).

    Logging: attached with ``trainer.add_callback(callback.attach(trainer))`` (or
    ``callback.attach(trainer)``, which adds it), each measurement goes through
    ``trainer.log`` (``state.log_history`` and every integration); otherwise it is appended to
    ``state.log_history`` in ``Trainer.log``'s form (the values, ``epoch`` and ``step``).
    Each measurement is also appended to :attr:`history` as ``(epoch, global_step, values)``.
    """

    every_n_steps: int | None
    every_n_epochs: int | None

    def __init__(
        self,
        loader: Any,
        *,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = 1,
        quantities: Sequence[str] = ("lambda_max", "ece"),
        prefix: str = "curvcal/",
        model: Callable[[nn.Module], nn.Module] | None = None,
        bins: int = 15,
        edges: str = "left",
        **overrides: Any,
    ) -> None:
        counts = {"every_n_steps": every_n_steps, "every_n_epochs": every_n_epochs}
        self.configure(loader, quantities, prefix, model, bins, edges, overrides, **counts)
        self.trainer: Any = None
        self.history: list[tuple[float, int, dict[str, float]]] = []

    def attach(self, trainer: Any) -> CurvatureTrainerCallback:
        """Log through ``trainer.log``; adds the callback to ``trainer`` unless it is there."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def _measure(self, state: Any, model: nn.Module | None) -> None:
        if model is None:
            raise InputError("CurvatureTrainerCallback", "the trainer passed no model")
        target = (self.model or logits_model)(model)
        values, logs = self.measured(target)
        epoch = float(state.epoch or 0.0)
        self.history.append((epoch, int(state.global_step), values))
        if self.trainer is not None:
            self.trainer.log(logs)
        else:
            state.log_history.append({**logs, "epoch": epoch, "step": state.global_step})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        n = self.every_n_steps
        if n is not None and state.global_step % n == 0:
            self._measure(state, kwargs.get("model"))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        n = self.every_n_epochs
        if n is not None and round(state.epoch or 0.0) % n == 0:
            self._measure(state, kwargs.get("model"))
