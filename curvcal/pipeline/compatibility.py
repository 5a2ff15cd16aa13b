"""Does a model fit a dataset? One sample through the model and the labels against its class
count, before any pass over the data.

Every command that runs a model (``hessian``, ``calibrate``, ``check``, ``study``, ``demo``)
calls :func:`check_compatible` once per (checkpoint, dataset) pair right after loading them, so
that a model that cannot take the inputs (wrong channels or image size) or has fewer outputs
than the labels need is refused in seconds, naming both, instead of failing deep inside a
pass over the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from curvcal.errors import InputError

if TYPE_CHECKING:
    from curvcal.console import Reporter
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData


def check_compatible(loaded: LoadedModel, data: LoadedData, option: str = "--data") -> int:
    """Run ``loaded`` on the first sample of ``data`` and check every label against the number
    of logits K it returns (and against the dataset's own class count when it knows one).

    Returns K. Raises :class:`~curvcal.errors.InputError` (exit 2) naming the checkpoint and
    ``option SPEC`` when the model cannot run on the inputs, does not return ``(1, K)`` logits,
    or K does not cover the labels. Costs one forward pass of one sample.
    """
    from curvcal.load.datasets.batches import first_input
    from curvcal.load.datasets.labels import check_labels
    from curvcal.pipeline.inference import check_model_runs

    where = f"{loaded.path} on {option} {data.spec}"
    model_is_text = loaded.modality == "text"
    if model_is_text != (data.modality == "text"):
        model_kind = "a text classifier" if model_is_text else "not a text classifier"
        data_kind = "text" if data.modality == "text" else "not text (tensors or images)"
        hint = (
            "give texts: --data FILE.jsonl|.csv|.parquet or a saved datasets folder"
            if model_is_text
            else "text data needs a transformers *ForSequenceClassification model folder"
        )
        raise InputError(
            where,
            f"{loaded.architecture or 'the model'} is {model_kind} but the data is {data_kind}",
            hint,
        )
    n_outputs = check_model_runs(loaded.module, first_input(data.dataset), loaded.device, where)
    check_labels(data, n_outputs, where)
    check_tied_head(loaded, data, n_outputs, where)
    return n_outputs


def check_tied_head(loaded: LoadedModel, data: LoadedData, n_outputs: int, where: str) -> None:
    """Refuse a class count inferred from a head tied to the input embedding when the labels
    do not reach it: that width is the vocabulary's (:func:`~curvcal.load.models.architecture.
    tied_output_widths`), so the model was built with a guessed class count; ``--num-classes``
    (or ``num_classes`` in ``--arch-kwargs``) says the real one. A count the user gave, or
    labels that use every output, pass."""
    from curvcal.load.datasets.labels import as_labels
    from curvcal.load.models.architecture import tied_output_widths

    if "num_classes_source" not in loaded.metadata:  # not inferred: given, or built in
        return
    if n_outputs not in tied_output_widths(loaded.module):
        return
    labels = as_labels(data.labels, where)
    span = int(labels.max()) + 1 if labels.numel() else 0
    if span < n_outputs:
        raise InputError(
            where,
            f"the model's {n_outputs} outputs were inferred from a head tied to its input "
            f"embedding (a vocabulary of {n_outputs}), but the labels span {span} classes "
            f"(0 to {span - 1})",
            "give the class count with --num-classes",
        )


def single_class_warning(source: str) -> str:
    """The warning for scores with one class (K = 1): softmax gives every sample probability 1,
    so calibration is undefined and the metrics are trivially perfect."""
    return (
        f"{source}: one class (K = 1): calibration is undefined, since every predicted "
        "probability is 1; the metrics are still reported but are trivially perfect (ECE, NLL "
        "and Brier 0) and any fitted temperature is arbitrary"
    )


def say_preprocessing(
    data: LoadedData, reporter: Reporter, warnings: list[str], option: str = "--data"
) -> None:
    """Say on stderr the preprocessing curvcal chose on its own for ``data`` (a note; it is
    also in the report's ``inputs``), and warn of what the user should check (added to
    ``warnings`` for the report); a choice a warning is about is said once, as the warning
    (which ``--quiet`` does not hide)."""
    for note in data.chosen:
        if any(note in warning for warning in data.warnings):
            continue
        reporter.info(f"note: {option} {data.spec}: curvcal chose {note}")
    for warning in data.warnings:
        warnings.append(warning)
        reporter.warn(warning)
