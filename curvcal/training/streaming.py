"""A streaming calibration metric in the style of torchmetrics: ``update(logits, labels)`` per
batch, ``compute()`` at the end, ``reset()`` between epochs.

It holds only sufficient statistics, never the scores: with M equal-width bins and K classes,
the per-bin count, Σ confidence and Σ correct of the top label (M each), the per-(class, bin)
count, Σ p_k and Σ 1[y = k] (K×M each), and the sums of −log p_y, of the Brier term
Σ_k (p_k − 1[y = k])², of the confidence and of correct predictions. Every metric it returns is
then the formula of :mod:`curvcal.calibration.metrics` on those sums, with the same binning
(:mod:`curvcal.calibration.bins`: ``edges="left"`` puts an edge value in the lower bin,
c = 0 in bin 0, c = 1 in the last bin) and the same per-batch scan, so ``compute()`` equals
:func:`~curvcal.calibration.metrics.calibration_metrics` of the concatenated batches up to
float64 summation order. Metrics that need every score (AdaECE, smooth ECE, KS, MMCE, AURC)
are not streamed: use :func:`~curvcal.calibration.metrics.calibration_metrics` on stored
logits for those.

Under ``torch.distributed`` (when a process group is initialised) ``compute()`` all-reduces the
sums, so every rank returns the metrics of the union of all ranks' batches; the metric's own
state is left as it was, so ``update`` may go on after a ``compute``.
"""

from __future__ import annotations

from typing import Any

import torch

from curvcal.calibration.bins import bin_sums, equal_width_index
from curvcal.calibration.metrics import _prepare, _scan, binned_errors
from curvcal.results import CALIBRATION_METRIC_FIELDS

#: metrics that need every score, not sums over bins: left out of the stream
_NEED_EVERY_SCORE = frozenset({"adaece", "smooth_ece", "ks_ce", "kuiper", "mmce", "aurc", "e_aurc"})
#: the metrics :meth:`StreamingCalibration.compute` returns: the sample count and every metric
#: of :data:`~curvcal.results.CALIBRATION_METRIC_FIELDS` computable from the streamed sums
STREAMED = (
    "n_samples",
    *(name for name in CALIBRATION_METRIC_FIELDS if name not in _NEED_EVERY_SCORE),
)


