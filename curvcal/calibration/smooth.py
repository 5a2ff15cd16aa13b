"""Smooth ECE (Błasiok & Nakkiran 2023): kernel-smoothed residuals with a self-chosen bandwidth.

For predictions f_i in [0, 1] and outcomes y_i in {0, 1}, with residuals r_i = y_i - f_i,

    smECE_σ = ∫_0^1 | (1/N) Σ_i K_σ(t, f_i) r_i | dt,

where K_σ is the Gaussian density of width σ reflected at 0 and 1,
K_σ(t, f) = Σ_{k∈Z} φ_σ(t - f + 2k) + φ_σ(t + f - 2k), so ∫_0^1 K_σ(t, f) dt = 1 for every f
(equivalently ∫ |r̂_σ(t)| δ̂_σ(t) dt with the smoothed residual r̂ and density δ̂ of the paper).
smECE_σ decreases in σ; the reported smooth ECE is the fixed point σ* with smECE_σ* = σ*.

Numerics: residuals are deposited on a uniform grid of ``GRID_INTERVALS`` + 1 points by linear
interpolation, the reflected kernel becomes a circular convolution (period 2) done by FFT, and
the integral is the trapezoid rule. The discrete kernel is normalised to integrate to 1, so
when every residual has the same sign smECE_σ = |mean residual| exactly, for every σ.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.optimize import brentq

from curvcal.calibration.results import SmoothECE, SmoothReliability

KERNEL = "gaussian, reflected at 0 and 1"
GRID_INTERVALS = 8192


def _deposit(confidence: torch.Tensor, residual: torch.Tensor, intervals: int) -> np.ndarray:
    """Mean residual mass on grid points u_l = l/intervals, by linear interpolation."""
    position = confidence.to(torch.float64).clamp(0.0, 1.0) * intervals
    left = torch.floor(position).clamp_(max=intervals - 1)
    frac = position - left
    left_index = left.to(torch.int64)
    mass = residual.to(torch.float64) / residual.shape[0]
    grid = torch.bincount(left_index, weights=mass * (1 - frac), minlength=intervals + 1)
    grid += torch.bincount(left_index + 1, weights=mass * frac, minlength=intervals + 1)
    return grid.numpy()


@functools.lru_cache(maxsize=16)
def _kernel_spectrum(sigma: float, intervals: int) -> np.ndarray:
    """The FFT of the reflected kernel K_σ on the period-2 grid (normalised: Σ kernel·Δ = 1
    over one period); cached, as a bootstrap smooths every resample at the same σ."""
    period = 2 * intervals
    offsets = np.minimum(np.arange(period), period - np.arange(period)) / intervals
    images = math.ceil(8 * sigma / 2) + 1
    distance = offsets[:, None] + 2.0 * np.arange(-images, images + 1)[None, :]
    kernel = np.exp(-0.5 * (distance / sigma) ** 2).sum(axis=1)
    kernel *= intervals / kernel.sum()
    spectrum = np.fft.rfft(kernel)
    spectrum.flags.writeable = False
    return spectrum


class _SmoothedResidual:
    """smECE_σ for one data set, for any σ (one FFT per σ)."""

    def __init__(self, confidence: torch.Tensor, residual: torch.Tensor, intervals: int) -> None:
        self.intervals = intervals
        grid = _deposit(confidence, residual, intervals)
        # Even, period-2 extension: the image of u_l is -u_l ≡ 2 - u_l; u = 0 and u = 1 are
        # their own images, so their mass counts twice (both terms of the reflected kernel).
        period = 2 * intervals
        extended = np.zeros(period)
        extended[: intervals + 1] = grid
        extended[period - intervals + 1 :] += grid[1:intervals][::-1]
        extended[0] += grid[0]
        extended[intervals] += grid[intervals]
        self.spectrum = np.fft.rfft(extended)

    def smoothed(self, sigma: float) -> np.ndarray:
        """(1/N) Σ_i K_σ(u, f_i) r_i at the grid points u over one period (2·intervals)."""
        kernel = _kernel_spectrum(sigma, self.intervals)
        return np.fft.irfft(self.spectrum * kernel, n=2 * self.intervals)

    def value(self, sigma: float) -> float:
        # Trapezoid over [0, 1] of an even, period-2 function = half the sum over a period.
        return float(np.abs(self.smoothed(sigma)).sum() / (2 * self.intervals))


def smooth_ece_at(
    confidence: torch.Tensor,
    correct: torch.Tensor,
    bandwidth: float,
    intervals: int = GRID_INTERVALS,
) -> float:
    """smECE_σ at a fixed bandwidth σ > 0 (see the module docstring)."""
    residual = correct.to(torch.float64) - confidence.to(torch.float64)
    return _SmoothedResidual(confidence, residual, intervals).value(bandwidth)


def smooth_ece_deviation(
    confidence: torch.Tensor,
    residual_changes: torch.Tensor,
    bandwidths: tuple[float, ...],
    intervals: int = GRID_INTERVALS,
) -> np.ndarray:
    """∫_0^1 |(1/N) Σ_i K_σ(t, f_i) d_i| dt for each row d of the R×N ``residual_changes``
    and each σ of ``bandwidths`` (a len(bandwidths)×R array). With a resample's changes
    d_i = (w_i - 1) r_i this is ∫ |ŝ*_σ - ŝ_σ| dt, as smoothing is linear: the deviation
    :mod:`curvcal.calibration.intervals` bounds. Same grid, reflection and rule as smECE_σ."""
    n = confidence.shape[0]
    position = confidence.to(torch.float64).clamp(0.0, 1.0) * intervals
    left = torch.floor(position).clamp_(max=intervals - 1)
    frac = position - left
    left_index = left.to(torch.int64)
    mass = residual_changes.to(torch.float64) / n
    grid = torch.zeros(mass.shape[0], intervals + 1, dtype=torch.float64)
    grid.index_add_(1, left_index, mass * (1 - frac))
    grid.index_add_(1, left_index + 1, mass * frac)
    rows = grid.numpy()
    period = 2 * intervals
    extended = np.zeros((rows.shape[0], period))
    extended[:, : intervals + 1] = rows
    extended[:, period - intervals + 1 :] += rows[:, 1:intervals][:, ::-1]
    extended[:, 0] += rows[:, 0]
    extended[:, intervals] += rows[:, intervals]
    spectrum = np.fft.rfft(extended, axis=1)
    out = np.empty((len(bandwidths), rows.shape[0]))
    for j, sigma in enumerate(bandwidths):
        smoothed = np.fft.irfft(spectrum * _kernel_spectrum(sigma, intervals), n=period, axis=1)
        out[j] = np.abs(smoothed).sum(axis=1) / period
    return out


def smooth_ece(
    confidence: torch.Tensor, correct: torch.Tensor, intervals: int = GRID_INTERVALS
) -> SmoothECE:
    """Smooth ECE at the fixed-point bandwidth σ* = smECE_σ* (bracketed root, tolerance 1e-9).

    When smECE_σ < σ already at σ = one grid step (residuals cancel almost exactly) the
    value at that σ is returned with that bandwidth.
    """
    residual = correct.to(torch.float64) - confidence.to(torch.float64)
    smoothed = _SmoothedResidual(confidence, residual, intervals)
    low = 1.0 / intervals
    gap_low = smoothed.value(low) - low
    if gap_low <= 0:
        return SmoothECE(value=smoothed.value(low), bandwidth=low, kernel=KERNEL)
    # smECE_σ <= mean |r| <= 1, so the fixed point lies below 1.
    sigma = float(brentq(lambda s: smoothed.value(s) - s, low, 1.0, xtol=1e-12, rtol=1e-10))
    return SmoothECE(value=smoothed.value(sigma), bandwidth=sigma, kernel=KERNEL)


def smooth_reliability(
    confidence: torch.Tensor,
    correct: torch.Tensor,
    bandwidth: float | None = None,
    points: int = 257,
    intervals: int = GRID_INTERVALS,
) -> SmoothReliability:
    """The smooth reliability curve of Błasiok & Nakkiran 2023 (relplot's diagram), with the
    same reflected Gaussian kernel K_σ and grid as :func:`smooth_ece`.

    At t in [0, 1]: density δ̂(t) = (1/N) Σ_i K_σ(t, f_i), smoothed residual
    r̂(t) = Σ_i K_σ(t, f_i)(y_i − f_i) / Σ_i K_σ(t, f_i), and the curve is t + r̂(t) (the
    accuracy the kernel sees at confidence t), so smECE_σ = ∫_0^1 |r̂(t)| δ̂(t) dt. σ defaults to
    smooth ECE's fixed point σ*. Returned at ``points`` evenly spaced t (``points`` − 1 must
    divide ``intervals``), less those where δ̂ < 1e-9 of its maximum (no sample near).
    """
    if points < 2 or intervals % (points - 1):
        raise ValueError(f"points - 1 must divide {intervals}, got points = {points}")
    if bandwidth is None:
        bandwidth = smooth_ece(confidence, correct, intervals).bandwidth
    residual = correct.to(torch.float64) - confidence.to(torch.float64)
    mass = _SmoothedResidual(confidence, residual, intervals).smoothed(bandwidth)
    ones = torch.ones_like(residual)
    density = _SmoothedResidual(confidence, ones, intervals).smoothed(bandwidth)
    step = intervals // (points - 1)
    mass, density = mass[: intervals + 1 : step], density[: intervals + 1 : step]
    grid = np.linspace(0.0, 1.0, points)
    # Where no sample is near, r̂ is a ratio of rounding errors: those points are left out
    # (never NaN, which JSON cannot carry).
    kept = density > 1e-9 * density.max()
    curve = grid[kept] + mass[kept] / density[kept]
    return SmoothReliability(
        confidence=tuple(float(t) for t in grid[kept]),
        accuracy=tuple(float(a) for a in curve),
        density=tuple(float(d) for d in density[kept]),
        bandwidth=float(bandwidth),
        kernel=KERNEL,
    )
