"""Calibration metrics of classifier scores: one formula each, all computed in float64.

Conventions (printed with every result):

- p = softmax of the logits (or the given probabilities); confidence c = max_k p_k,
  prediction = argmax (lowest index on ties), correct = 1[prediction = y].
- Binned metrics over bins B_b (see :mod:`curvcal.calibration.bins` for the edge side):
  ECE = Σ_b |B_b|/N · |acc_b - conf_b|; MCE = max over non-empty bins of |acc_b - conf_b|;
  RMS-CE = sqrt(Σ_b |B_b|/N · (acc_b - conf_b)²). Empty bins contribute nothing.
- Debiased RMS-CE (Kumar et al. 2019): sqrt(max(0, Σ_b |B_b|/N · [(acc_b - conf_b)² -
  acc_b(1 - acc_b)/(|B_b| - 1)])); bins with fewer than 2 samples contribute 0.
- AdaECE: the ECE formula over equal-mass, tie-safe bins; the number of bins used is reported.
  A tie group is a run of sorted confidences equal up to float64 rounding (neighbours at most
  16·2⁻⁵³ apart, relative: :mod:`curvcal.calibration.ties`), so confidences equal in exact
  arithmetic but a few units of rounding apart are never split by that noise.
- Classwise ECE: for every class k in 0..K-1 (K = number of score columns), the ECE formula with
  equal-width bins of p_k against 1[y = k]; the mean over the K classes.
- Positive-class ECE (K = 2 only): the classwise term of class 1.
- NLL = mean -log p_y (natural log, nats). Brier = mean over samples of Σ_k (p_k - 1[y = k])²
  (a sum over classes, in [0, 2]).
- KS calibration error, Kuiper statistic, MMCE: binning-free, see
  :mod:`curvcal.calibration.binfree`. Risk–coverage curve, AURC and E-AURC: see
  :mod:`curvcal.calibration.selective`. All three and the curve are order-free on ties; KS,
  Kuiper and the curve use the tie groups of AdaECE.
- Intervals (:mod:`curvcal.calibration.intervals`): 95% intervals that hold the population
  ECE, AdaECE, classwise ECE and smooth ECE (the estimate ± the bootstrap's 95% quantile of its
  error norm), MCE (Hoeffding per bin) and NLL (Student's t), over resamples drawn with a
  private generator seeded by ``seed``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from curvcal.calibration import binfree, intervals
from curvcal.calibration import bins as binning
from curvcal.calibration.inputs import (
    INPUTS,
    InputNames,
    accepts_source_keywords,
    check_bins,
    check_finite_logits,
    chunk_log_probabilities,
    chunk_rows,
    class_labels,
    validated_scores,
)
from curvcal.calibration.results import CalibrationMetrics, ClassReliability, ReliabilityBin
from curvcal.calibration.selective import RiskCoverage, optimal_aurc, risk_coverage_curve
from curvcal.calibration.smooth import smooth_ece, smooth_reliability
from curvcal.errors import InputError
from curvcal.seeds import seeded_generator

INTERVAL_LEVEL = intervals.INTERVAL_LEVEL
#: Elements per chunk of the metrics scan: larger than the solvers' chunks, as the scan makes
#: about thirty small calls per chunk and with many classes their overhead dominated.
SCAN_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class TopLabel:
    """Per-sample quantities every top-label metric is built from (float64, length N)."""

    confidence: torch.Tensor
    correct: torch.Tensor
    nll: torch.Tensor
    brier: torch.Tensor


def top_label(logp: torch.Tensor, labels: torch.Tensor) -> TopLabel:
    """Confidence, correctness, per-sample NLL and Brier from N×K float64 log-probabilities."""
    return _scan(logp, labels)[0]


def _probabilities(
    block: torch.Tensor, y: torch.Tensor, kind: str | None, start: int, source: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p, confidence, prediction, -log p_y) of one chunk, p in a new float64 tensor.

    Logits: z - max z is exponentiated once; that one exp gives the normaliser S = Σ_k
    exp(z_k - max z), p = exp(z - max z)/S, confidence = exp(-log S) and -log p_y =
    log S - (z_y - max z), the numbers log_softmax gives, without a second N×K exp.
    Other kinds: validated float64 log-probabilities (``kind`` None: already validated).
    """
    if kind == "logits":
        shifted = block.to(torch.float64, copy=True)
        check_finite_logits(shifted, start, source)
        top, prediction = shifted.max(dim=1)  # first maximal index on ties
        shifted -= top[:, None]
        shifted_y = shifted.gather(1, y[:, None])[:, 0]
        p = shifted.exp_()
        log_total = p.sum(dim=1).log_()
        p *= torch.exp(-log_total)[:, None]
        return p, torch.exp(-log_total), prediction, log_total - shifted_y
    logp = block if kind is None else chunk_log_probabilities(block, kind, start, source)
    top, prediction = logp.max(dim=1)
    return torch.exp(logp), torch.exp(top), prediction, -logp.gather(1, y[:, None])[:, 0]


