"""Intervals of calibration errors that hold the population value: error-norm bounds.

Every binned calibration error of :mod:`curvcal.calibration.metrics` is a norm of a mean.
For bins B_1..B_M fixed before the data are seen, write the per-bin mean residual

    h_b = E[(1[correct] - c) · 1{c ∈ B_b}]        (population, one sample's law)
    ĥ_b = (1/N) Σ_i (1[correct_i] - c_i) · 1{c_i ∈ B_b}   (its sample mean).

Then the population binned ECE is ECE = Σ_b |h_b| = Σ_b P(B_b) · |acc_b - conf_b| and the
plug-in ECE is Σ_b |ĥ_b| exactly (n_b/N · |acc_b - conf_b|). By the triangle inequality

    |ECE_plug-in - ECE| ≤ D = Σ_b |ĥ_b - h_b| = ‖ĥ - h‖₁,

and D is the L1 norm of a centred mean whose law does not depend on where the population's
gaps sit (large, small or 0). With q the 95% quantile of D, [max(0, ECE_plug-in - q),
ECE_plug-in + q] holds the population ECE whenever D ≤ q: with probability ≥ 95% for every
population, a perfectly calibrated one included (the lower end is then 0 and the interval is
an upper bound). q is estimated by the bootstrap of D* = ‖ĥ* - ĥ‖₁ (resample means against the
data's), which is consistent because √N(ĥ - h) is asymptotically Gaussian.

The interval is centred on the printed plug-in estimate, so the estimate always lies inside
it. It is conservative (its coverage is above 95% when the gaps are far from 0): the price of
holding for every population, where the percentile bootstrap of the plug-in estimate, which
carries the estimator's upward bias twice, covered a small ECE in 4 of 10 data sets.

The same bound serves each measure:

* ECE and AdaECE: D over the equal-width bins and over the data's equal-mass cuts (the
  AdaECE target is the population binned ECE with bins at the population's confidence
  quantiles; the cuts' own noise is not in D, its effect is measured by
  ``benchmarks/bench_coverage.py``).
* Classwise ECE: (1/K) Σ_k Σ_b |ĥ_kb - h_kb| over the K×M per-(class, bin) means.
* MCE = max_b |g_b| with the per-bin gaps g_b = h_b / P(B_b). A maximum is led by the
  noisiest bin, and a bootstrap cannot see the noise of a bin holding one or two samples (its
  resamples repeat them), so the MCE's interval is not a bootstrap one: Hoeffding's bound on
  each non-empty bin's gap, a union bound over the bins, and the maximum of the ends. It holds
  the maximum over the bins the data hold with probability ≥ 95% at every N (a bin the data
  leave empty says nothing of its gap); it is wide where bins are thin.
* Smooth ECE at a bandwidth σ is ∫ |s_σ(t)| dt with s_σ the kernel-smoothed mean residual:
  D_σ = ∫ |ŝ_σ - s_σ| dt. Smoothing with a normalised kernel is an L1 contraction, so D_σ
  bounds the deviation at every larger σ, and the fixed point σ* (smooth ECE = σ*) of a
  function of slope ≤ -1 moves by at most that: the interval is σ̂ ± q_σ at the largest
  σ of a small ladder below σ̂ that lies below the interval's lower end.
* NLL is a mean: Student's t interval x̄ ± t s/√N (the bootstrap's percentile interval
  when some -log p_y is infinite).
"""

from __future__ import annotations

import math

import torch
from scipy.special import stdtrit

from curvcal.calibration import bins as binning
from curvcal.calibration.smooth import smooth_ece_deviation

INTERVAL_LEVEL = 0.95
#: Bandwidths, as fractions of the data's σ̂, at which the smooth ECE's deviation is drawn.
SMOOTH_LADDER = (0.75, 0.5, 0.25, 0.1)
#: The classwise bootstrap holds the N×K residuals and bin indices: above this many entries
#: it is not run (the classwise ECE is then printed without an interval).
CLASSWISE_ELEMENTS = 1 << 24
#: Rows per bin (per class-bin cell for the classwise ECE) below which a binned error gets no
#: interval: a bootstrap cannot see the noise of a cell that holds one row or none (it resamples
#: the row it has), and at K = 100, N = 200 (0.13 rows a class-bin cell) the classwise interval
#: held a population value of 0.0006 in 0 of 25 data sets.
ROWS_PER_CELL = 5
#: The least number of calibrated null draws of the top-label bounds (see
#: :func:`null_draw_count`), and the most outcomes drawn to reach it.
NULL_DRAWS = 1000
NULL_ELEMENTS = 1 << 24


