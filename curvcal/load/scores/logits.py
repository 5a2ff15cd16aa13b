"""Logits, probabilities or log-probabilities with labels: read, check, write.

The input kind is always explicit (``--input-kind logits|probs|logprobs``); it is never guessed
from the numbers. Checks (``references.md``): scores are 2-D ``(N, K)`` with ``N >= 1`` and
``K >= 1``, one label per row, labels integers in ``[0, K)``; logits finite; probabilities
finite, non-negative, each row summing to 1 within ``1e-4``; log-probabilities finite, ``<= 0``,
each row's ``exp`` summing to 1 within ``1e-4``. One score per row (shape ``(N,)``) is a binary
problem's score of class 1, read as two columns (:func:`binary_columns`); one-hot labels
``(N, K)`` are read as their class indices (:func:`~curvcal.load.files.tensorfile.as_labels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from curvcal.errors import InputError
from curvcal.load.files.tensorfile import (
    as_labels,
    is_tensor_file,
    read_tensor_file,
    write_tensor_file,
)
from curvcal.load.scores.tables import is_table, read_table

INPUT_KINDS = ("logits", "probs", "logprobs")
ROW_SUM_TOLERANCE = 1e-4
#: What ``--nan-policy`` may say: refuse a row with a NaN or infinity, or leave it out.
NAN_POLICIES = ("error", "drop")


def nonfinite_rows(scores: torch.Tensor) -> torch.Tensor:
    """Indices (int64, ascending) of the rows of an N×K ``scores`` tensor holding a NaN or an
    infinity; empty when every row is finite."""
    if scores.ndim != 2:
        raise InputError("scores", f"must be 2-D (N, K), got shape {tuple(scores.shape)}")
    return (~torch.isfinite(scores)).any(dim=1).nonzero().reshape(-1)


def drop_rows(
    scores: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores`` and ``labels`` without the given ``rows`` (new tensors; inputs untouched)."""
    keep = torch.ones(scores.shape[0], dtype=torch.bool)
    keep[rows] = False
    return scores[keep], labels[keep]


@dataclass(frozen=True)
class LogitsData:
    """Scores (float64 ``(N, K)``, of the kind ``kind``) and int64 labels ``(N,)``;
    ``dropped_rows`` counts rows left out for a NaN or infinity (``nan_policy="drop"``)."""

    scores: torch.Tensor
    labels: torch.Tensor
    kind: str
    path: Path | None
    dropped_rows: int = 0


def load_logits(
    path: str | Path,
    kind: str = "logits",
    scores_key: str = "logits",
    labels_key: str = "labels",
    nan_policy: str = "error",
) -> LogitsData:
    """Read scores and labels from a ``.npz``, ``.pt`` or ``.safetensors`` file, or a
    ``.parquet``/``.csv`` table (:mod:`curvcal.load.scores.tables`), and check them.

    ``nan_policy``: ``error`` refuses a row with a NaN or infinity (naming the file and the
    first such row); ``drop`` leaves such rows out and counts them in ``dropped_rows``.
    """
    path = Path(path)
    if nan_policy not in NAN_POLICIES:
        raise InputError("--nan-policy", f"'{nan_policy}' is not one of {', '.join(NAN_POLICIES)}")
    if kind not in INPUT_KINDS:
        raise InputError("--input-kind", f"'{kind}' is not one of {', '.join(INPUT_KINDS)}")
    _refuse_unknown_type(path)
    tensors = read_table(path, scores_key, labels_key) if is_table(path) else read_tensor_file(path)
    if scores_key not in tensors:
        present = ", ".join(sorted(tensors)) or "none"
        hint = f"name the scores with --scores-key (the file has: {present})"
        for other in INPUT_KINDS:
            if other != scores_key and other in tensors:
                hint = (
                    f"pass --input-kind {other} and --scores-key {other} if that is what it holds"
                )
                break
        raise InputError(str(path), f"has no tensor named '{scores_key}'", hint)
    if labels_key not in tensors:
        present = ", ".join(sorted(tensors)) or "none"
        raise InputError(
            str(path),
            f"has no tensor named '{labels_key}' (it has: {present})",
            "name the labels with --labels-key",
        )
    raw_scores = tensors[scores_key]
    if not raw_scores.is_floating_point():
        raise InputError(
            str(path), f"'{scores_key}' has dtype {raw_scores.dtype}; scores must be floats"
        )
    labels = as_labels(tensors[labels_key], str(path))
    scores = raw_scores.to(torch.float64)
    if scores.dim() == 1:
        outside = (labels > 1).nonzero()
        if outside.numel():
            row = int(outside[0, 0])
            raise InputError(
                str(path),
                f"'{scores_key}' has one score per row, read as a binary problem's score of "
                f"class 1, but label {int(labels[row])} in row {row} is not 0 or 1",
                "scores of K > 2 classes must be 2-D (N, K)",
            )
        scores = binary_columns(scores, kind, f"{path} ('{scores_key}')")
    dropped = 0
    if nan_policy == "drop" and scores.dim() == 2 and labels.shape[0] == scores.shape[0]:
        rows = nonfinite_rows(scores)
        dropped = int(rows.numel())
        if dropped and dropped == scores.shape[0]:
            raise InputError(str(path), f"every one of its {dropped} rows has a NaN or infinity")
        scores, labels = drop_rows(scores, labels, rows)
    validate_scores(scores, labels, kind, str(path))
    return LogitsData(scores=scores, labels=labels, kind=kind, path=path, dropped_rows=dropped)