def _first_bin_limit(n_bins: int, edges: str) -> float:
    """The largest p that :func:`bins.equal_width_index` puts in bin 0 (inf for one bin).

    The index is monotone in p, so ``p > limit`` is exactly "bin index > 0": the classwise
    sums need the full binning only for those entries (at most M - 1 per row, as Σ_k p_k = 1).
    """
    if n_bins == 1:
        return math.inf

    def first(value: float) -> bool:
        return (
            int(
                binning.equal_width_index(
                    torch.tensor([value], dtype=torch.float64), n_bins, edges
                )[0]
            )
            == 0
        )

    limit = 1.0 / n_bins
    while not first(limit):
        limit = math.nextafter(limit, 0.0)
    while first(math.nextafter(limit, 1.0)):
        limit = math.nextafter(limit, 1.0)
    return limit


def _scan(
    scores: torch.Tensor,
    labels: torch.Tensor,
    n_bins: int = 0,
    edges: str = "left",
    kind: str | None = None,
    source: str = "scores",
    device: torch.device | None = None,
) -> tuple[TopLabel, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One cache-sized pass over the scores: the top-label quantities and, when ``n_bins`` >
    0, the classwise per-(class, bin) sums of p_k and of 1[y = k] and counts (K×M each).
    ``device``: where the pass runs, in chunks moved there (default: the CPU); what it returns
    (N numbers per quantity, K×M tables) is brought back to the CPU.

    ``scores`` are raw scores of ``kind`` (validated chunk by chunk) or, with ``kind`` None,
    validated float64 log-probabilities. p is computed once per chunk and serves the
    confidence, the Brier score Σ_k p_k² - 2 p_y + 1 (no one-hot matrix) and the classwise
    bins. Entries in bin 0 (all but at most M - 1 per row) are summed per class by one
    column sum; the others are binned and counted by ``bincount`` on flattened (class, bin)
    indices; 1[y = k] is non-zero once per row, so its sums need only the N label entries.
    """
    n, k = scores.shape
    on = torch.empty(0, device=device).device
    confidence = torch.empty(n, dtype=torch.float64, device=on)
    correct = torch.empty(n, dtype=torch.float64, device=on)
    nll = torch.empty(n, dtype=torch.float64, device=on)
    brier = torch.empty(n, dtype=torch.float64, device=on)
    size = k * n_bins
    sum_p = torch.zeros(size, dtype=torch.float64, device=on)
    sum_p_first = torch.zeros(k, dtype=torch.float64, device=on)
    sum_y = torch.zeros(size, dtype=torch.float64, device=on)
    count = torch.zeros(size, dtype=torch.float64, device=on)
    count_above = torch.zeros(k, dtype=torch.float64, device=on)
    limit = _first_bin_limit(n_bins, edges) if n_bins else math.inf
    step = max(1, SCAN_ELEMENTS // k) if on.type == "cpu" else chunk_rows(k, on)
    for start in range(0, n, step):
        block = scores[start : start + step].to(on)
        y = labels[start : start + step].to(on)
        rows = slice(start, start + block.shape[0])
        p, confidence[rows], prediction, nll[rows] = _probabilities(block, y, kind, start, source)
        p_y = p.gather(1, y[:, None])[:, 0]
        correct[rows] = prediction == y
        brier[rows] = torch.linalg.vecdot(p, p) - 2 * p_y + 1
        if n_bins:
            above = p > limit
            row, column = above.nonzero(as_tuple=True)
            values = p[row, column]
            sum_p_first += p.masked_fill_(above, 0.0).sum(dim=0)
            flat = binning.equal_width_index(values, n_bins, edges).add_(column * n_bins)
            sum_p += torch.bincount(flat, weights=values, minlength=size)
            count += torch.bincount(flat, minlength=size)
            count_above += torch.bincount(column, minlength=k)
            label_bin = binning.equal_width_index(p_y, n_bins, edges).add_(y * n_bins)
            sum_y += torch.bincount(label_bin, minlength=size)
    top_label = TopLabel(confidence.cpu(), correct.cpu(), nll.cpu(), brier.cpu())
    columns = max(n_bins, 0)
    sum_p, count = sum_p.view(k, columns), count.view(k, columns)
    if n_bins:
        sum_p[:, 0] += sum_p_first
        count[:, 0] += n - count_above
    return top_label, sum_p.cpu(), sum_y.view(k, columns).cpu(), count.cpu()


@dataclass(frozen=True)
class BinnedErrors:
    """ECE, MCE, RMS-CE and debiased RMS-CE of one set of bin sums."""

    ece: float
    mce: float
    rms_ce: float
    rms_ce_debiased: float


def binned_errors(
    count: torch.Tensor, sum_conf: torch.Tensor, sum_correct: torch.Tensor
) -> BinnedErrors:
    """The binned-error formulas of the module docstring, from per-bin sums (float64)."""
    total = float(count.sum())
    used = count > 0
    n_b, gap_sum = count[used], (sum_correct - sum_conf)[used]
    gap = gap_sum / n_b
    ece = float(gap_sum.abs().sum()) / total
    mce = float(gap.abs().max()) if gap.numel() else 0.0
    squared = float((n_b * gap**2).sum()) / total
    accuracy = sum_correct[used] / n_b
    multi = n_b >= 2
    variance = accuracy[multi] * (1 - accuracy[multi]) / (n_b[multi] - 1)
    debiased = float((n_b[multi] * (gap[multi] ** 2 - variance)).sum()) / total
    return BinnedErrors(ece, mce, math.sqrt(squared), math.sqrt(max(0.0, debiased)))


def reliability_table(
    count: torch.Tensor,
    sum_conf: torch.Tensor,
    sum_correct: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    drop_empty: bool = False,
) -> tuple[ReliabilityBin, ...]:
    """Reliability bins from per-bin sums; empty bins have count 0 and NaN means."""
    rows = []
    for b in range(count.shape[0]):
        n_b = float(count[b])
        if n_b == 0 and drop_empty:
            continue
        conf = float(sum_conf[b]) / n_b if n_b else math.nan
        acc = float(sum_correct[b]) / n_b if n_b else math.nan
        rows.append(
            ReliabilityBin(float(lower[b]), float(upper[b]), round(n_b), conf, acc, acc - conf)
        )
    return tuple(rows)


def _equal_width(top: TopLabel, n_bins: int, edges: str) -> tuple[torch.Tensor, ...]:
    index = binning.equal_width_index(top.confidence, n_bins, edges)
    return (index, *binning.bin_sums(index, top.confidence, top.correct, n_bins))


def _equal_mass(
    top: TopLabel, n_bins: int, order: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    index = binning.equal_mass_index(top.confidence, n_bins, order=order)
    count, sum_conf, sum_correct = binning.bin_sums(index, top.confidence, top.correct, n_bins)
    inf = torch.full((n_bins,), math.inf, dtype=torch.float64)
    lower = inf.scatter_reduce(0, index, top.confidence, reduce="amin")
    upper = (-inf).scatter_reduce(0, index, top.confidence, reduce="amax")
    return count, sum_conf, sum_correct, lower, upper


def _classwise_sums(
    scores: torch.Tensor, labels: torch.Tensor, n_bins: int, edges: str, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (class, bin) sums of p_k and 1[y = k], each K×M."""
    _, sum_p, sum_y, _ = _scan(scores, labels, n_bins, edges, kind)
    return sum_p, sum_y


def _top(scores: torch.Tensor, labels: torch.Tensor, kind: str) -> TopLabel:
    return _scan(scores, labels, kind=kind)[0]


def top_label_of(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    names: InputNames = INPUTS,
    *,
    device: torch.device | None = None,
) -> TopLabel:
    """The per-sample confidence, correctness, NLL and Brier of N×K ``scores`` of ``kind``
    (validated; errors call the inputs by ``names``), computed on ``device`` (default: the CPU)
    and returned on the CPU."""
    z, y = _prepare(scores, labels, kind, 1, "left", names, device)
    return _scan(z, y, kind=kind, source=names.scores, device=device)[0]


def _prepare(
    scores: Any,
    labels: Any,
    kind: str,
    n_bins: int,
    edges: str,
    names: InputNames = INPUTS,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores checked for shape and dtype (values are checked by the scan) and labels; scores
    already on ``device`` stay there, others come to the CPU."""
    check_bins(n_bins, edges)
    keep_on = None if device is None else torch.empty(0, device=device).device
    z = validated_scores(scores, kind, names.scores, keep_on=keep_on)
    return z, class_labels(labels, z.shape[0], z.shape[1], names.labels)


@accepts_source_keywords
def calibration_metrics(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    bins: int = 15,
    edges: str = "left",
    bootstrap: int = 0,
    seed: int = 0,
    names: InputNames = INPUTS,
    reliability_classes: int = 0,
    smooth_curve: bool = False,
    *,
    device: torch.device | None = None,
) -> CalibrationMetrics:
    """Every metric of the module docstring in one pass over N×K ``scores``.

    ``device``: where the N×K pass runs (:func:`_scan`; default the CPU); the binning, the
    bootstrap and everything else of N numbers or fewer runs on the CPU.

    ``kind`` is ``"logits"``, ``"probs"`` or ``"logprobs"`` (never guessed); ``bins`` equal-width
    and equal-mass bins; ``edges`` ``"left"`` for (a, b] or ``"right"`` for [a, b);
    ``bootstrap`` resamples (0 = no intervals) drawn from a generator seeded by ``seed``.
    ``names`` says what error messages call the inputs (the former keywords ``source`` and
    ``labels_source``, the names of the scores and of the labels, still work).
    ``reliability_classes`` > 0 adds the classwise reliability tables of that many classes, the
    most frequent labels first (ties to the lower index). ``smooth_curve`` adds the smooth
    reliability curve at smooth ECE's bandwidth (:func:`curvcal.calibration.smooth.smooth_reliability`).

    >>> import torch
    >>> m = calibration_metrics(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    >>> m.accuracy
    0.5
    """
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise InputError(
            "bootstrap", f"the number of resamples must be an integer >= 0, got {bootstrap!r}"
        )
    z, y = _prepare(scores, labels, kind, bins, edges, names, device)
    n, k = z.shape
    top, c_p, c_y, c_n = _scan(z, y, bins, edges, kind, names.scores, device)
    index, count, sum_conf, sum_correct = _equal_width(top, bins, edges)
    width = binned_errors(count, sum_conf, sum_correct)
    bin_edges = binning.equal_width_edges(bins)
    order = torch.argsort(top.confidence, stable=True)
    m_count, m_conf, m_correct, m_lower, m_upper = _equal_mass(top, bins, order)
    mass = binned_errors(m_count, m_conf, m_correct)
    per_class = (c_y - c_p).abs().sum(dim=1) / n
    smooth = smooth_ece(top.confidence, top.correct)
    estimates = Estimates(
        width.ece, width.mce, mass.ece, float(per_class.mean()), smooth.value, smooth.bandwidth
    )
    metric_intervals, bin_intervals = (
        _bootstrap_intervals(
            top,
            index,
            order,
            bins,
            bootstrap,
            seed,
            estimates,
            _dense_probabilities(z.cpu(), y, kind, names.scores),
            y,
            edges,
        )
        if bootstrap and n >= 2  # one sample has no sampling spread to measure
        else ({}, ())
    )
    selective = risk_coverage_curve(top.confidence, top.correct, order)
    return CalibrationMetrics(
        n_samples=n,
        n_classes=k,
        n_bins=bins,
        edges=edges,
        accuracy=float(top.correct.mean()),
        mean_confidence=float(top.confidence.mean()),
        ece=width.ece,
        mce=width.mce,
        rms_ce=width.rms_ce,
        rms_ce_debiased=width.rms_ce_debiased,
        adaece=mass.ece,
        adaece_bins_used=int((m_count > 0).sum()),
        classwise_ece=float(per_class.mean()),
        nll=float(top.nll.mean()),
        brier=float(top.brier.mean()),
        smooth_ece=smooth.value,
        smooth_ece_bandwidth=smooth.bandwidth,
        smooth_ece_kernel=smooth.kernel,
        positive_class_ece=float(per_class[1]) if k == 2 else None,
        ece_bins=reliability_table(count, sum_conf, sum_correct, bin_edges[:-1], bin_edges[1:]),
        adaece_bins=reliability_table(
            m_count, m_conf, m_correct, m_lower, m_upper, drop_empty=True
        ),
        n_bootstrap=bootstrap,
        interval_level=INTERVAL_LEVEL,
        intervals=metric_intervals,
        bin_intervals=bin_intervals,
        smooth_curve=(
            smooth_reliability(top.confidence, top.correct, smooth.bandwidth)
            if smooth_curve
            else None
        ),
        class_bins=_class_tables(c_n, c_p, c_y, y, reliability_classes),
        ks_ce=binfree.ks_calibration_error(top.confidence, top.correct, order),
        kuiper=binfree.kuiper_statistic(top.confidence, top.correct, order),
        mmce=binfree.mmce(top.confidence, top.correct, order),
        aurc=selective.aurc,
        e_aurc=selective.aurc - optimal_aurc(top.correct),
        risk_coverage=selective.summary(),
    )


def _class_tables(
    count: torch.Tensor,
    sum_p: torch.Tensor,
    sum_y: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
) -> tuple[ClassReliability, ...]:
    """Classwise reliability tables of the ``n_classes`` most frequent labels."""
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 0:
        raise InputError("reliability_classes", f"must be an integer >= 0, got {n_classes!r}")
    if not n_classes:
        return ()
    k, n_bins = count.shape
    frequency = torch.bincount(labels, minlength=k)
    order = sorted(range(k), key=lambda c: (-int(frequency[c]), c))[:n_classes]
    edges = binning.equal_width_edges(n_bins)
    return tuple(
        ClassReliability(
            c,
            int(frequency[c]),
            reliability_table(count[c], sum_p[c], sum_y[c], edges[:-1], edges[1:]),
        )
        for c in order
    )


def resample_weights(n: int, n_resamples: int, seed: int) -> Iterator[torch.Tensor]:
    """``n_resamples`` bootstrap resamples of ``n`` rows, each as float64 multiplicities
    (``bincount`` of ``n`` indices drawn uniformly with replacement from a private generator
    seeded by ``seed``). Every stage of an analysis draws the same resamples (paired)."""
    generator = seeded_generator(seed)
    for _ in range(n_resamples):
        draw = torch.randint(n, (n,), generator=generator)
        yield torch.bincount(draw, minlength=n).to(torch.float64)


#: Resamples drawn and measured together (an R×N matrix of multiplicities).
RESAMPLE_BATCH = 32


def resample_batches(n: int, n_resamples: int, seed: int) -> Iterator[torch.Tensor]:
    """The resamples of :func:`resample_weights`, the same draws in the same order, stacked
    :data:`RESAMPLE_BATCH` at a time (R×N float64)."""
    batch: list[torch.Tensor] = []
    for weights in resample_weights(n, n_resamples, seed):
        batch.append(weights)
        if len(batch) == RESAMPLE_BATCH:
            yield torch.stack(batch)
            batch = []
    if batch:
        yield torch.stack(batch)


def _batch_sizes(total: int) -> list[int]:
    """``total`` split into batches of at most :data:`RESAMPLE_BATCH`."""
    full, rest = divmod(total, RESAMPLE_BATCH)
    return [RESAMPLE_BATCH] * full + ([rest] if rest else [])


def percentile_interval(draws: torch.Tensor) -> tuple[float, float]:
    """The central :data:`INTERVAL_LEVEL` percentile interval of 1-D float64 ``draws``."""
    # Linear interpolation between an infinite and a finite draw is undefined: fall back
    # to the nearest order statistic when a resample has an infinite NLL.
    tail = (1 - INTERVAL_LEVEL) / 2
    method = "linear" if torch.isfinite(draws).all() else "nearest"
    levels = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    low, high = torch.quantile(draws, levels, interpolation=method)
    return float(low), float(high)


def _dense_probabilities(
    scores: torch.Tensor, labels: torch.Tensor, kind: str, source: str
) -> torch.Tensor | None:
    """The N×K float64 probabilities, or ``None`` above the classwise bootstrap's size."""
    n, k = scores.shape
    if n * k > intervals.CLASSWISE_ELEMENTS:
        return None
    out = torch.empty(n, k, dtype=torch.float64)
    step = max(1, SCAN_ELEMENTS // k)
    for start in range(0, n, step):
        block, y = scores[start : start + step], labels[start : start + step]
        out[start : start + block.shape[0]] = _probabilities(block, y, kind, start, source)[0]
    return out


@dataclass(frozen=True)
class Estimates:
    """The point estimates the intervals are centred on."""

    ece: float
    mce: float
    adaece: float
    classwise_ece: float
    smooth_ece: float
    smooth_bandwidth: float


def _bootstrap_intervals(
    top: TopLabel,
    index: torch.Tensor,
    order: torch.Tensor,
    n_bins: int,
    n_bootstrap: int,
    seed: int,
    estimates: Estimates,
    probabilities: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    edges: str = "left",
) -> tuple[dict[str, tuple[float, float]], tuple[tuple[float, float] | None, ...]]:
    """The metrics' 95% intervals (:mod:`curvcal.calibration.intervals`: error-norm bounds
    centred on each estimate; NLL's a percentile interval), and the percentile interval of
    each equal-width bin's accuracy (over the resamples in which the bin is not empty;
    ``None`` for a bin empty in the data); a resample is the multiplicity of each sample.
    ``probabilities`` (N×K, with ``labels``) add the classwise ECE's interval."""
    n = top.confidence.shape[0]
    residual = top.correct - top.confidence
    width = intervals.BinnedDeviation(index, residual, n_bins, top.confidence)
    mass_index = binning.equal_mass_index(top.confidence, n_bins, order=order)
    mass = intervals.BinnedDeviation(mass_index, residual, n_bins, top.confidence)
    smooth = intervals.SmoothDeviation(top.confidence, residual, estimates.smooth_bandwidth)
    classwise = (
        intervals.ClasswiseDeviation(probabilities, labels, n_bins, edges)
        if probabilities is not None and labels is not None
        else None
    )
    nll: list[torch.Tensor] = []
    bin_accuracy: list[torch.Tensor] = []
    null = torch.Generator().manual_seed(intervals.null_seed(seed))
    classwise_null = torch.Generator().manual_seed(intervals.null_seed(seed) + 1)
    for weights in resample_batches(n, n_bootstrap, seed):
        for deviation in (width, mass, smooth):
            deviation.draw(weights)
        if classwise is not None:
            classwise.draw(weights)
            classwise.draw_null(
                intervals.calibrated_labels(
                    classwise.probabilities, weights.shape[0], classwise_null
                )
            )
        count = torch.zeros(weights.shape[0], n_bins, dtype=torch.float64)
        count.index_add_(1, index, weights)
        hits = torch.zeros_like(count).index_add_(1, index, weights * top.correct)
        bin_accuracy.append(torch.where(count > 0, hits / count.clamp(min=1), math.nan))
        # a row not drawn adds nothing, an infinite -log p_y included (0·inf is nan)
        nll.append(torch.where(weights > 0, weights * top.nll, 0.0).sum(dim=1) / n)
    for size in _batch_sizes(intervals.null_draw_count(n_bootstrap, n)):
        outcomes = intervals.calibrated_outcomes(top.confidence, size, null)
        for deviation in (width, mass):
            deviation.draw_null(outcomes)
    nll_estimate = float(top.nll.mean())
    out = {
        "mce": width.mce_interval(estimates.mce),
        "smooth_ece": smooth.interval(estimates.smooth_ece),
        "nll": intervals.mean_interval(top.nll, floor=0.0)
        or intervals.contains(percentile_interval(torch.cat(nll)), nll_estimate),
    }
    if intervals.enough_rows(n, n_bins):
        out["ece"] = width.ece_interval(estimates.ece)
        out["adaece"] = mass.ece_interval(estimates.adaece)
    if classwise is not None and intervals.enough_rows(n, n_bins * classwise.k):
        out["classwise_ece"] = classwise.interval(estimates.classwise_ece)
    tail = (1 - INTERVAL_LEVEL) / 2
    levels = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    present = torch.bincount(index, minlength=n_bins) > 0
    per_bin = torch.cat(bin_accuracy)  # resamples × bins
    bins_out: list[tuple[float, float] | None] = []
    for b in range(n_bins):
        column = per_bin[:, b][~torch.isnan(per_bin[:, b])]
        if not present[b] or column.numel() == 0:
            bins_out.append(None)
            continue
        low, high = torch.quantile(column, levels)
        bins_out.append((float(low), float(high)))
    return out, tuple(bins_out)


# Small public functions, one per metric, sharing the stages above.


def _top_of(scores: Any, labels: Any, kind: str) -> Any:
    """The top-label statistics of one set of scores (no binning)."""
    logp, y = _prepare(scores, labels, kind, 1, "left")
    return _top(logp, y, kind)


def accuracy(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Top-1 accuracy (argmax, lowest index on ties)."""
    return float(_top_of(scores, labels, kind).correct.mean())


def mean_confidence(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Mean of the top-label confidence max_k p_k."""
    return float(_top_of(scores, labels, kind).confidence.mean())


def _width_errors(scores: Any, labels: Any, kind: str, bins: int, edges: str) -> BinnedErrors:
    logp, y = _prepare(scores, labels, kind, bins, edges)
    _, count, sum_conf, sum_correct = _equal_width(_top(logp, y, kind), bins, edges)
    return binned_errors(count, sum_conf, sum_correct)


def expected_calibration_error(
    scores: Any, labels: Any, kind: str = "logits", bins: int = 15, edges: str = "left"
) -> float:
    """Top-label ECE with equal-width bins (see the module docstring)."""
    return _width_errors(scores, labels, kind, bins, edges).ece


def maximum_calibration_error(
    scores: Any, labels: Any, kind: str = "logits", bins: int = 15, edges: str = "left"
) -> float:
    """Top-label MCE: the largest |acc_b - conf_b| over non-empty equal-width bins."""
    return _width_errors(scores, labels, kind, bins, edges).mce


def rms_calibration_error(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    bins: int = 15,
    edges: str = "left",
    debiased: bool = False,
) -> float:
    """Top-label RMS calibration error; ``debiased`` applies Kumar et al.'s correction."""
    errors = _width_errors(scores, labels, kind, bins, edges)
    return errors.rms_ce_debiased if debiased else errors.rms_ce


def adaptive_calibration_error(
    scores: Any, labels: Any, kind: str = "logits", bins: int = 15
) -> float:
    """AdaECE: the ECE formula over equal-mass bins whose cuts never split a tie group
    (confidences equal up to float64 rounding, :mod:`curvcal.calibration.ties`)."""
    logp, y = _prepare(scores, labels, kind, bins, "left")
    count, sum_conf, sum_correct, _, _ = _equal_mass(_top(logp, y, kind), bins)
    return binned_errors(count, sum_conf, sum_correct).ece


def classwise_calibration_error(
    scores: Any, labels: Any, kind: str = "logits", bins: int = 15, edges: str = "left"
) -> float:
    """Classwise ECE: mean over all K classes of the equal-width ECE of p_k against 1[y = k]."""
    logp, y = _prepare(scores, labels, kind, bins, edges)
    sum_p, sum_y = _classwise_sums(logp, y, bins, edges, kind)
    return float(((sum_y - sum_p).abs().sum(dim=1) / logp.shape[0]).mean())


def positive_class_calibration_error(
    scores: Any, labels: Any, kind: str = "logits", bins: int = 15, edges: str = "left"
) -> float:
    """ECE of p_1 against 1[y = 1] with equal-width bins; binary problems (K = 2) only."""
    logp, y = _prepare(scores, labels, kind, bins, edges)
    if logp.shape[1] != 2:
        raise InputError(
            "scores", f"the positive-class ECE needs K = 2 classes, got {logp.shape[1]}"
        )
    sum_p, sum_y = _classwise_sums(logp, y, bins, edges, kind)
    return float((sum_y[1] - sum_p[1]).abs().sum()) / logp.shape[0]


def negative_log_likelihood(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Mean -log p_y in nats (infinite when some p_y is exactly 0)."""
    return float(_top_of(scores, labels, kind).nll.mean())


def brier_score(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Mean over samples of Σ_k (p_k - 1[y = k])² (sum over classes)."""
    return float(_top_of(scores, labels, kind).brier.mean())


def ks_calibration_error(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Top-label KS calibration error (Gupta et al. 2021), binning-free."""
    top = _top_of(scores, labels, kind)
    return binfree.ks_calibration_error(top.confidence, top.correct)


def kuiper_statistic(scores: Any, labels: Any, kind: str = "logits") -> float:
    """Top-label Kuiper statistic (Gupta et al. 2021), binning-free."""
    top = _top_of(scores, labels, kind)
    return binfree.kuiper_statistic(top.confidence, top.correct)


def maximum_mean_calibration_error(scores: Any, labels: Any, kind: str = "logits") -> float:
    """MMCE (Kumar et al. 2018), root form, Laplacian kernel of width 0.4 on confidences."""
    top = _top_of(scores, labels, kind)
    return binfree.mmce(top.confidence, top.correct)


def risk_coverage(scores: Any, labels: Any, kind: str = "logits") -> RiskCoverage:
    """The risk–coverage curve of the top-label predictions ranked by confidence (its
    ``aurc`` is the area)."""
    top = _top_of(scores, labels, kind)
    return risk_coverage_curve(top.confidence, top.correct)


def aurc(scores: Any, labels: Any, kind: str = "logits") -> float:
    """AURC (Geifman et al. 2019): the mean selective risk over coverages k/N, k = 1..N."""
    return float(risk_coverage(scores, labels, kind).aurc)


def excess_aurc(scores: Any, labels: Any, kind: str = "logits") -> float:
    """E-AURC: AURC minus the AURC of an oracle ranking every correct prediction first."""
    top = _top_of(scores, labels, kind)
    return risk_coverage_curve(top.confidence, top.correct).aurc - optimal_aurc(top.correct)


def reliability_bins(
    scores: Any,
    labels: Any,
    kind: str = "logits",
    bins: int = 15,
    edges: str = "left",
    binning_scheme: str = "equal-width",
) -> tuple[ReliabilityBin, ...]:
    """The reliability table behind ECE (``"equal-width"``) or AdaECE (``"equal-mass"``)."""
    logp, y = _prepare(scores, labels, kind, bins, edges)
    top = _top(logp, y, kind)
    if binning_scheme == "equal-width":
        _, count, sum_conf, sum_correct = _equal_width(top, bins, edges)
        bin_edges = binning.equal_width_edges(bins)
        return reliability_table(count, sum_conf, sum_correct, bin_edges[:-1], bin_edges[1:])
    if binning_scheme == "equal-mass":
        count, sum_conf, sum_correct, lower, upper = _equal_mass(top, bins)
        return reliability_table(count, sum_conf, sum_correct, lower, upper, drop_empty=True)
    raise InputError("binning", f"unknown binning {binning_scheme!r}", "equal-width or equal-mass")