def enough_rows(n: int, cells: int) -> bool:
    """Whether ``n`` rows give :data:`ROWS_PER_CELL` rows a cell on average over ``cells``."""
    return n >= ROWS_PER_CELL * cells


def upper_quantile(draws: torch.Tensor) -> float:
    """The :data:`INTERVAL_LEVEL` quantile of 1-D float64 deviation draws (linear)."""
    return float(torch.quantile(draws, INTERVAL_LEVEL))


def norm_interval(estimate: float, deviation: float) -> tuple[float, float]:
    """[max(0, estimate - deviation), min(1, estimate + deviation)]: the interval of a norm
    whose estimate is within ``deviation`` of the population's (the triangle inequality),
    clipped to [0, 1], where every calibration error of probabilities lies (a gap
    |acc_b - conf_b| is at most 1 and the bin weights sum to 1)."""
    return max(0.0, estimate - deviation), min(1.0, estimate + deviation)


def mean_interval(values: torch.Tensor, floor: float = -math.inf) -> tuple[float, float] | None:
    """Student's t interval of a mean, x̄ ± t_{0.975, N-1} s/√N, its lower end raised to
    ``floor`` (the least the mean can be: 0 for an NLL); ``None`` when a value is not finite or
    N < 2 (the caller falls back to the bootstrap's percentile interval)."""
    n = values.shape[0]
    if n < 2 or not bool(torch.isfinite(values).all()):
        return None
    mean = float(values.mean())
    # the t quantile as scipy.stats.t.ppf computes it, without importing scipy.stats (0.5–0.8 s
    # of every run's start)
    t = float(stdtrit(n - 1, 0.5 + INTERVAL_LEVEL / 2))
    half = t * float(values.std()) / math.sqrt(n)
    return max(floor, mean - half), mean + half


def contains(interval: tuple[float, float], estimate: float) -> tuple[float, float]:
    """``interval`` extended to its estimate when a percentile interval misses it."""
    low, high = interval
    return min(low, estimate), max(high, estimate)


def mce_interval(count: torch.Tensor, gap: torch.Tensor, estimate: float) -> tuple[float, float]:
    """The MCE's interval from per-bin counts n_b and gaps ĝ_b (see the module docstring):
    each |g_b| lies within r_b = sqrt(2 ln(2B/α)/n_b) of |ĝ_b| with probability ≥ 1 - α/B
    (Hoeffding, given the bin's count), so all B non-empty bins at once with ≥ 1 - α, and
    max_b |g_b| in [max_b (|ĝ_b| - r_b), max_b (|ĝ_b| + r_b)], clipped to [0, 1]."""
    used = count > 0
    if not bool(used.any()):
        return 0.0, 0.0
    n_b, size = count[used], gap[used].abs()
    alpha = 1.0 - INTERVAL_LEVEL
    radius = torch.sqrt(2.0 * math.log(2.0 * n_b.numel() / alpha) / n_b)
    low = max(0.0, float((size - radius).max()))
    high = min(1.0, float((size + radius).max()))
    return min(low, estimate), max(high, estimate)