#: What ``curvcal metrics`` reads scores and labels from.
LOGITS_FILE_TYPES = ".npz, .pt, .safetensors, .parquet or .csv"


def _refuse_unknown_type(path: Path) -> None:
    """An :class:`InputError` naming the file's type (another framework's model, by name) when
    it is no file of scores and labels; nothing for a missing file (refused as missing)."""
    if is_table(path) or is_tensor_file(path) or not path.exists():
        return
    from curvcal.load.files.formats import foreign_format

    head = b""
    if path.is_file():
        with path.open("rb") as handle:
            head = handle.read(8)
    found = foreign_format(path, head)
    why = (
        f"is {found}, not a file of scores"
        if found
        else f"unknown file type '{path.suffix or '(none)'}'"
    )
    raise InputError(
        str(path),
        why,
        f"run the model and save its logits and labels to a {LOGITS_FILE_TYPES} file "
        "(arrays 'logits' (N, K) and 'labels' (N,))",
    )


def binary_columns(scores: torch.Tensor, kind: str, source: str) -> torch.Tensor:
    """One score per row, a binary problem's score of class 1, as the two columns ``(N, 2)``
    the metrics take.

    Logits: z is the logit of class 1, P(class 1) = σ(z), and ``[0, z]`` gives exactly that
    under softmax (softmax([0, z])₁ = 1/(1 + e^(−z)) = σ(z)); temperature scaling of ``[0, z]``
    scales z. Probabilities: p = P(class 1), ``[1 − p, p]`` (p must lie in [0, 1]).
    Log-probabilities: l = log P(class 1) ≤ 0, ``[log(1 − e^l), l]``."""
    if kind == "logits":
        return torch.stack([torch.zeros_like(scores), scores], dim=1)
    finite = torch.isfinite(scores)
    bad = finite & ((scores < 0) | (scores > 1) if kind == "probs" else scores > 0)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        rule = "in [0, 1]" if kind == "probs" else "at most 0"
        raise InputError(
            source,
            f"row {row} is {float(scores[row]):.6g}; one {_noun(kind)} per row is read as that of "
            f"class 1 and must be {rule}",
        )
    if kind == "probs":
        return torch.stack([1.0 - scores, scores], dim=1)
    return torch.stack([torch.log1p(-torch.exp(scores)), scores], dim=1)


def save_logits(path: str | Path, logits: torch.Tensor, labels: torch.Tensor) -> None:
    """Write ``logits`` and ``labels`` under those names; format by suffix, written atomically."""
    path = Path(path)
    if logits.dim() != 2 or labels.dim() != 1 or logits.shape[0] != labels.shape[0]:
        raise InputError(
            str(path),
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match "
            "(expected (N, K) and (N,))",
        )
    write_tensor_file(path, {"logits": logits, "labels": labels.to(torch.int64)})


def validate_scores(scores: torch.Tensor, labels: torch.Tensor, kind: str, source: str) -> None:
    """Raise :class:`InputError` naming ``source`` unless the scores are valid for ``kind``."""
    if kind not in INPUT_KINDS:
        raise InputError("--input-kind", f"'{kind}' is not one of {', '.join(INPUT_KINDS)}")
    if scores.dim() != 2:
        raise InputError(source, f"scores must be 2-D (N, K), got shape {tuple(scores.shape)}")
    n_rows, n_classes = scores.shape
    if n_rows == 0:
        raise InputError(source, "holds no samples")
    if n_classes == 0:
        raise InputError(source, "scores have no columns (K = 0)")
    if labels.dim() != 1 or labels.shape[0] != n_rows:
        raise InputError(
            source, f"has {n_rows} rows of scores but labels of shape {tuple(labels.shape)}"
        )
    labels = as_labels(labels, source)
    if int(labels.max()) >= n_classes:
        row = int((labels >= n_classes).nonzero()[0, 0])
        raise InputError(
            source,
            f"label {int(labels[row])} in row {row} is out of range for K = {n_classes} "
            f"classes (labels must be in [0, {n_classes}))",
        )
    values = scores.to(torch.float64)
    finite = torch.isfinite(values).all(dim=1)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        row = int(bad[0, 0])
        raise InputError(
            source,
            f"row {row} has a NaN or infinite {_noun(kind)} ({bad.shape[0]} of {n_rows} rows do)",
            "--nan-policy drop leaves such rows out",
        )
    if kind == "logits":
        return
    if kind == "probs":
        negative = (values < 0).any(dim=1)
        if bool(negative.any()):
            row = int(negative.nonzero()[0, 0])
            raise InputError(
                source,
                f"row {row} has a negative probability ({float(values[row].min()):.6g})",
            )
        sums = values.sum(dim=1)
        rule = "probabilities must sum to 1"
    else:
        positive = (values > 0).any(dim=1)
        if bool(positive.any()):
            row = int(positive.nonzero()[0, 0])
            raise InputError(
                source,
                f"row {row} has a log-probability above 0 ({float(values[row].max()):.6g})",
            )
        sums = values.exp().sum(dim=1)
        rule = "exp of log-probabilities must sum to 1"
    off = (sums - 1.0).abs() > ROW_SUM_TOLERANCE
    if bool(off.any()):
        row = int(off.nonzero()[0, 0])
        raise InputError(
            source,
            f"row {row} sums to {float(sums[row]):.6g} ({rule} within {ROW_SUM_TOLERANCE:g})",
        )


def _noun(kind: str) -> str:
    return {"logits": "logit", "probs": "probability", "logprobs": "log-probability"}[kind]
