"""Frozen result objects of the calibration kernels (metrics, reliability bins, fits)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from curvcal.calibration.saved import TEMPERATURE_RANGE, Field, SavedMap, choice, number
from curvcal.errors import InputError
from curvcal.settings.calibration import MAX_GAMMA

#: Calibration map names a :class:`Calibrator` can carry.
CALIBRATOR_METHODS = ("none", "temperature", "focal-temperature")

MapT = TypeVar("MapT")


@dataclass(frozen=True, kw_only=True)
class MapFit(Generic[MapT]):
    """What every calibration map's fit records: ``nll_before``/``nll_after``, the mean NLL
    −log q_y on the fit split under the identity map and under the fitted one (in-sample),
    ``n_samples`` N of the fit split, and the fitted map ``calibrator``. A map's fit record
    derives from this and adds its own fields (given first when it is built by position)."""

    nll_before: float
    nll_after: float
    n_samples: int
    calibrator: MapT

    def to_dict(self) -> dict[str, Any]:
        """The fit's record: the map's own fields, then ``nll_before``, ``nll_after`` and
        ``n_samples``; not the ``calibrator`` (it is saved on its own)."""
        shared = [item.name for item in fields(MapFit)]
        own = [item.name for item in fields(self) if item.name not in shared]
        return {key: getattr(self, key) for key in (*own, *shared) if key != "calibrator"}


@dataclass(frozen=True)
class ReliabilityBin:
    """One bin of a reliability table: the numbers the binned metrics are built from.

    ``lower``/``upper`` are the bin edges for equal-width bins and the smallest/largest
    confidence inside the bin for equal-mass bins. ``confidence`` and ``accuracy`` are the
    means over the bin (``nan`` when ``count`` is 0), ``gap = accuracy - confidence``.
    """

    lower: float
    upper: float
    count: int
    confidence: float
    accuracy: float
    gap: float


@dataclass(frozen=True)
class SmoothECE:
    """Smooth ECE (Błasiok & Nakkiran 2023) with its kernel and bandwidth."""

    value: float
    bandwidth: float
    kernel: str


@dataclass(frozen=True)
class SmoothReliability:
    """The smooth reliability curve (:func:`curvcal.calibration.smooth.smooth_reliability`):
    at each ``confidence`` t the kernel-smoothed ``accuracy`` t + r̂(t) (points no sample
    reaches are left out) and the kernel ``density`` δ̂(t) of the confidences (integrates to 1 over [0, 1]),
    for the Gaussian ``kernel`` of width ``bandwidth``."""

    confidence: tuple[float, ...]
    accuracy: tuple[float, ...]
    density: tuple[float, ...]
    bandwidth: float
    kernel: str


@dataclass(frozen=True)
class ClassReliability:
    """The classwise reliability table of one class k: equal-width bins of p_k, each with
    the number of samples, the mean p_k and the frequency of y = k (the classwise-ECE sums);
    ``n_labels`` samples carry the label k."""

    class_index: int
    n_labels: int
    bins: tuple[ReliabilityBin, ...]


@dataclass(frozen=True)
class CalibrationMetrics:
    """Every calibration metric of one set of scores, computed in one pass in float64.

    Binned metrics use ``n_bins`` bins and the ``edges`` convention (``"left"``: bins
    (a, b], an edge value goes to the lower bin; ``"right"``: [a, b)). ``brier`` is the mean
    over samples of the sum over classes. ``intervals`` maps a metric name to its bootstrap
    percentile interval ``(low, high)`` at ``interval_level`` (empty when ``n_bootstrap`` is 0);
    ``bin_intervals`` the same interval of each ``ece_bins`` bin's accuracy (``None`` for an
    empty bin). ``smooth_curve``: the smooth reliability curve, when asked for.
    ``positive_class_ece`` is the ECE of p_1 against 1[y = 1], only for K = 2.
    ``ks_ce``, ``kuiper`` and ``mmce`` are binning-free (:mod:`curvcal.calibration.binfree`);
    ``aurc``, ``e_aurc`` and ``risk_coverage`` ((coverage, selective risk) at coverages
    0.1, 0.2, ..., 1.0) summarise selective prediction (:mod:`curvcal.calibration.selective`);
    ``calibration_metrics`` fills them all (NaN and () mean "not computed").
    """

    n_samples: int
    n_classes: int
    n_bins: int
    edges: str
    accuracy: float
    mean_confidence: float
    ece: float
    mce: float
    rms_ce: float
    rms_ce_debiased: float
    adaece: float
    adaece_bins_used: int
    classwise_ece: float
    nll: float
    brier: float
    smooth_ece: float
    smooth_ece_bandwidth: float
    smooth_ece_kernel: str
    positive_class_ece: float | None
    ece_bins: tuple[ReliabilityBin, ...]
    adaece_bins: tuple[ReliabilityBin, ...]
    n_bootstrap: int = 0
    interval_level: float = 0.95
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    bin_intervals: tuple[tuple[float, float] | None, ...] = ()
    smooth_curve: SmoothReliability | None = None
    class_bins: tuple[ClassReliability, ...] = ()
    ks_ce: float = math.nan
    kuiper: float = math.nan
    mmce: float = math.nan
    aurc: float = math.nan
    e_aurc: float = math.nan
    risk_coverage: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Calibrator(SavedMap):
    """A fitted calibration map that can be saved as JSON and re-applied.

    ``method`` is ``"none"`` (identity), ``"temperature"`` (softmax(z / T)) or
    ``"focal-temperature"`` (φ_γ(softmax(z / T))); ``gamma`` is 0 unless focal.
    """

    method: str
    temperature: float = 1.0
    gamma: float = 0.0

    def __post_init__(self) -> None:
        _check_calibrator(self.method, self.temperature, self.gamma, "calibrator")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: ``{"method", "temperature", "gamma"}``."""
        return {"method": self.method, "temperature": self.temperature, "gamma": self.gamma}

    def apply(
        self, scores: Any, kind: str = "logits", source: str = "scores", *, device: Any = None
    ) -> Any:
        """float64 log-probabilities of the calibrated ``scores`` (N×K tensor), computed on
        ``device`` (a :class:`torch.device`; default the CPU) and returned there."""
        from curvcal.calibration.maps import calibrated_log_probabilities

        return calibrated_log_probabilities(
            scores,
            kind,
            source,
            self.temperature,
            self.gamma,
            identity=self.method == "none",
            device=device,
        )

    @classmethod
    def saved_fields(cls, data: Mapping[str, Any]) -> tuple[Field, ...]:
        """``method``, ``temperature`` and ``gamma``; a ``temperature`` map needs its
        ``temperature`` (its ``gamma`` may be left out: 0), a ``focal-temperature`` map both.
        A missing parameter is not given its default otherwise: a temperature map without its
        T read as T = 1 would report the uncalibrated scores under the map's name."""
        method = data.get("method")
        return (
            choice("method", CALIBRATOR_METHODS),
            number("temperature", *TEMPERATURE_RANGE, optional=method not in _NEEDS_TEMPERATURE),
            number("gamma", 0.0, MAX_GAMMA, optional=method != "focal-temperature"),
        )

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> Calibrator:
        temperature, gamma = values["temperature"], values["gamma"]
        temperature = 1.0 if temperature is None else temperature
        gamma = 0.0 if gamma is None else gamma
        _check_calibrator(values["method"], temperature, gamma, source)
        return cls(method=values["method"], temperature=temperature, gamma=gamma)