def null_draw_count(n_resamples: int, n: int) -> int:
    """How many calibrated null draws of N outcomes the top-label bounds take: the resamples'
    count, raised to :data:`NULL_DRAWS` while that stays within :data:`NULL_ELEMENTS` outcomes
    (a 95 % quantile of 100 draws is itself noisy: AdaECE's bound held a calibrated model's 0
    in 92 of 100 data sets at K = 2, N = 200 with 100 null draws, 95.5 of 100 with 400)."""
    return max(n_resamples, min(NULL_DRAWS, NULL_ELEMENTS // max(n, 1)))


def null_seed(seed: int) -> int:
    """The seed of the null draws' private generator: apart from the resamples' ``seed``
    (checked first: :func:`~curvcal.seeds.checked_seed`)."""
    from curvcal.seeds import checked_seed

    seed = checked_seed(seed)
    return (seed * 2_654_435_761 + 97) % (1 << 63)


def calibrated_outcomes(
    probability: torch.Tensor, n_draws: int, generator: torch.Generator
) -> torch.Tensor:
    """``n_draws``×N outcomes 1[u < p_i] (float64): each row's outcome drawn as a calibrated
    model of that probability would draw it (the null draws of :class:`BinnedDeviation`)."""
    u = torch.rand(n_draws, probability.shape[0], generator=generator, dtype=torch.float64)
    return (u < probability).to(torch.float64)


def calibrated_labels(
    probabilities: torch.Tensor, n_draws: int, generator: torch.Generator
) -> torch.Tensor:
    """``n_draws``×N labels, row i's drawn from its own probabilities p_i (a calibrated model's
    labels; the classwise null draws of :class:`ClasswiseDeviation`)."""
    p = probabilities.to(torch.float64).clamp(min=0.0)
    return torch.multinomial(p, n_draws, replacement=True, generator=generator).T


class BinnedDeviation:
    """Draws of D* = ‖ĥ* - ĥ‖₁ for bins fixed by ``index`` (and the MCE's interval), and the
    calibrated null's draws ‖ĥ⁰‖₁ with ĥ⁰_b = (1/N) Σ_{i ∈ b} (y⁰_i - c_i), y⁰_i ~ Bernoulli(c_i).

    The 95 % quantile q of D is the larger of the two draws' quantiles. The resample draws are
    consistent for every population, but a bin whose rows are all right (a thin high-confidence
    equal-mass bin of a calibrated model: 13 rows at c ≈ 0.97 hold no error in 2 data sets of 3)
    resamples to a residual spread near 0, and AdaECE's bound held a calibrated model's 0 in 81
    of 100 data sets (K = 2, N = 200). Given the confidences, the calibrated model's D has
    exactly the law of the null draws, whatever the data showed; where the population is far
    from calibrated, the resample draws lead.
    """

    def __init__(
        self,
        index: torch.Tensor,
        residual: torch.Tensor,
        n_bins: int,
        confidence: torch.Tensor | None = None,
    ) -> None:
        self.index, self.residual, self.n_bins = index, residual, n_bins
        self.confidence = confidence
        self.n = residual.shape[0]
        self.count = torch.bincount(index, minlength=n_bins).to(torch.float64)
        self.mean = torch.bincount(index, weights=residual, minlength=n_bins) / self.n
        self.gap = self.mean * self.n / self.count.clamp(min=1)
        self.l1: list[torch.Tensor] = []
        self.null: list[torch.Tensor] = []

    def draw(self, weights: torch.Tensor) -> None:
        """Record the deviations of R resamples (``weights``: R×N multiplicities of the rows)."""
        sums = torch.zeros(weights.shape[0], self.n_bins, dtype=torch.float64)
        sums.index_add_(1, self.index, weights * self.residual)
        self.l1.append((sums / self.n - self.mean).abs().sum(dim=1))

    def draw_null(self, outcomes: torch.Tensor) -> None:
        """Record ‖ĥ⁰‖₁ of R calibrated outcome draws (``outcomes``: R×N, 1 for right)."""
        if self.confidence is None:
            raise ValueError("the null draws need the confidences")
        sums = torch.zeros(outcomes.shape[0], self.n_bins, dtype=torch.float64)
        sums.index_add_(1, self.index, outcomes)
        confidence = torch.bincount(self.index, weights=self.confidence, minlength=self.n_bins)
        self.null.append(((sums - confidence) / self.n).abs().sum(dim=1))

    def quantile(self) -> float:
        """q: the larger of the resample draws' and the null draws' 95 % quantiles."""
        q = upper_quantile(_tensor(self.l1))
        return max(q, upper_quantile(_tensor(self.null))) if self.null else q

    def ece_interval(self, estimate: float) -> tuple[float, float]:
        return norm_interval(estimate, self.quantile())

    def mce_interval(self, estimate: float) -> tuple[float, float]:
        """[max_b (|ĝ_b| - r_b), max_b (|ĝ_b| + r_b)] ∩ [0, 1] over the non-empty bins, with
        Hoeffding's radius r_b = sqrt(2 ln(2B/α) / n_b) for a mean of n_b values of
        1[correct] - c in [-1, 1] and a union bound over the B non-empty bins (α = 5%)."""
        return mce_interval(self.count, self.gap, estimate)


class ClasswiseDeviation:
    """Draws of (1/K) Σ_k ‖ĥ*_k - ĥ_k‖₁ over the K×M classwise bins (dense N×K residuals), and
    the calibrated null's (1/K) Σ_k ‖ĥ⁰_k‖₁ with labels drawn from each row's probabilities
    (as in :class:`BinnedDeviation`: the bins of p_k near 0 rarely hold a y = k, which the
    resamples cannot see; the bound held a calibrated model's 0 in 91 of 100 data sets at
    K = 2, N = 500 without the null draws)."""

    def __init__(
        self, probabilities: torch.Tensor, labels: torch.Tensor, n_bins: int, edges: str
    ) -> None:
        n, k = probabilities.shape
        self.n, self.k, self.size = n, k, k * n_bins
        self.flat = binning.equal_width_index(probabilities.reshape(-1), n_bins, edges)
        self.flat += (torch.arange(k) * n_bins).repeat(n)
        residual = -probabilities.to(torch.float64)
        residual[torch.arange(n), labels] += 1.0
        self.residual = residual
        self.mean = torch.bincount(self.flat, weights=residual.reshape(-1), minlength=self.size)
        self.mean /= n
        self.probabilities = probabilities.to(torch.float64)
        self.draws: list[torch.Tensor] = []
        self.null: list[torch.Tensor] = []

    def draw(self, weights: torch.Tensor) -> None:
        for row in weights:
            weighted = (self.residual * row[:, None]).reshape(-1)
            sums = torch.bincount(self.flat, weights=weighted, minlength=self.size) / self.n
            self.draws.append((sums - self.mean).abs().sum().reshape(1) / self.k)

    def draw_null(self, labels: torch.Tensor) -> None:
        """Record (1/K) Σ_k ‖ĥ⁰_k‖₁ of R calibrated label draws (``labels``: R×N)."""
        rows = torch.arange(self.n)
        for drawn in labels:
            residual = -self.probabilities
            residual[rows, drawn] += 1.0
            sums = torch.bincount(self.flat, weights=residual.reshape(-1), minlength=self.size)
            self.null.append((sums / self.n).abs().sum().reshape(1) / self.k)

    def interval(self, estimate: float) -> tuple[float, float]:
        q = upper_quantile(_tensor(self.draws))
        if self.null:
            q = max(q, upper_quantile(_tensor(self.null)))
        return norm_interval(estimate, q)


class SmoothDeviation:
    """Draws of ∫ |ŝ*_σ - ŝ_σ| dt at the bandwidths σ̂ · :data:`SMOOTH_LADDER`."""

    def __init__(self, confidence: torch.Tensor, residual: torch.Tensor, bandwidth: float):
        self.confidence, self.residual = confidence, residual
        self.sigmas = tuple(bandwidth * f for f in SMOOTH_LADDER)
        self.draws: list[torch.Tensor] = []

    def draw(self, weights: torch.Tensor) -> None:
        deviations = smooth_ece_deviation(
            self.confidence, (weights - 1.0) * self.residual, self.sigmas
        )
        self.draws.append(torch.from_numpy(deviations))

    def interval(self, estimate: float) -> tuple[float, float]:
        """σ̂ ± q_σ at the largest ladder σ with σ ≤ σ̂ - q_σ (else the smallest σ's q)."""
        draws = torch.cat(self.draws, dim=1)
        quantiles = [upper_quantile(_tensor([row])) for row in draws]
        for sigma, q in zip(self.sigmas, quantiles, strict=True):
            if sigma <= estimate - q:
                return norm_interval(estimate, q)
        return norm_interval(estimate, quantiles[-1])


def _tensor(values: list[torch.Tensor]) -> torch.Tensor:
    out = torch.cat(values) if values else torch.empty(0, dtype=torch.float64)
    if not out.numel() or not bool(torch.isfinite(out).all()):
        return torch.tensor([math.inf], dtype=torch.float64)
    return out
