"""Does a model fit a dataset? One sample through the model and the labels against its class
count, before any pass over the data.

Every command that runs a model (``hessian``, ``calibrate``, ``check``, ``study``, ``demo``)
calls :func:`check_fitness` once per (checkpoint, dataset) pair right after loading them, so
that a model that cannot take the inputs (wrong channels or image size) or has fewer outputs
than the labels need is refused in seconds, naming both, instead of failing deep inside a
pass over the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from curvcal.load.checkpoint import LoadedModel
    from curvcal.load.data import LoadedData


def check_fitness(loaded: LoadedModel, data: LoadedData, option: str = "--data") -> int:
    """Run ``loaded`` on the first sample of ``data`` and check every label against the number
    of logits K it returns (and against the dataset's own class count when it knows one).

    Returns K. Raises :class:`~curvcal.errors.InputError` (exit 2) naming the checkpoint and
    ``option SPEC`` when the model cannot run on the inputs, does not return ``(1, K)`` logits,
    or K does not cover the labels. Costs one forward pass of one sample.
    """
    from curvcal.load.data import check_labels
    from curvcal.pipeline.inference import check_model_runs

    where = f"{loaded.path} on {option} {data.spec}"
    n_outputs = check_model_runs(loaded.module, data.dataset[0][0], loaded.device, where)
    check_labels(data, n_outputs, where)
    return n_outputs


def single_class_warning(source: str) -> str:
    """The warning for scores with one class (K = 1): softmax gives every sample probability 1,
    so calibration is undefined and the metrics are trivially perfect."""
    return (
        f"{source}: one class (K = 1): calibration is undefined, since every predicted "
        "probability is 1; the metrics are still reported but are trivially perfect (ECE, NLL "
        "and Brier 0) and any fitted temperature is arbitrary"
    )