_NEEDS_TEMPERATURE = ("temperature", "focal-temperature")


def _check_calibrator(method: Any, temperature: float, gamma: float, source: str) -> None:
    if method not in CALIBRATOR_METHODS:
        raise InputError(source, f"unknown method {method!r}", f"one of {list(CALIBRATOR_METHODS)}")
    if not (temperature > 0 and temperature < float("inf")):
        raise InputError(source, f"temperature must be finite and > 0, got {temperature!r}")
    if not TEMPERATURE_RANGE[0] <= temperature <= TEMPERATURE_RANGE[1]:
        # z / T of float32 scores overflows (or every score rounds to 0) out of this range,
        # which would be reported against the scores rather than the temperature
        raise InputError(
            source,
            f"temperature {temperature!r} is outside {TEMPERATURE_RANGE[0]:.1e}.."
            f"{TEMPERATURE_RANGE[1]:.1e}, where softmax(z / T) of float32 scores stays finite",
        )
    if not (gamma >= 0 and gamma < float("inf")):
        raise InputError(source, f"gamma must be finite and >= 0, got {gamma!r}")
    if gamma > MAX_GAMMA:
        raise InputError(source, f"gamma {gamma!r} is outside 0..{MAX_GAMMA:g}")
    if method != "focal-temperature" and gamma != 0:
        raise InputError(
            source,
            f"gamma {gamma} given for method {method!r}",
            "only focal-temperature uses gamma",
        )


@dataclass(frozen=True)
class ScalingFit:
    """What both temperature fits record: the ``temperature`` T, the ``objective`` minimised
    and its value before (T = 1) and after on the fit split, and the NLL before and after
    (in-sample)."""

    temperature: float
    objective: str
    objective_before: float
    objective_after: float
    nll_before: float
    nll_after: float


@dataclass(frozen=True)
class TemperatureFit(ScalingFit):
    """Temperature scaling fitted on one split: p = softmax(z / T).

    ``objective`` is ``"nll"`` (bounded Brent on log T plus a Newton polish in 1/T) or
    ``"ece"``/``"adaece"`` (log-spaced grid; ``grid_step`` is its step in ln T).
    ``derivative`` is dNLL/d(ln T) at the returned T. ``at_bracket_end`` is true when T sits
    on an end of ``bracket`` (the optimum may lie outside it).
    """

    derivative: float
    bracket: tuple[float, float]
    at_bracket_end: bool
    grid_step: float | None
    n_evaluations: int
    n_samples: int

    @property
    def calibrator(self) -> Calibrator:
        return Calibrator(method="temperature", temperature=self.temperature)


@dataclass(frozen=True)
class FocalProfilePoint:
    """One γ of the focal-temperature profile: the T fitted at that γ and its objective."""

    gamma: float
    temperature: float
    objective: float
    at_bracket_end: bool
    n_evaluations: int = 0


@dataclass(frozen=True)
class FocalTemperatureFit(ScalingFit):
    """Focal temperature scaling (Komisarenko & Kull 2024): p = φ_γ(softmax(z / T)).

    ``profile`` holds the best T and objective for every γ of the grid (γ is weakly
    identified: read the profile, not only the chosen pair). ``n_evaluations`` counts the
    passes over the N×K scores (one per (γ, T) evaluated, plus the objective before and the
    NLL after), ``n_exact_evaluations`` those made in float64.
    """

    gamma: float
    profile: tuple[FocalProfilePoint, ...]
    bracket: tuple[float, float]
    grid_step: float | None
    n_samples: int
    n_evaluations: int = 0
    n_exact_evaluations: int = 0

    @property
    def calibrator(self) -> Calibrator:
        return Calibrator(
            method="focal-temperature", temperature=self.temperature, gamma=self.gamma
        )
