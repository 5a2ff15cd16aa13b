"""Classifiers whose population calibration errors are known: the ground truth of coverage.

A model with K classes draws one sample as follows. The top-label confidence is
c = 1/K + (1 - 1/K)·t with t ~ Beta(α, β); the predicted class j is uniform over the K
classes; p_j = c and every other class gets (1 - c)/(K - 1). The prediction is correct with
probability a(c), the accuracy curve; when it is not, the label is uniform over the other
K - 1 classes. Accuracy curves (u = (c - 1/K)/(1 - 1/K) in [0, 1]):

* ``linear``: a(c) = 1/K + s·(c - 1/K) (s < 1 over-confident, s = 1 calibrated);
* ``power``: a(c) = 1/K + (1 - 1/K)·u^γ (γ < 1 under-confident: a(c) > c).

Population values, by adaptive quadrature over t (scipy's ``quad``, split at every bin edge):

* binned ECE with bins B_b: Σ_b |h_b|, h_b = ∫_{c ∈ B_b} (a(c) - c) f(c) dc (f the density
  of c); equal-width bins for ECE, bins cut at the population quantiles of c for AdaECE;
* MCE: max over bins of positive mass of |h_b| / P(c ∈ B_b);
* classwise ECE: by symmetry every class has the same bins, with
  h_kb = (1/K)[∫_{c ∈ B_b} (a - c) f dc + ∫_{(1-c)/(K-1) ∈ B_b} (c - a) f dc];
* NLL: E[-a(c) log c - (1 - a(c)) log((1 - c)/(K - 1))];
* smooth ECE: the fixed point of ∫ |∫ K_σ(t, c)(a(c) - c) f(c) dc| dt, the inner integral
  by the midpoint rule on ``SMOOTH_NODES`` nodes in t deposited on smooth ECE's own grid.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import integrate, stats

from curvcal.calibration.smooth import smooth_ece

SMOOTH_NODES = 1 << 18


@dataclass(frozen=True)
class SimulatedModel:
    """One K-class model: Beta(α, β) confidence shape and an accuracy curve."""

    name: str
    n_classes: int
    alpha: float
    beta: float
    curve: str  # "linear" or "power"
    shape: float  # s of the linear curve, γ of the power curve

    def accuracy(self, c: np.ndarray | float) -> np.ndarray:
        """a(c), the probability that a prediction of confidence c is correct."""
        base = 1.0 / self.n_classes
        c = np.asarray(c, dtype=np.float64)
        if self.curve == "linear":
            return np.clip(base + self.shape * (c - base), 0.0, 1.0)
        u = np.clip((c - base) / (1.0 - base), 0.0, 1.0)
        return base + (1.0 - base) * u**self.shape

    def confidence_of(self, t: np.ndarray | float) -> np.ndarray:
        base = 1.0 / self.n_classes
        return base + (1.0 - base) * np.asarray(t, dtype=np.float64)

    def draw(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """N×K probabilities (float64) and labels of ``n`` samples from a generator seeded by
        ``seed``."""
        rng = np.random.default_rng(seed)
        k = self.n_classes
        c = self.confidence_of(rng.beta(self.alpha, self.beta, n))
        correct = rng.random(n) < self.accuracy(c)
        predicted = rng.integers(0, k, n)
        other = (predicted + 1 + rng.integers(0, k - 1, n)) % k
        labels = np.where(correct, predicted, other)
        probabilities = np.repeat(((1.0 - c) / (k - 1))[:, None], k, axis=1)
        probabilities[np.arange(n), predicted] = c
        return torch.from_numpy(probabilities), torch.from_numpy(labels)

    def recalibrate(self, probabilities: torch.Tensor) -> torch.Tensor:
        """The perfectly recalibrated scores of drawn ``probabilities``: the top class gets
        a(c), every other class (1 - a(c))/(K - 1). Their population ECE, AdaECE and classwise
        ECE are 0 (every bin's gap is a(c) - a(c)), their NLL :meth:`recalibrated_nll`."""
        k = self.n_classes
        c, predicted = probabilities.max(dim=1)
        a = torch.from_numpy(self.accuracy(c.numpy()))
        out = ((1.0 - a) / (k - 1))[:, None].repeat(1, k)
        out[torch.arange(c.shape[0]), predicted] = a
        return out

    # population values -------------------------------------------------------------------

    def _integral(self, g: Callable[[np.ndarray], np.ndarray], low: float, high: float) -> float:
        """∫ g(c) f(c) dc over c in [low, high] (clipped to the support), by quad in t."""
        base = 1.0 / self.n_classes
        t_low = max(0.0, (low - base) / (1.0 - base))
        t_high = min(1.0, (high - base) / (1.0 - base))
        if t_high <= t_low:
            return 0.0
        density = stats.beta(self.alpha, self.beta).pdf

        def integrand(t: float) -> float:
            return float(g(self.confidence_of(t)) * density(t))

        value, _error = integrate.quad(integrand, t_low, t_high, limit=200, epsabs=1e-13)
        return float(value)

    def _gap(self, c: np.ndarray) -> np.ndarray:
        return self.accuracy(c) - c

    def _binned(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.array([self._integral(self._gap, a, b) for a, b in itertools.pairwise(edges)])
        mass = np.array([self._integral(np.ones_like, a, b) for a, b in itertools.pairwise(edges)])
        return h, mass

    def ece(self, n_bins: int = 15) -> float:
        h, _ = self._binned(np.linspace(0.0, 1.0, n_bins + 1))
        return float(np.abs(h).sum())

    def mce(self, n_bins: int = 15) -> float:
        h, mass = self._binned(np.linspace(0.0, 1.0, n_bins + 1))
        used = mass > 1e-12
        return float((np.abs(h[used]) / mass[used]).max())

    def adaece(self, n_bins: int = 15) -> float:
        levels = stats.beta(self.alpha, self.beta).ppf(np.linspace(0.0, 1.0, n_bins + 1))
        h, _ = self._binned(self.confidence_of(levels))
        return float(np.abs(h).sum())

    def classwise_ece(self, n_bins: int = 15) -> float:
        k = self.n_classes
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        total = 0.0
        for a, b in itertools.pairwise(edges):
            top = self._integral(self._gap, a, b)
            # (1 - c)/(K - 1) in (a, b]  <=>  c in [1 - (K - 1) b, 1 - (K - 1) a)
            rest = -self._integral(self._gap, 1.0 - (k - 1) * b, 1.0 - (k - 1) * a)
            total += abs(top + rest) / k
        return total

    def nll(self) -> float:
        k = self.n_classes

        def loss(c: np.ndarray) -> np.ndarray:
            a = self.accuracy(c)
            wrong = np.log(np.maximum((1.0 - c) / (k - 1), 1e-300))
            return -a * np.log(c) - (1.0 - a) * wrong

        return self._integral(loss, 0.0, 1.0)

    def recalibrated_nll(self) -> float:
        """The NLL of :meth:`recalibrate`'s scores: E[-a log a - (1 - a) log((1 - a)/(K - 1))]."""
        k = self.n_classes

        def loss(c: np.ndarray) -> np.ndarray:
            a = self.accuracy(c)
            wrong = np.log(np.maximum((1.0 - a) / (k - 1), 1e-300))
            return -a * np.log(np.maximum(a, 1e-300)) - (1.0 - a) * wrong

        return self._integral(loss, 0.0, 1.0)

    def smooth_ece(self) -> float:
        t = (np.arange(SMOOTH_NODES) + 0.5) / SMOOTH_NODES
        c = self.confidence_of(t)
        weight = stats.beta(self.alpha, self.beta).pdf(t) / SMOOTH_NODES
        weight /= weight.sum()
        # smooth_ece deposits (correct - confidence)/n: pass n·weight·gap as the residual.
        residual = SMOOTH_NODES * weight * self._gap(c)
        confidence = torch.from_numpy(c)
        return smooth_ece(confidence, confidence + torch.from_numpy(residual)).value

    def population(self, n_bins: int = 15) -> dict[str, float]:
        """Every population value, by metric name (as in ``CalibrationMetrics``)."""
        return {
            "ece": self.ece(n_bins),
            "adaece": self.adaece(n_bins),
            "mce": self.mce(n_bins),
            "classwise_ece": self.classwise_ece(n_bins),
            "smooth_ece": self.smooth_ece(),
            "nll": self.nll(),
        }


def models(n_classes: int) -> tuple[SimulatedModel, ...]:
    """The four models of the coverage table at K = ``n_classes``."""
    return (
        SimulatedModel("over-confident", n_classes, 5.0, 1.5, "linear", 0.8),
        SimulatedModel("under-confident", n_classes, 2.0, 2.0, "power", 0.7),
        SimulatedModel("slightly miscalibrated", n_classes, 5.0, 1.5, "linear", 0.96),
        SimulatedModel("calibrated", n_classes, 5.0, 1.5, "linear", 1.0),
    )


def binomial_se(p: float, n: int) -> float:
    """The standard error sqrt(p(1 - p)/n) of a proportion over n trials."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n else math.nan
