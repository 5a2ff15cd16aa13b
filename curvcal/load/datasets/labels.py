"""A dataset's labels: checked against a model's outputs, and split class by class."""

from __future__ import annotations

import torch

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData
from curvcal.load.files.tensorfile import as_labels
from curvcal.seeds import seeded_generator


def check_labels(data: LoadedData, num_outputs: int | None, what: str | None = None) -> None:
    """Check the labels against a model with ``num_outputs`` logits.

    Labels must be integers in ``[0, num_outputs)``. When the dataset itself knows its number
    of classes (``num_classes_source == "dataset"``) it must equal ``num_outputs``. Errors name
    ``what`` (default ``--data SPEC``).
    """
    what = what or f"--data {data.spec}"
    labels = as_labels(data.labels, what)
    if num_outputs is None:
        return
    if data.num_classes_source == "dataset" and data.num_classes not in (None, num_outputs):
        raise InputError(
            what,
            f"has {data.num_classes} classes but the model has {num_outputs} outputs",
        )
    if labels.numel() and int(labels.max()) >= num_outputs:
        row = int((labels >= num_outputs).nonzero()[0, 0])
        raise InputError(
            what,
            f"label {int(labels[row])} (sample {row}) is out of range for a model with "
            f"{num_outputs} outputs (labels must be in [0, {num_outputs}))",
        )


def stratified_split(
    labels: torch.Tensor, fraction: float, seed: int, source: str = "the data"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split sample indices into ``(fit_idx, eval_idx)``, class by class.

    ``fit_idx`` receives ``n_fit = round(fraction · N)`` samples, clamped to ``[1, N - 1]`` so
    both parts are never empty (a tiny fraction still gives one fitting sample). The count is
    shared among classes in proportion to their size by largest remainders: class ``c`` with
    ``n_c`` samples gets ``floor(fraction · n_c)`` plus one for the classes with the largest
    fractional parts (ties to the lower class). A class too small to split (one sample) lands
    wholly on one side. Which samples of a class go to ``fit`` is drawn with ``seed``; the same
    labels and seed give the same split. Both index tensors are int64, ascending, disjoint,
    and together cover ``0..N-1``. ``source`` names the data in the error for fewer than two
    samples.
    """
    if not 0.0 < fraction < 1.0:
        raise InputError("--val-split", f"is {fraction}; it must be strictly between 0 and 1")
    labels = as_labels(torch.as_tensor(labels), "labels")
    n_total = int(labels.shape[0])
    if n_total < 2:
        raise InputError(
            "--val-split",
            f"{source} has {n_total} sample(s); a split needs at least 2, one to fit and one to "
            "evaluate",
            "give more samples, or fit on separate data",
        )
    n_fit = min(max(round(fraction * n_total), 1), n_total - 1)
    classes, counts = torch.unique(labels, return_counts=True)
    quotas = [fraction * int(c) for c in counts]
    take = [int(q) for q in quotas]
    remaining = n_fit - sum(take)
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(quotas[i] - take[i]), i))
    for i in by_remainder:
        if remaining <= 0:
            break
        if take[i] < int(counts[i]):
            take[i] += 1
            remaining -= 1
    generator = seeded_generator(seed)
    fit_parts = []
    for cls, n_take in zip(classes.tolist(), take, strict=True):
        members = (labels == cls).nonzero().flatten()
        order = torch.randperm(len(members), generator=generator)
        fit_parts.append(members[order[:n_take]])
    fit_mask = torch.zeros(n_total, dtype=torch.bool)
    fit_mask[torch.cat(fit_parts)] = True
    return fit_mask.nonzero().flatten(), (~fit_mask).nonzero().flatten()
