"""The settings of a Hessian analysis (``curvcal hessian``; ``study`` and ``check`` take a part).

Every field is one option of ``curvcal hessian`` (field ``top_k`` is ``--top-k``), declared
once with its type, default and help (:mod:`curvcal.settings.fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from curvcal.errors import SettingsError, setting_name
from curvcal.settings.fields import Settings, setting, spelled_now

#: The largest seed: torch's and numpy's generators take a 64-bit seed, and a larger integer
#: overflows inside them.
MAX_SEED = 2**63 - 1
#: Default relative tolerance of an eigenvalue.
DEFAULT_TOL = 1e-4

#: The most SLQ runs a density may average. Each run's density is the spectral measure of one
#: random start vector, unbiased with a sampling error that falls as 1/√runs. Measured against
#: the exact smoothed density (σ = 1% of the span) of an evenly spread spectrum, largest error
#: over the grid relative to the peak, three draws each: 200 values, 1 run 1.3–2.1, 16 runs
#: 0.26–0.44, 256 runs 0.07–0.09, 1024 runs 0.035–0.042, 4096 runs 0.017–0.021; 1,500 values,
#: 1024 runs 0.013–0.020 (a larger model needs fewer). Past 1024 runs, each halving of an error
#: of a few percent costs four times the runs, and each run costs --density-steps products.
MAX_DENSITY_RUNS = 1024
DENSITY_RUNS_REASON = (
    "the density's sampling error falls as 1/√runs: about 4% of its peak at "
    f"{MAX_DENSITY_RUNS} runs on 200 parameters, less on more; each further halving costs four "
    "times the runs, each run --density-steps Hessian-vector products"
)

#: The most Lanczos steps an SLQ run may take. The density curvcal reports is the Gauss
#: quadrature of each run smoothed by a Gaussian of width σ = 1% of the spectrum's span; a Gauss
#: rule of m nodes integrates polynomials of degree 2m − 1 exactly, and that Gaussian is within
#: double-precision rounding of a polynomial of degree about 4.3 / (σ / half-span) ≈ 215, so
#: about 110 steps already give the smoothed density to rounding. Measured against the exact
#: spectral measure of the same start vector (P = 1,500, a uniform spectrum, the slowest case):
#: largest error 7e-3 of the peak at 80 steps, 1e-5 at 120, 4e-8 (the floor) from 160 on.
#: More steps add nothing to the result but products and a basis of P values per step
#: (100,000 steps on a 9,802-parameter model: capped at P, still more than four minutes).
MAX_DENSITY_STEPS = 256
DENSITY_STEPS_REASON = (
    f"more than {MAX_DENSITY_STEPS} steps cannot change the density, smoothed over 1% of the "
    "spectrum's span, which about 160 steps give to rounding; more runs (--density-runs, at "
    f"most {MAX_DENSITY_RUNS}) lower its noise"
)

#: ``--loss``: cross-entropy, focal (with ``--gamma``), FLSD-53, or the loss recorded in the
#: checkpoint's metadata (resolved to one of the others before any product).
LOSSES = ("ce", "focal", "flsd53", "own")
#: ``--method``: eigenvalues by power iteration or by Lanczos with partial reorthogonalisation
#: (Simon's ω recurrence).
EIGEN_METHODS = ("power", "lanczos")
#: ``--trace-method``: auto (Gauss–Newton where it is exact, else its exact Gauss–Newton part
#: plus Hutch++ on the rest where that can run, else Hutch++), the Gauss–Newton trace (exact
#: for networks linear in each parameter tensor), the split traces, Hutch++, XTrace, or
#: Hutchinson's estimator.
TRACE_METHODS = (
    "auto",
    "gauss-newton",
    "gauss-newton+hutchpp",
    "gauss-newton+xtrace",
    "hutchpp",
    "xtrace",
    "hutchinson",
)
#: ``--trace-method``'s former spellings, still read (with a note) wherever a user could have
#: written them: the kernels once spelled Hutch++ ``hutch++``
FORMER_TRACE_METHODS = (("hutch++", "hutchpp"), ("gauss-newton+hutch++", "gauss-newton+hutchpp"))
PROBE_DISTRIBUTIONS = ("rademacher", "gaussian")
#: ``--hvp``: picked per product width, torch.func forward-over-reverse, or double backward.
ENGINES = ("auto", "func", "autograd")
MODES = ("eval", "train")
CACHES = ("auto", "device", "host", "none")
KEEP_GRAPHS = ("auto", "always", "never")
#: ``--curvature``: the Hessian, the generalised Gauss–Newton matrix, the Fisher, or the
#: empirical Fisher (the kernels' list: a test holds them equal)
CURVATURES = ("hessian", "ggn", "fisher", "empirical-fisher")


def run_setting(default: Any = None, help: str = "", **spec: Any) -> Any:
    """A setting of one run alone: ``curvcal hessian``'s option sets it, while neither a
    ``check`` policy nor ``curvcal study`` may (:func:`~curvcal.settings.fields.setting` with
    ``policy=False, study=False``)."""
    return setting(default, help, policy=False, study=False, **spec)


@dataclass(frozen=True)
class HessianSettings(Settings):
    """What to measure of the Hessian of the mean loss over a dataset, and how.

    Eigenvalues: the ``top_k`` largest algebraic ones by ``method`` (``None``: Lanczos);
    ``smallest`` adds λmin; stop when the relative residual and change are below ``tol``, after
    at most ``max_iter`` iterations (power) or steps (Lanczos), Lanczos' basis bounded by
    ``max_basis`` vectors, started (``warm_start``) from the top eigenvectors of the Hessian
    over that fraction of the data. Trace (when ``trace``) by ``trace_method`` with ``probes`` products
    (or, with ``trace_rtol``, Hutchinson probes until the 95% half-width ≤ ``trace_rtol`` ×
    |estimate|) drawn from ``probe_dist``. Density (``density``): ``density_runs`` SLQ runs of
    ``density_steps`` Lanczos steps. ``per_layer``: λmax and trace of each module's block.
    The Hessian: of ``loss`` (with ``gamma`` for focal) over the parameters matching
    ``params`` (globs; empty: all trainable ones; ``("all",)``: all, token embeddings too),
    products by ``hvp`` in ``mode``, batches kept by ``cache``, ``probe_batch`` vectors per pass
    within ``memory_budget``, gradient graphs kept per ``keep_graphs``. ``seed`` seeds every
    random start vector and probe. ``strict``: exit 3 when an estimate does not converge.
    """

    GROUP: ClassVar[str] = "hessian"

    top_k: int = setting(
        1, "How many of the largest eigenvalues to find.", low=1, policy=True, study=False
    )
    method: str | None = setting(
        None,
        "Eigenvalue method (default: Lanczos, partially reorthogonalised).",
        choices=EIGEN_METHODS,
        policy=("eigen_method",),
        study=True,
    )
    smallest: bool = run_setting(False, "Also find the smallest eigenvalue λmin.", flag=True)
    tol: float = setting(
        DEFAULT_TOL,
        "Stop when the relative residual and change of each eigenvalue are below this.",
        low=0,
        low_open=True,
        policy=True,
        study=True,
    )
    max_iter: int | None = setting(
        None,
        "Iteration budget per eigenvalue (default: 1000 for power, min(P, max(300, 2·top-k)) "
        "Lanczos steps).",
        low=1,
        policy=True,
        study=True,
    )
    max_basis: int | None = run_setting(
        None,
        "Most vectors (P float64 values each) Lanczos' basis holds before it restarts on its "
        "best Ritz vectors (default: what --memory-budget holds, at least 2·top-k + 6); the "
        "density's runs keep theirs only if --density-steps vectors fit.",
        low=3,
    )
    warm_start: float | None = run_setting(
        None,
        "First find the top eigenvectors of the Hessian over a fraction F of the data, drawn by "
        "--seed, and start the eigenvalue stage from them (their products, each over F of the "
        "data, are reported apart).",
        low=0,
        low_open=True,
        high=1,
        high_open=True,
        metavar="F",
    )
    trace: bool = setting(
        True,
        "Estimate the Hessian's trace.",
        flag=True,
        negatable=True,
        policy=("trace",),
        study=False,
    )
    trace_method: str = setting(
        "auto",
        "gauss-newton: exact for networks linear in each parameter tensor (ReLU, convolution, "
        "eval BatchNorm), checked first; gauss-newton+hutchpp / +xtrace: its Gauss–Newton part "
        "exact, Hutch++ or XTrace on the rest (any network, eval mode); Hutch++ or XTrace "
        "(--probes products in all), or Hutchinson's estimator; auto: gauss-newton where it is "
        "exact, else gauss-newton+hutchpp where it can run, else Hutch++.",
        choices=TRACE_METHODS,
        former_words=FORMER_TRACE_METHODS,
        policy=("trace",),
        study=False,
    )
    probes: int = setting(
        100,
        "Trace probes (with --trace-rtol: the most probes drawn); at most 3P for hutchpp, "
        "xtrace and hutchinson (P parameters): 3P products are enough for the exact trace.",
        low=2,
        policy=True,
        study=True,
    )
    trace_rtol: float | None = run_setting(
        None,
        "Adaptive trace: draw probes until the 95% half-width is below this fraction of "
        "|estimate|.",
        low=0,
        low_open=True,
    )
    probe_dist: str = run_setting(
        "rademacher",
        "Distribution of the trace probes.",
        choices=PROBE_DISTRIBUTIONS,
    )
    density: bool = run_setting(False, "Estimate the eigenvalue density (SLQ).", flag=True)
    density_runs: int = run_setting(
        5,
        f"SLQ runs (at most {MAX_DENSITY_RUNS}).",
        low=1,
        high=MAX_DENSITY_RUNS,
        bound_reason=DENSITY_RUNS_REASON,
    )
    density_steps: int = run_setting(
        40,
        f"Lanczos steps per SLQ run (at most {MAX_DENSITY_STEPS}).",
        low=1,
        high=MAX_DENSITY_STEPS,
        bound_reason=DENSITY_STEPS_REASON,
    )
    per_layer: bool = run_setting(
        False,
        "λmax and trace of each module's Hessian block.",
        flag=True,
    )
    seed: int = setting(
        0,
        "Seed of start vectors and probes.",
        low=-MAX_SEED - 1,
        high=MAX_SEED,
        policy=True,
        study=True,
    )
    loss: str = setting(
        "ce",
        "ce, focal (with --gamma), flsd53, or own: the loss recorded in the checkpoint's metadata.",
        choices=LOSSES,
        operator=True,
        former=("criterion",),
        policy=True,
        study=True,
    )
    gamma: float | None = setting(
        None, "γ of the focal loss.", low=0, operator=True, policy=True, study=True
    )
    params: tuple[str, ...] = setting(
        (),
        "Only parameters whose names match this glob ('classifier.*'); repeatable; 'all': "
        "every trainable parameter, token embeddings too.",
        multiple=True,
        metavar="GLOB",
        operator=True,
        policy=True,
        study=False,
    )
    hvp: str = run_setting(
        "auto",
        "Hessian-vector products: torch.func forward-over-reverse, or double backward.",
        choices=ENGINES,
        operator=True,
        former=("engine",),
    )
    mode: str = run_setting(
        "eval",
        "Module mode during the loss (train: BatchNorm batch statistics; refused with dropout).",
        choices=MODES,
        operator=True,
    )
    cache: str = run_setting(
        "auto",
        "Where batches stay between products.",
        choices=CACHES,
        operator=True,
    )
    probe_batch: int = run_setting(
        8,
        "Vectors sharing one pass over the data (at most; fewer when the memory budget says so).",
        low=1,
        operator=True,
    )
    memory_budget: str | int | None = setting(
        None,
        "Memory one pass of products may use: bytes with a unit (4GiB, 512MB) or a share of "
        "the free memory (50%).",
        metavar="SIZE",
        default_text="half the free memory of the device",
        operator=True,
        policy=True,
        study=False,
    )
    keep_graphs: str = run_setting(
        "auto",
        "Keep the gradient graphs between products (the forward and first backward run once; "
        "auto: when they fit in --memory-budget).",
        choices=KEEP_GRAPHS,
        operator=True,
    )
    strict: bool = run_setting(False, "Exit 3 when an estimate does not converge.", flag=True)
    curvature: str = run_setting(
        "hessian",
        "The matrix measured: the Hessian; ggn, the generalised Gauss–Newton matrix Jᵀ H_loss J; "
        "fisher, its expectation over the model's own labels (for ce, the GGN); "
        "empirical-fisher, the mean of per-sample gradient outer products.",
        choices=CURVATURES,
        operator=True,
    )

    def lowest(self, name: str) -> float | None:
        """Every trace method but Hutchinson's needs at least 4 products; Lanczos' basis holds
        at least --top-k + 2 vectors."""
        if name == "probes" and self.trace_method != "hutchinson":
            return 4
        if name == "max_basis" and isinstance(self.top_k, int):
            return max(3, self.top_k + 2)
        return None

    def validate(self) -> None:
        """The rules between fields (each error names the field at fault)."""
        gamma, loss = setting_name("gamma"), setting_name("loss")
        if self.loss == "own" and self.gamma is not None:
            raise SettingsError(
                "gamma", f"cannot be combined with {loss} own, which reads γ from the checkpoint"
            )
        if self.loss == "focal" and self.gamma is None:
            raise SettingsError("loss", f"needs {gamma} γ (γ = 0 is cross-entropy)", value="focal")
        if self.loss in ("ce", "flsd53") and self.gamma not in (None, 0.0):
            raise SettingsError("gamma", f"{self.gamma} is only used by {loss} focal")
        if self.trace_rtol is not None and self.trace_method != "hutchinson":
            method = setting_name("trace_method")
            raise SettingsError(
                "trace_rtol",
                f"the adaptive stop works only with {method} hutchinson",
                f"add {method} hutchinson",
            )
        if self.warm_start is not None and self.method == "power":
            raise SettingsError(
                "warm_start",
                f"starts Lanczos only, not {setting_name('method')} power",
                f"leave out {setting_name('method')} power",
            )
        if self.memory_budget is not None:
            from curvcal.settings.sizes import parse_memory_budget

            parse_memory_budget(self.memory_budget)

    @property
    def focal_gamma(self) -> float:
        """γ of the loss as the kernels take it (0 for cross-entropy)."""
        return float(self.gamma or 0.0)


def trace_method_now(method: str, said: str = "method", stacklevel: int = 4) -> str:
    """A trace method as it is spelled today: a former spelling (:data:`FORMER_TRACE_METHODS`,
    ``hutch++``) becomes today's (``hutchpp``) with a
    :class:`~curvcal.errors.FormerSpellingWarning` naming ``said`` (the argument it came in);
    anything else as it is, for the caller to check."""
    return str(spelled_now(HessianSettings, "trace_method", method, said, stacklevel))