class StreamingCalibration:
    """Top-label ECE, MCE, RMS-CE (and debiased), classwise ECE, NLL, Brier, accuracy and mean
    confidence over every batch given to :meth:`update` since the last :meth:`reset`.

    ``bins``, ``edges`` and ``kind`` (``"logits"``, ``"probs"``, ``"logprobs"``) as for
    :func:`~curvcal.calibration.metrics.calibration_metrics`; the number of classes K is taken
    from the first batch and every later batch must have it.

    >>> import torch
    >>> metric = StreamingCalibration(bins=2)
    >>> metric.update(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    >>> metric.update(torch.tensor([[0.0, 1.0]]), torch.tensor([0]))
    >>> metric.compute()["accuracy"]
    0.5
    """

    def __init__(self, bins: int = 15, edges: str = "left", kind: str = "logits") -> None:
        _prepare(torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64), kind, bins, edges)
        self.bins, self.edges, self.kind = bins, edges, kind
        self.n_classes: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every batch."""
        m = self.bins
        self.count = torch.zeros(m, dtype=torch.float64)
        self.sum_confidence = torch.zeros(m, dtype=torch.float64)
        self.sum_correct = torch.zeros(m, dtype=torch.float64)
        self.class_count: torch.Tensor | None = None
        self.class_sum_p: torch.Tensor | None = None
        self.class_sum_y: torch.Tensor | None = None
        #: Σ −log p_y, Σ Brier term, Σ confidence, Σ correct
        self.totals = torch.zeros(4, dtype=torch.float64)
        self.n_classes = None

    def update(self, scores: Any, labels: Any) -> None:
        """Add one batch: N×K ``scores`` of the metric's ``kind`` and N integer labels (any
        device and dtype; the statistics are kept in float64 on the CPU)."""
        scores = scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores
        labels = labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels
        z, y = _prepare(scores, labels, self.kind, self.bins, self.edges)
        k = z.shape[1]
        if self.n_classes is not None and k != self.n_classes:
            from curvcal.errors import InputError

            raise InputError(
                "scores", f"this batch has {k} classes, the earlier ones {self.n_classes}"
            )
        top, sum_p, sum_y, count = _scan(z, y, self.bins, self.edges, self.kind)
        index = equal_width_index(top.confidence, self.bins, self.edges)
        n_b, s_conf, s_correct = bin_sums(index, top.confidence, top.correct, self.bins)
        self.count += n_b
        self.sum_confidence += s_conf
        self.sum_correct += s_correct
        if self.class_count is None or self.class_sum_p is None or self.class_sum_y is None:
            self.n_classes = k
            self.class_count, self.class_sum_p, self.class_sum_y = count, sum_p, sum_y
        else:
            self.class_count += count
            self.class_sum_p += sum_p
            self.class_sum_y += sum_y
        self.totals += torch.stack(
            [top.nll.sum(), top.brier.sum(), top.confidence.sum(), top.correct.sum()]
        )

    def _state(self) -> tuple[torch.Tensor, int]:
        """Every statistic in one flat float64 vector (all-reduced across ranks when a process
        group is initialised) and K."""
        k = self.n_classes or 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            k = int(_all_reduce(torch.tensor([float(k)], dtype=torch.float64), "max")[0])
        per_class = torch.zeros(3, k, self.bins, dtype=torch.float64)
        if self.class_count is not None and self.class_sum_p is not None:
            assert self.class_sum_y is not None
            per_class[:, : self.class_count.shape[0]] = torch.stack(
                [self.class_count, self.class_sum_p, self.class_sum_y]
            )
        flat = torch.cat(
            [self.count, self.sum_confidence, self.sum_correct, per_class.reshape(-1), self.totals]
        )
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flat = _all_reduce(flat, "sum")
        return flat, k

    def compute(self) -> dict[str, float]:
        """The metrics of :data:`STREAMED` over every batch so far (of every rank under
        ``torch.distributed``), by the formulas of :mod:`curvcal.calibration.metrics`:
        ECE = Σ_b n_b/N·|acc_b − conf_b| and friends from the bin sums, classwise ECE =
        mean_k Σ_b |Σ 1[y=k] − Σ p_k|/N, NLL and Brier as means. NaN for every metric when no
        sample was seen."""
        flat, k = self._state()
        m = self.bins
        count, sum_conf, sum_correct = flat[:m], flat[m : 2 * m], flat[2 * m : 3 * m]
        per_class = flat[3 * m : 3 * m + 3 * k * m].reshape(3, k, m)
        nll, brier, confidence, correct = flat[3 * m + 3 * k * m :].tolist()
        n = float(count.sum())
        if n == 0:
            return {name: (0.0 if name == "n_samples" else float("nan")) for name in STREAMED}
        errors = binned_errors(count, sum_conf, sum_correct)
        classwise = (per_class[2] - per_class[1]).abs().sum(dim=1) / n
        return {
            "n_samples": n,
            "accuracy": correct / n,
            "mean_confidence": confidence / n,
            "ece": errors.ece,
            "mce": errors.mce,
            "rms_ce": errors.rms_ce,
            "rms_ce_debiased": errors.rms_ce_debiased,
            "classwise_ece": float(classwise.mean()),
            "nll": nll / n,
            "brier": brier / n,
        }


def _all_reduce(values: torch.Tensor, op: str) -> torch.Tensor:
    """``values`` summed (``op="sum"``) or maximised over every rank, as a new CPU tensor; on
    the current CUDA device for the NCCL backend, which reduces nothing on the CPU."""
    import torch.distributed as dist

    on_gpu = dist.get_backend() == "nccl"
    buffer = values.to(torch.device("cuda", torch.cuda.current_device())) if on_gpu else values
    buffer = buffer.clone()
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return buffer.cpu()
