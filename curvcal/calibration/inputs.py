"""Validate scores and labels and turn scores into float64 log-probabilities.

The input kind is always explicit, never guessed: ``"logits"`` (any real numbers; converted
by one ``log_softmax``), ``"probs"`` (finite, non-negative, rows summing to 1 within
:data:`PROB_SUM_TOL`) or ``"logprobs"`` (no NaN or +inf, rows whose probabilities sum to 1
within :data:`PROB_SUM_TOL`; -inf marks a probability of exactly 0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch

from curvcal import rows
from curvcal.errors import InputError
from curvcal.settings.calibration import EDGES as EDGES
from curvcal.settings.calibration import check_bins as check_bins

KINDS = ("logits", "probs", "logprobs")
PROB_SUM_TOL = 1e-4
#: Rows per chunk are chosen so one chunk holds about this many elements: small enough to stay
#: in cache (large temporaries cost page faults), large enough that Python overhead is small.
CHUNK_ELEMENTS = 1 << 16
#: On a device (CUDA) a chunk is a kernel launch: chunks of about this many elements (256 MiB of
#: float64) keep the launches few and the temporaries far below the device's memory.
DEVICE_CHUNK_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class InputNames:
    """What error messages call the two inputs of a fit or a metric: its ``scores`` (for a map
    fitted to the model's last-layer inputs, those features) and their ``labels``. A Python
    call leaves the defaults; the command line names them after the file they came from
    (:meth:`of`), once, where it hands them to the fits and metrics."""

    scores: str = "scores"
    labels: str = "labels"

    @classmethod
    def of(cls, source: str) -> InputNames:
        """The names of scores read from ``source`` and of their labels (``{source} labels``)."""
        return cls(source, f"{source} labels")


#: The names a Python call gives the inputs unless told otherwise.
INPUTS = InputNames()

_Parameters = ParamSpec("_Parameters")
_Result = TypeVar("_Result")


def accepts_source_keywords(
    function: Callable[_Parameters, _Result],
) -> Callable[_Parameters, _Result]:
    """``function`` (which names its inputs by ``names``, an :class:`InputNames`) accepting
    also the keywords the public API took before: ``source=`` (the scores' name) and
    ``labels_source=`` (the labels'), each defaulting as :class:`InputNames` does."""

    @functools.wraps(function)
    def accepting(*args: _Parameters.args, **kwargs: _Parameters.kwargs) -> _Result:
        former: dict[str, Any] = {
            field: kwargs.pop(keyword)
            for field, keyword in (("scores", "source"), ("labels", "labels_source"))
            if keyword in kwargs
        }
        if former:
            if "names" in kwargs:
                raise TypeError(
                    f"{function.__name__}() takes names= or source=/labels_source=, not both"
                )
            kwargs["names"] = InputNames(**former)
        return function(*args, **kwargs)

    return accepting


def chunk_rows(n_classes: int, device: torch.device | None = None) -> int:
    """Rows per chunk for an N×K pass (at least 1): cache-sized on the CPU, far larger on a
    ``device`` of another type."""
    elements = CHUNK_ELEMENTS if device is None or device.type == "cpu" else DEVICE_CHUNK_ELEMENTS
    return max(1, elements // max(1, n_classes))


def as_tensor(value: Any, what: str) -> torch.Tensor:
    """A tensor view of a tensor, NumPy array or nested sequence (no copy when possible)."""
    if isinstance(value, torch.Tensor):
        problem = rows.tensor_problem(value)
        if problem is not None:
            raise InputError(what, f"the tensor {problem}")
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, Sequence):
        try:
            return torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as exc:
            raise InputError(what, f"cannot read as an array: {exc}") from None
    raise InputError(what, f"expected a tensor or array, got {type(value).__name__}")


def _all_finite(block: torch.Tensor) -> bool:
    """Whether every entry is finite: min and max propagate NaN, so two numbers decide."""
    if block.numel() == 0:
        return True
    low, high = torch.aminmax(block)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InputError("kind", f"unknown score kind {kind!r}", f"one of {', '.join(KINDS)}")


def log_probabilities(
    scores: Any,
    kind: str = "logits",
    source: str = "scores",
    *,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Validated N×K float64 log-probabilities from ``scores`` of the given ``kind``.

    Logits go through one ``log_softmax`` in float64 (so a float32 softmax that would saturate
    to exactly 1.0 cannot); probabilities through ``log``. The caller's tensor is not modified.
    Raises :class:`InputError` naming ``source`` for a wrong shape, dtype or value. ``device``:
    where the log-probabilities are computed and kept (default: the CPU); each chunk of rows is
    moved there in the scores' own dtype and converted there.
    """
    out_device = torch.empty(0, device=device).device  # "cuda" names its index here
    z = validated_scores(scores, kind, source, keep_on=out_device)
    n, k = z.shape
    out = torch.empty((n, k), dtype=torch.float64, device=out_device)
    step = chunk_rows(k, out.device)
    for start in range(0, n, step):
        out[start : start + step] = chunk_log_probabilities(
            z[start : start + step].to(out.device), kind, start, source
        )
    return out


def validated_scores(
    scores: Any, kind: str, source: str, *, keep_on: torch.device | None = None
) -> torch.Tensor:
    """``scores`` as a 2-D, non-empty CPU tensor of a dtype ``kind`` allows (values unchecked);
    a tensor already on the device ``keep_on`` stays there."""
    check_kind(kind)
    z = as_tensor(scores, source)
    if z.ndim != 2:
        raise InputError(
            source, f"scores must be 2-D (samples × classes), got shape {tuple(z.shape)}"
        )
    n, k = z.shape
    if n == 0 or k == 0:
        raise InputError(source, f"scores are empty (shape {tuple(z.shape)})")
    if not (z.is_floating_point() or (z.dtype in (torch.int32, torch.int64) and kind == "logits")):
        raise InputError(source, f"scores must be floating point, got {z.dtype}")
    return z if z.device.type == "cpu" or z.device == keep_on else z.cpu()


def check_finite_logits(block: torch.Tensor, start: int, source: str) -> None:
    """:class:`InputError` naming the first row (offset by ``start``) holding a NaN or inf."""
    if not _all_finite(block):
        bad = start + int((~torch.isfinite(block)).any(dim=1).nonzero()[0, 0])
        raise InputError(source, f"logits contain NaN or infinity (first at row {bad})")


def chunk_log_probabilities(
    scores: torch.Tensor, kind: str, start: int, source: str
) -> torch.Tensor:
    """float64 log-probabilities of one chunk of rows (the first is row ``start``), validated."""
    block = scores.to(torch.float64)
    rows = f"rows {start}..{start + block.shape[0] - 1}"
    if kind == "logits":
        check_finite_logits(block, start, source)
        return torch.log_softmax(block, dim=1)
    if kind == "probs":
        if not _all_finite(block):
            raise InputError(source, f"probabilities contain NaN or infinity ({rows})")
        if (block < 0).any():
            raise InputError(source, f"probabilities contain negative values ({rows})")
        total = block.sum(dim=1)
        logp = torch.log(block)
    else:
        if torch.isnan(block).any() or (block == float("inf")).any():
            raise InputError(source, f"log-probabilities contain NaN or +inf ({rows})")
        if (block > 0).any():
            raise InputError(source, f"log-probabilities must be <= 0 ({rows})")
        total = torch.exp(block).sum(dim=1)
        logp = block
    off = (total - 1.0).abs() > PROB_SUM_TOL
    if off.any():
        bad = int(off.nonzero()[0, 0])
        raise InputError(
            source,
            f"row {start + bad} sums to {float(total[bad]):.6g}, not 1 (tolerance {PROB_SUM_TOL:g})",
            "if these are logits, give them as logits",
        )
    return logp


def looks_like_probabilities(scores: Any) -> bool:
    """Whether N×K ``scores`` read as logits look like probabilities instead: every entry
    finite and non-negative and every row summing to 1 within :data:`PROB_SUM_TOL` (the test
    ``--input-kind probs`` applies). Logits rarely pass it; softmax outputs always do."""
    z = as_tensor(scores, "scores")
    if z.ndim != 2 or z.numel() == 0 or not z.is_floating_point():
        return False
    step = chunk_rows(z.shape[1])
    for start in range(0, z.shape[0], step):
        block = z[start : start + step].to(torch.float64)
        if not _all_finite(block) or bool((block < 0).any()):
            return False
        if bool(((block.sum(dim=1) - 1.0).abs() > PROB_SUM_TOL).any()):
            return False
    return True


def class_labels(
    labels: Any, n_samples: int, n_classes: int, source: str = "labels"
) -> torch.Tensor:
    """Validated int64 labels: 1-D, one per sample, each in [0, n_classes)."""
    y = as_tensor(labels, source)
    if y.ndim != 1:
        raise InputError(source, f"labels must be 1-D, got shape {tuple(y.shape)}")
    if y.shape[0] != n_samples:
        raise InputError(source, f"{y.shape[0]} labels for {n_samples} rows of scores")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise InputError(source, f"labels must be integers, got {y.dtype}")
    y = y.to(device="cpu", dtype=torch.int64)
    if n_samples and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise InputError(
            source,
            f"labels must lie in [0, {n_classes}), found {int(y.min())}..{int(y.max())}",
            "the number of classes is the number of score columns",
        )
    return y
