"""The settings of a calibration run (``curvcal calibrate`` and ``metrics``; ``study`` and
``check`` take a part).

Every field is one option of ``curvcal calibrate`` and ``curvcal metrics`` (field ``val_split``
is ``--val-split``), declared once with its type, default and help
(:mod:`curvcal.settings.fields`); the kernel (:mod:`curvcal.calibration.analysis`) takes the
class itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from curvcal.errors import InputError, SettingsError, setting_name
from curvcal.settings.fields import Settings, check_fields, comma_numbers, file_setting, setting
from curvcal.settings.hessian import MAX_SEED

#: The most ``--bins``: more bins than this hold no samples on any data set curvcal can score,
#: and each stage keeps a row per bin (classwise ECE one per class).
MAX_BINS = 10_000
#: ``--method``: temperature scaling, focal temperature scaling, both, vector scaling, matrix
#: scaling, the last-layer Laplace approximation (calibrate only: it needs the model), histogram
#: binning and isotonic regression (top-label or one-vs-rest), Platt scaling, beta calibration,
#: Dirichlet calibration (ODIR or L2), ensemble temperature scaling, Bayesian binning into
#: quantiles (BBQ), every map that applies
#: (ranked), or none (metrics only).
METHODS = (
    "ts",
    "focal-ts",
    "both",
    "vector",
    "matrix",
    "laplace",
    "histogram",
    "histogram-ovr",
    "isotonic",
    "isotonic-ovr",
    "platt",
    "beta",
    "dirichlet",
    "dirichlet-l2",
    "ets",
    "bbq",
    "venn-abers",
    "all",
    "none",
)
#: The most Monte Carlo draws of ``--laplace-predictive mc``, wherever the count is given (the
#: option, a policy, a saved calibrator): each draw is a K-wide softmax of every sample.
MAX_LAPLACE_SAMPLES = 100_000
#: ``--laplace-structure``: the last layer's GGN in full, Kronecker-factored, or chosen by size.
LAPLACE_STRUCTURES = ("auto", "full", "kron")
#: ``--laplace-predictive``: the probit approximation or Monte Carlo.
LAPLACE_PREDICTIVES = ("probit", "mc")
#: ``--laplace-prior``: the prior precision that maximises the marginal likelihood of the fit
#: split, or that minimises the predictive's NLL on held-out folds of it.
LAPLACE_PRIORS = ("marglik", "nll")
#: ``--histogram-scheme``: how histogram binning cuts the scores.
HISTOGRAM_SCHEMES = ("equal-mass", "equal-width")
#: ``--objective``: what temperature scaling minimises on the fit split.
OBJECTIVES_TS = ("nll", "ece", "adaece")
#: ``--focal-objective``: what focal temperature scaling minimises (``adaece-grid``: the
#: authors' grid search).
OBJECTIVES_FTS = ("ece", "nll", "adaece", "adaece-grid")
#: ``--rank-by``: the score ``--method all``'s summary table ranks the maps by (the scores
#: :mod:`curvcal.calibration.ranking` ranks by).
RANK_BY = ("nll", "ece")
#: The most panels a row of ``--plot`` holds by default (``--plot-columns``).
PLOT_COLUMNS = 4
#: ``--edges``: equal-width bins (a, b] (``left``) or [a, b) (``right``).
EDGES = ("left", "right")
#: ``--nan-policy``: a row of scores with a NaN or Inf stops the run, or is left out.
NAN_POLICIES = ("error", "drop")
#: The γ grid of focal temperature scaling.
DEFAULT_GAMMAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
#: Largest γ of focal temperature scaling (``--gammas``, and a saved focal TS map): φ_γ sharpens
#: a confident row like an inverse temperature of γ + 1, and the temperatures the fit searches
#: end at 100, so at γ = 100 the pair (γ, T) can still undo the map's sharpening and beyond it
#: none can. The grid the method's authors use ends at 7.
MAX_GAMMA = 100.0


def parse_gammas(ctx: Any, param: Any, value: str | None) -> tuple[float, ...] | None:
    """``--gammas 0,0.5,1``: comma-separated finite numbers ≥ 0 (a click callback)."""
    import click

    if value is None:
        return None
    gammas = comma_numbers(
        ctx,
        param,
        value,
        f"takes comma-separated numbers such as 0,0.5,1,2; got '{value}'",
        "needs at least one value",
    )
    if any(not (0 <= g <= MAX_GAMMA) for g in gammas):
        raise click.BadParameter(
            f"values must be finite and >= 0, at most {MAX_GAMMA:g}; got '{value}'", ctx, param
        )
    return gammas


@dataclass(frozen=True)
class CalibrationSettings(Settings):
    """What to fit and how to measure.

    ``method``: the maps to fit, ``ts``, ``focal-ts``, ``both`` (TS and focal TS), ``vector``,
    ``matrix``, ``histogram``, ``histogram-ovr``, ``isotonic``, ``isotonic-ovr``, ``platt``,
    ``beta``, ``bbq``, ``venn-abers``, ``all`` (every map that applies, ranked on the evaluation split) or ``none``
    (``None``: the
    command picks: ``both`` for ``calibrate``; for ``metrics``, ``both`` with a fit split and
    ``none`` without; for the kernel, ``both`` when it is given a fit split). ``objective``:
    what TS minimises on the fit split; ``focal_objective``: what focal TS minimises, over the
    γ grid ``gammas`` (sorted, without repeats). ``bins`` equal-width and equal-mass bins with
    the ``edges`` convention (``left``: (a, b], ``right``: [a, b)). ``histogram_bins`` bins of
    ``histogram_scheme`` for histogram binning. ``bootstrap`` resamples
    (0: none). ``val_split``: the stratified fraction the maps are fitted on (``None``: a
    second dataset or file, or the command's default). ``seed`` seeds the split and the
    bootstrap. ``nan_policy``: a row with a NaN or Inf stops the run or is left out.
    ``laplace_structure``, ``laplace_predictive``, ``laplace_samples``, ``laplace_prior``: the
    GGN, the predictive, its draws and the rule choosing the prior precision of ``laplace``.
    ``plot``: reliability diagrams written there at ``dpi``, ``plot_columns`` panels to a row,
    with classwise diagrams of the ``plot_classes`` most frequent classes, the smooth curve with ``plot_smooth``, the
    histogram's scale ``plot_counts``; ``rank_by``: the score the ``all`` summary ranks by;
    ``save_calibrator``: the fitted maps as JSON. ``device``: where the maps that have a
    device kernel run (:mod:`curvcal.calibration.device`); the others run on the CPU.
    """

    GROUP: ClassVar[str] = "calibration"

    method: str | None = setting(
        None,
        "Calibration maps to fit: temperature scaling, focal temperature scaling, both of them, "
        "vector scaling (w·z + b), matrix scaling (W z + b, off-diagonal and intercept L2 chosen "
        "by cross-validation on the fit split), Dirichlet calibration (W log p + b; dirichlet: "
        "off-diagonal and intercept L2, dirichlet-l2: L2 on every parameter; strength by "
        "cross-validation), ensemble temperature scaling (ets: TS, uncalibrated and uniform "
        "mixed by NLL), a last-layer Laplace approximation (calibrate "
        "only: it needs the model), histogram binning or isotonic regression of the "
        "top-label confidence (histogram, isotonic) or of each class against the rest, "
        "renormalised (histogram-ovr, isotonic-ovr), Platt scaling or beta calibration (two "
        "classes only), Bayesian binning into quantiles of the top-label confidence (bbq), "
        "venn-abers (inductive Venn-Abers: one-vs-all for K > 2), "
        "all (every map that applies, ranked by NLL and ECE on the evaluation "
        "split with paired bootstrap intervals of the differences), or none (measure only). "
        "Default: calibrate: both; metrics: none, or both with --fit or "
        "--val-split.",
        choices=METHODS,
        policy=True,
    )
    objective: str = setting(
        "nll",
        "What temperature scaling minimises on the fit split.",
        choices=OBJECTIVES_TS,
        policy=True,
    )
    focal_objective: str = setting(
        "ece",
        "What focal temperature scaling minimises on the fit split (picks γ and T). "
        "adaece-grid: the authors' code (Komisarenko & Kull): T on the linear grid "
        "0.05, 0.10, ..., 5.00 by equal-mass ECE, for each γ; γ likewise.",
        choices=OBJECTIVES_FTS,
        policy=True,
    )
    gammas: tuple[float, ...] = setting(
        DEFAULT_GAMMAS,
        "γ grid of focal temperature scaling.",
        low=0,
        parse=parse_gammas,
        metavar="G1,G2,...",
        default_text=",".join(f"{g:g}" for g in DEFAULT_GAMMAS),
        policy=True,
    )
    bins: int = setting(
        15,
        "Bins of ECE, MCE, RMS-CE, AdaECE and classwise ECE.",
        low=1,
        high=MAX_BINS,
        policy=True,
    )
    edges: str = setting(
        "left",
        "Equal-width bin edges: left = (a,b], right = [a,b).",
        choices=EDGES,
        policy=True,
    )
    histogram_bins: int = setting(
        15,
        "Bins of histogram binning (--method histogram, histogram-ovr); the fit split needs at "
        "least as many samples.",
        low=1,
        high=MAX_BINS,
        policy=True,
    )
    histogram_scheme: str = setting(
        "equal-mass",
        "How histogram binning cuts the scores: equal-mass (as AdaECE: the fit split's sorted "
        "scores in bins of equal size, ties kept together) or equal-width ((m/M, (m+1)/M]; an "
        "empty bin takes the middle of its edges).",
        choices=HISTOGRAM_SCHEMES,
        policy=True,
    )
    bootstrap: int = setting(
        0,
        "Bootstrap resamples for 95% intervals of ECE, AdaECE, MCE, classwise ECE, smooth ECE "
        "and NLL that hold the population value, and paired intervals of each map's NLL and ECE "
        "difference from the best and from uncalibrated.",
        low=0,
        metavar="N",
        policy=True,
    )
    val_split: float | None = setting(
        None,
        "Fit on a stratified fraction F of the samples, evaluate on the rest (calibrate and "
        "study: 0.5 unless the fit data is given apart).",
        low=0,
        high=1,
        low_open=True,
        high_open=True,
        metavar="F",
        policy=True,
    )
    seed: int = setting(
        0,
        "Seed of --val-split, of the bootstrap, of the folds of matrix scaling's and "
        "--laplace-prior nll's cross-validation and of the Monte Carlo draws of --method "
        "laplace.",
        low=0,
        high=MAX_SEED,
        policy=True,
    )
    plot: Path | None = file_setting(
        "Write reliability diagrams (uncalibrated and every fitted map) to a .png, .svg or .pdf file "
        "(needs matplotlib).",
        policy=False,
    )
    dpi: int = setting(
        100,
        "Resolution of --plot (dots per inch; the layout is fixed in inches).",
        low=10,
        high=2400,
        policy=False,
    )
    plot_columns: int = setting(
        PLOT_COLUMNS,
        "Panels per row of --plot: the reliability diagrams wrap into a grid of at most N "
        "columns (a stage's classwise diagrams start a row of their own).",
        low=1,
        high=64,
        metavar="N",
        policy=False,
    )
    plot_classes: int = setting(
        0,
        "Add classwise reliability diagrams (p_k against y = k) of the N most frequent classes "
        "to --plot, one row per stage.",
        low=0,
        metavar="N",
        policy=False,
    )
    plot_smooth: bool = setting(
        False,
        "Draw the smooth reliability curve (kernel-smoothed as for smooth ECE, Błasiok & "
        "Nakkiran 2023) over the bins of --plot.",
        flag=True,
        policy=False,
    )
    plot_counts: str = setting(
        "auto",
        "Scale of the confidence histogram under each --plot panel: fraction (linear), log, or "
        "auto (log when one bin holds more than half the samples).",
        choices=("auto", "fraction", "log"),
        policy=False,
    )
    rank_by: str = setting(
        "nll",
        "Score the --method all summary table ranks the maps by (uncalibrated first): NLL (a "
        "proper score) or ECE.",
        choices=RANK_BY,
        policy=False,
    )
    save_calibrator: Path | None = file_setting(
        "Write the fitted calibrator(s) as JSON (for metrics --apply).",
        policy=False,
    )
    laplace_structure: str = setting(
        "auto",
        "GGN of the last layer for --method laplace: full, Kronecker-factored (KFAC), or auto "
        "(full up to 1024 last-layer parameters).",
        choices=LAPLACE_STRUCTURES,
        policy=True,
    )
    laplace_predictive: str = setting(
        "probit",
        "Predictive of --method laplace: the probit approximation or Monte Carlo over the "
        "logits (--laplace-samples draws, seeded by --seed).",
        choices=LAPLACE_PREDICTIVES,
        policy=True,
    )
    laplace_samples: int = setting(
        100,
        "Monte Carlo draws of --laplace-predictive mc.",
        low=1,
        high=MAX_LAPLACE_SAMPLES,
        metavar="S",
        policy=True,
    )
    laplace_prior: str = setting(
        "marglik",
        "How --method laplace chooses its prior precision: marglik (maximise the Laplace "
        "marginal likelihood of the fit split) or nll (minimise the NLL of the predictive on "
        "held-out folds: stratified 5-fold cross-validation of the fit split seeded by --seed, "
        "a grid of 4 points per decade over [1e-8, 1e8] refined by Brent's method in log δ). "
        "nll is usually better calibrated; marglik needs no held-out data.",
        choices=LAPLACE_PRIORS,
        policy=True,
    )
    nan_policy: str = setting(
        "error",
        "Rows of logits with a NaN or Inf: stop with an error naming the first, or leave them "
        "out (counted in the report and warned about).",
        choices=NAN_POLICIES,
        policy=True,
    )
    device: str = setting(
        "auto",
        "Where the calibration maps with a device kernel (temperature scaling, focal "
        "temperature scaling, ensemble temperature scaling) are fitted and applied and the "
        "metrics' pass over the scores runs: auto (CUDA when available), cpu, cuda or cuda:N; "
        "the other maps run on the CPU, and a run on a device says which. calibrate: the "
        "model's --device.",
        policy=True,
    )

    def __post_init__(self) -> None:
        # The rules with the kernel's own words first (``bins: the number of bins must be
        # ...``), then each field's declared type and range (the seed, --dpi, --val-split).
        self.validate()
        check_fields(self)

    def validate(self) -> None:
        """Every rule of the settings a fit and its metrics depend on (each error names the
        field at fault); the γ grid is sorted and its repeats dropped."""
        if self.method is not None and self.method not in METHODS:
            raise SettingsError("method", f"unknown method {self.method!r}", _one_of(METHODS))
        if self.objective not in OBJECTIVES_TS:
            raise SettingsError(
                "objective", f"unknown objective {self.objective!r}", _one_of(OBJECTIVES_TS)
            )
        if self.focal_objective not in OBJECTIVES_FTS:
            raise SettingsError(
                "focal_objective",
                f"unknown objective {self.focal_objective!r}",
                _one_of(OBJECTIVES_FTS),
            )
        check_bins(self.bins, self.edges)
        if isinstance(self.bootstrap, bool) or not isinstance(self.bootstrap, int):
            raise SettingsError("bootstrap", f"must be a whole number, got {self.bootstrap!r}")
        if self.bootstrap < 0:
            raise SettingsError("bootstrap", f"must be >= 0, got {self.bootstrap}")
        if isinstance(self.gammas, str) or not self.gammas:
            raise SettingsError("gammas", "the gamma grid is empty", "0 is temperature scaling")
        grid = tuple(
            sorted({check_gamma(g, setting_name("gammas"), MAX_GAMMA) for g in self.gammas})
        )
        object.__setattr__(self, "gammas", grid)

    @property
    def fits_ts(self) -> bool:
        return self.method in ("ts", "both", "all")

    @property
    def fits_focal_ts(self) -> bool:
        return self.method in ("focal-ts", "both", "all")

    @property
    def reliability_classes(self) -> int:
        """Classwise reliability tables to measure: ``plot_classes`` when there is a plot to
        draw them in, else none."""
        return self.plot_classes if self.plot is not None else 0

    @property
    def smooth_curve(self) -> bool:
        """Whether to measure the smooth reliability curve: ``plot_smooth`` with a plot."""
        return self.plot_smooth and self.plot is not None

    def outputs(self) -> list[tuple[str, Path]]:
        """The files these settings write, as ``(option, path)``."""
        named = (("--plot", self.plot), ("--save-calibrator", self.save_calibrator))
        return [(option, path) for option, path in named if path is not None]


def check_bins(n_bins: int, edges: str = "left") -> None:
    """A bin count ≥ 1 and a known edge convention, else :class:`InputError`."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise SettingsError("bins", f"the number of bins must be an integer >= 1, got {n_bins!r}")
    if edges not in EDGES:
        raise SettingsError(
            "edges", f"unknown edge convention {edges!r}", "left for (a,b], right for [a,b)"
        )


def check_gamma(gamma: float, what: str = "gamma", high: float = math.inf) -> float:
    """A finite γ >= 0 (and <= ``high``: :data:`MAX_GAMMA` for focal temperature scaling) as a
    float, else :class:`InputError` naming ``what`` (the focal parameter of every loss, map and
    option that takes one)."""
    if (
        isinstance(gamma, bool)
        or not isinstance(gamma, int | float)
        or not (0 <= gamma < float("inf"))
    ):
        raise InputError(what, f"gamma must be a finite number >= 0, got {gamma!r}")
    if gamma > high:
        raise InputError(what, f"gamma {gamma!r} is outside 0..{high:g}")
    return float(gamma)


def _one_of(choices: tuple[str, ...]) -> str:
    return f"one of {', '.join(choices)}"
