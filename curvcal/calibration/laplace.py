"""Last-layer Laplace approximation: a Gaussian posterior over the weights of the model's final
``nn.Linear``, built from the GGN of the cross-entropy, and its predictive.

The last layer maps features φ(x) ∈ R^D to logits f = W φ + b (W: K×D, b: K, optional).
Its parameters θ are ordered as laplace-torch orders them: θ = [vec(W) row by row, b], so
θ_{k·D + d} = W_{kd} and θ_{K·D + k} = b_k (P = K·D, plus K with a bias).

**Curvature.** With p_n = softmax(f(x_n)) at the trained weights θ* (the MAP, the posterior
mean) and Λ_n = diag(p_n) − p_n p_nᵀ (the Hessian of the cross-entropy in the logits), the
GGN of the *summed* cross-entropy over the N fit samples is

    H = Σ_n J_nᵀ Λ_n J_n,    J_n = ∂f(x_n)/∂θ = [I_K ⊗ φ_nᵀ, I_K]

(``full``: the P×P matrix). ``kron`` is laplace-torch's KFAC for a linear layer (curvlinops'
type-2 GGN, weight and bias as separate blocks): the weight block is G ⊗ A with
G = Σ_n Λ_n (K×K) and A = (1/N) Σ_n φ_n φ_nᵀ (D×D), the bias block is G itself, and the
weight–bias coupling is dropped. ``auto`` picks ``full`` when P ≤ :data:`FULL_MAX_PARAMETERS`.

**Prior and marginal likelihood.** Prior θ ~ N(0, δ⁻¹ I) with one scalar precision δ on every
weight and bias. The posterior precision is H + δI, its covariance Σ = (H + δI)⁻¹, and the
Laplace log marginal likelihood (laplace-torch's ``log_marginal_likelihood``) is

    log Z(δ) = log p(D | θ*) − ½ [δ ‖θ*‖² + log det(H + δI) − P log δ]

with log p(D | θ*) = −Σ_n CE(f(x_n), y_n); this is log p(D|θ*) + log p(θ*) − ½ log det((H+δI)/2π).
With λ_i the eigenvalues of H (products a_j g_i plus the g_i of the bias block for ``kron``),
d log Z / d log δ = ½ [Σ_i λ_i/(λ_i + δ) − δ ‖θ*‖²], decreasing in δ: the maximum is the one
root, found by Brent's method in log δ over [:data:`PRIOR_BRACKET`] to machine precision
(laplace-torch takes 100 Adam steps of 0.1 in log δ from δ = 1 instead).

**Prior chosen by held-out NLL** (``prior="nll"``). The fit split is dealt into
:data:`PRIOR_FOLDS` stratified folds seeded by ``seed`` (:func:`~curvcal.calibration.linear.cv_folds`,
as matrix scaling's cross-validation). For each δ, fold j's rows are predicted by the
posterior built from the GGN of the other folds (same θ*, same structure and predictive), and
the objective is the mean NLL −log p_y of those held-out predictions over every fit row. δ is
the minimum over :data:`NLL_GRID` (4 points a decade over :data:`PRIOR_BRACKET`; the smallest δ
on ties, as laplace-torch's ``gridsearch`` takes ``argmin``), refined in log δ between the grid
neighbours of that minimum by Brent's method started from the three grid points (the vertex of
their parabola first; √ε tolerance, as SciPy's ``fminbound``), kept only if it is no worse; a
minimum on an end of the grid stays there (``at_bracket_end``). The posterior is then built from
the GGN of the whole fit split at that δ (the refit after cross-validation).
:func:`search_prior_precision` computes the probit objective of the whole grid at once from each
fold's eigenbasis (:func:`probit_grid_nll`). With the Monte Carlo predictive, which costs a
batched product per δ, the grid minimum is reached by descent from the probit minimum
(:func:`_descend`: steps to the lower neighbour, galloping on a long way, until both
neighbours are higher; from the other grid end too when it stops on one and that end is
lower), so the Monte Carlo objective is asked at a dozen δ or so instead of all 65 and ~11 of
the refinement. That is the grid minimum whenever the objective has one valley along the grid;
where it has several the descent can stop in another one (measured against asking every grid
point: the same δ on the bundled digits, the same grid point for 596 of 600 random heads). The
Monte Carlo predictive draws the same ε for every δ (one seed; drawn once per fold, with the fold's
eigenbases: :class:`MonteCarloFold`) and its roots R(δ) are smooth in δ, so its objective is.

**Predictive.** f_μ = W φ + b, logit covariance Σ_f = J Σ Jᵀ (K×K). ``probit`` (MacKay 1992,
laplace-torch's ``link_approx="probit"``): p = softmax(κ ⊙ f_μ) with κ_k = 1/√(1 + π/8·Σ_f,kk).
``mc``: p = mean over S seeded draws f = f_μ + R ε ~ N(f_μ, Σ_f) of softmax(f), R Rᵀ = Σ_f:
the Cholesky factor for ``full`` (as laplace-torch draws), Q_G diag(√v) for ``kron``.

Everything is float64 on the CPU. Pure: no file I/O, no printing, no global RNG.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from scipy.optimize import brentq
from torch import Tensor, nn

from curvcal.calibration.inputs import InputNames, as_tensor, class_labels
from curvcal.calibration.linear import CV_FOLDS, cv_folds
from curvcal.calibration.results import MapFit
from curvcal.calibration.saved import (
    Field,
    SavedMap,
    array,
    choice,
    coefficients,
    integer,
    number,
    text,
)
from curvcal.errors import InputError, NumericalError, SettingsError, setting_name
from curvcal.seeds import seeded_generator
from curvcal.settings.calibration import LAPLACE_PREDICTIVES as PREDICTIVES
from curvcal.settings.calibration import LAPLACE_PRIORS as PRIORS
from curvcal.settings.calibration import LAPLACE_STRUCTURES as STRUCTURES
from curvcal.settings.calibration import MAX_LAPLACE_SAMPLES
from curvcal.settings.hessian import MAX_SEED

#: ``auto`` takes the full GGN up to this many last-layer parameters: a P×P float64 matrix of
#: 8 MiB and an eigendecomposition of under a second; the saved covariance is P² numbers.
FULL_MAX_PARAMETERS = 1024
#: The prior precisions δ searched by the marginal likelihood.
PRIOR_BRACKET = (1e-8, 1e8)
#: The prior precisions δ searched by the held-out NLL rule: 4 points a decade over
#: :data:`PRIOR_BRACKET` (10^(i/4), i = −32 … 32), then refined by Brent's method in log δ.
NLL_GRID = tuple(10.0 ** (i / 4) for i in range(-32, 33))
#: Folds of the fit split for the held-out NLL rule.
PRIOR_FOLDS = CV_FOLDS
#: Most elements of one chunk's temporary (rows × K × K or rows × K × D).
CHUNK_ELEMENTS = 1 << 22
#: What a fit's errors call its inputs unless told otherwise: the head's features and labels.
FEATURES = InputNames(scores="features")


def last_linear(module: nn.Module, where: str = "model") -> tuple[str, nn.Linear]:
    """The name and module of the last ``nn.Linear`` registered in ``module`` (the head whose
    output should be the logits; the caller checks that it is), else :class:`InputError`."""
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not found:
        raise InputError(
            where,
            f"has no nn.Linear layer, so there is no last layer for {setting_name('method')} laplace",
            "the Laplace approximation needs a final nn.Linear producing the logits",
        )
    return found[-1]


@dataclass(frozen=True)
class HeadFeatures:
    """What a last-layer Laplace fit reads from the model: the inputs of its head,
    ``features`` (N×D, row n for sample n), and the head itself (``weight`` K×D, ``bias`` K or
    ``None``, its name ``layer``). :meth:`rows` keeps the samples of a split."""

    features: Tensor
    weight: Tensor
    bias: Tensor | None
    layer: str

    def rows(self, index: Any) -> HeadFeatures:
        return HeadFeatures(self.features[index], self.weight, self.bias, self.layer)

    def __len__(self) -> int:
        return int(self.features.shape[0])


def _prior_nll() -> str:
    """The held-out NLL prior rule, as the setting it is named by (``--laplace-prior nll``)."""
    return f"{setting_name('laplace_prior')} nll"


def resolve_structure(structure: str, n_parameters: int) -> str:
    """``full`` or ``kron``: ``auto`` becomes ``full`` up to :data:`FULL_MAX_PARAMETERS`."""
    if structure not in STRUCTURES:
        raise SettingsError("laplace_structure", f"unknown structure {structure!r}")
    if structure == "auto":
        return "full" if n_parameters <= FULL_MAX_PARAMETERS else "kron"
    return structure


@dataclass(frozen=True)
class LaplaceMap(SavedMap):
    """A fitted last-layer Laplace posterior, saved as plain numbers.

    ``weight`` (K×D) and ``bias`` (K, or ``None``) are the posterior mean (the checkpoint's own
    last layer); ``prior_precision`` δ; ``structure`` ``full`` with ``covariance`` (P×P, θ in
    the module docstring's order) or ``kron`` with the factors ``kron_a`` (D×D) and ``kron_g``
    (K×K); ``predictive`` ``probit`` or ``mc`` with ``samples`` draws seeded by ``seed``;
    ``layer``: the head's name in the model. Applied to features φ (N×D), not to logits.
    """

    weight: Tensor
    bias: Tensor | None
    prior_precision: float
    structure: str
    predictive: str
    samples: int
    seed: int
    layer: str
    covariance: Tensor | None = None
    kron_a: Tensor | None = None
    kron_g: Tensor | None = None
    prior_rule: str | None = None
    log_marginal_likelihood: float | None = None

    @property
    def method(self) -> str:
        return "laplace"

    @property
    def n_parameters(self) -> int:
        k, d = self.weight.shape
        return k * d + (0 if self.bias is None else k)

    def summary(self) -> dict[str, Any]:
        """What a report shows of this calibrator instead of its numbers (a full covariance is
        P² of them): its kind, layer, P, δ and the rule that chose it, log Z of the fit, the
        covariance's structure and shapes, the predictive, and ``sha256``: the SHA-256 of
        :meth:`to_dict` as compact JSON with sorted keys (:func:`saved_form_digest`)."""
        shapes = (
            {"covariance": [self.n_parameters, self.n_parameters]}
            if self.structure == "full"
            else {"kron_a": [self.n_features] * 2, "kron_g": [self.n_classes] * 2}
        )
        return {
            "method": self.method,
            "summary": True,
            "layer": self.layer,
            "n_parameters": self.n_parameters,
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "has_bias": self.bias is not None,
            "prior_precision": self.prior_precision,
            "prior_rule": self.prior_rule,
            "log_marginal_likelihood": self.log_marginal_likelihood,
            "structure": self.structure,
            "shapes": shapes,
            "predictive": self.predictive,
            "samples": self.samples,
            "seed": self.seed,
            "sha256": saved_form_digest(self.to_dict()),
        }

    @property
    def n_classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.weight.shape[1])

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (numbers and names only)."""
        out: dict[str, Any] = {
            "method": self.method,
            "layer": self.layer,
            "structure": self.structure,
            "predictive": self.predictive,
            "samples": self.samples,
            "seed": self.seed,
            "prior_precision": self.prior_precision,
            "prior_rule": self.prior_rule,
            "log_marginal_likelihood": self.log_marginal_likelihood,
            "weight": self.weight.tolist(),
            "bias": None if self.bias is None else self.bias.tolist(),
        }
        if self.structure == "full":
            assert self.covariance is not None
            out["covariance"] = self.covariance.tolist()
        else:
            assert self.kron_a is not None and self.kron_g is not None
            out["kron_a"] = self.kron_a.tolist()
            out["kron_g"] = self.kron_g.tolist()
        return out

    @classmethod
    def saved_fields(cls, data: Mapping[str, Any]) -> tuple[Field, ...]:
        """The head (``layer``, ``weight`` K×D, ``bias`` K or null), the predictive
        (``samples`` within the cap every setting of Monte Carlo draws shares,
        :data:`~curvcal.settings.calibration.MAX_LAPLACE_SAMPLES`), δ within
        :data:`PRIOR_BRACKET`, and ``covariance`` (P×P, |Σ_ij| ≤ 1/δ_min) or the Kronecker
        factors ``kron_a`` (D×D, |A_ij| ≤ float32's largest squared) and ``kron_g`` (K×K,
        |G_ij| ≤ the most samples / 4)."""
        full = data.get("structure") == "full"
        spread = 1.0 / PRIOR_BRACKET[0]
        matrices = (
            (array("covariance", ("P", "P"), -spread, spread),)
            if full
            else (
                array("kron_a", ("D", "D"), -KRON_A_BOUND, KRON_A_BOUND),
                array("kron_g", ("K", "K"), -KRON_G_BOUND, KRON_G_BOUND),
            )
        )
        return (
            choice("method", ("laplace",)),
            text("layer"),
            choice("structure", ("full", "kron")),
            choice("predictive", PREDICTIVES),
            integer("samples", 0, MAX_LAPLACE_SAMPLES),
            integer("seed", 0, MAX_SEED),
            number("prior_precision", *_SAVED_PRIOR_RANGE),
            choice("prior_rule", PRIORS, optional=True, nullable=True),
            number("log_marginal_likelihood", optional=True, nullable=True),
            coefficients("weight", ("K", "D")),
            coefficients("bias", ("K",), nullable=True),
            *matrices,
        )

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> LaplaceMap:
        """The map of checked fields, refused (naming ``source``) unless: a Monte Carlo
        predictive draws at least once, ``layer`` is a module path, ``covariance`` is P×P for
        the head's P = K·D (+ K) and, as (H + δI)⁻¹ is, symmetric positive semi-definite with
        Σ ≼ δ⁻¹ I (its diagonal within [0, 1/δ]); ``kron_a`` and ``kron_g`` symmetric PSD."""
        if values["predictive"] == "mc" and values["samples"] < 1:
            raise InputError(source, "a Monte Carlo predictive needs samples >= 1")
        layer = values["layer"]
        if layer != WHOLE_MODEL and not _MODULE_PATH.fullmatch(layer):
            raise InputError(
                source,
                f"layer {layer[:80]!r} is not a module path (names such as head or fc.2 "
                "joined by dots)",
            )
        weight = torch.from_numpy(values["weight"])
        bias = None if values["bias"] is None else torch.from_numpy(values["bias"])
        delta = values["prior_precision"]
        matrices: dict[str, Tensor] = {}
        for key in ("covariance", "kron_a", "kron_g"):
            if values.get(key) is not None:
                matrices[key] = torch.from_numpy(values[key])
                _check_psd(matrices[key], source, key)
        if "covariance" in matrices:
            k, d = weight.shape
            n_params = k * d + (0 if bias is None else k)
            cov = matrices["covariance"]
            if cov.shape[0] != n_params:
                raise InputError(
                    source,
                    f"covariance has shape {tuple(cov.shape)}, expected {(n_params, n_params)} "
                    "for the head's weight and bias",
                )
            largest = float(cov.diagonal().max())
            if largest > (1.0 + _ROUNDING) / delta:
                raise InputError(
                    source,
                    f"covariance has a diagonal entry {largest:.3g} above 1/prior_precision = "
                    f"{1.0 / delta:.3g}, which (H + δI)⁻¹ never exceeds",
                )
        return cls(
            weight=weight,
            bias=bias,
            prior_precision=delta,
            structure=values["structure"],
            predictive=values["predictive"],
            samples=values["samples"],
            seed=values["seed"],
            layer=layer,
            prior_rule=values["prior_rule"],
            log_marginal_likelihood=values["log_marginal_likelihood"],
            **matrices,
        )

    def check_model(self, module: nn.Module, where: str) -> None:
        """Refuse, naming ``where``, a posterior that is not over ``module``'s head: ``layer``
        must be the model's last ``nn.Linear`` (looked up among its registered modules, never
        by attribute), and the saved posterior mean, ``weight`` and ``bias``, must equal that
        layer's weights exactly (the map replaces the head by them), at the coarser of the
        precision the model is read in and the one it was fitted in (:func:`_differs`)."""
        name, head = last_linear(module, where)
        expected = name or WHOLE_MODEL
        if self.layer != expected:
            known = dict(module.named_modules())
            what = "is not a layer of the model" if self.layer not in known else "is a layer"
            raise InputError(
                where,
                f"its Laplace calibrator's layer {self.layer[:80]!r} {what}, but the model's "
                f"last nn.Linear is {expected!r}",
                "a Laplace calibrator applies only to the model it was fitted on",
            )
        for key, saved, own in (
            ("weight", self.weight, head.weight),
            ("bias", self.bias, head.bias),
        ):
            mismatch = _differs(saved, own)
            if mismatch:
                raise InputError(
                    where,
                    f"its Laplace calibrator's {key} differs from the {key} of the model's "
                    f"layer {expected!r} ({mismatch})",
                    "a Laplace calibrator applies only to the model it was fitted on: refit it",
                )

    def apply(self, features: Any, kind: str = "features", source: str = "features") -> Tensor:
        """float64 log-probabilities of the predictive at N×D ``features`` (the inputs of
        the last layer; ``kind`` must be ``features``: logits are not enough)."""
        if kind != "features":
            raise InputError(
                source,
                "a Laplace calibrator acts on the features of its checkpoint's last layer, "
                f"not on {kind}",
                "apply it to the checkpoint and its data, which give those features",
            )
        phi = _features(features, source, self.n_features)
        return predictive_log_probs(self, phi)

    def probabilities(
        self, features: Any, kind: str = "features", source: str = "features"
    ) -> Tensor:
        return torch.exp(self.apply(features, kind, source))


#: The ``layer`` of a head that is the whole model (an ``nn.Linear`` loaded as the model).
WHOLE_MODEL = "(the model itself)"
_MODULE_PATH = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
#: Relative rounding allowed in a saved matrix's symmetry, eigenvalues and diagonal bound.
_ROUNDING = 1e-9
#: The prior precisions a saved map may hold: :data:`PRIOR_BRACKET`, widened by rounding.
_SAVED_PRIOR_RANGE = (PRIOR_BRACKET[0] * (1 - _ROUNDING), PRIOR_BRACKET[1] * (1 + _ROUNDING))
#: Largest entry of a saved A = (1/N) Σ φφᵀ: the square of float32's largest number.
KRON_A_BOUND = 3.4028234663852886e38**2
#: Largest entry of a saved G = Σ_n (diag p_n − p_n p_nᵀ): the most samples (2⁶³) over 4.
KRON_G_BOUND = 2.0**61


def _check_psd(matrix: Tensor, source: str, key: str) -> None:
    """``matrix`` symmetric positive semi-definite up to :data:`_ROUNDING` of its scale."""
    scale = float(matrix.abs().max())
    if float((matrix - matrix.T).abs().max()) > _ROUNDING * scale:
        raise InputError(source, f"{key} is not symmetric")
    lowest = float(matrix.diagonal().min())
    if lowest < 0:
        raise InputError(source, f"{key} has a negative diagonal entry ({lowest:.3g})")
    eigenvalues = torch.linalg.eigvalsh(matrix)
    if float(eigenvalues[0]) < -_ROUNDING * max(scale, float(eigenvalues[-1])) * matrix.shape[0]:
        raise InputError(
            source,
            f"{key} is not positive semi-definite (eigenvalue {float(eigenvalues[0]):.3g})",
        )


#: The precisions a checkpoint's head is read in (``--dtype``): a posterior fitted on the
#: model in one of them and applied to it in another is over the same head.
_HEAD_PRECISIONS = (torch.float32, torch.bfloat16, torch.float16)


def _differs(saved: Tensor | None, own: Tensor | None) -> str | None:
    """How a saved tensor differs from the model's, or ``None`` when they are equal: exactly,
    or once both are rounded to the coarser of the model's precision and the saved one's (the
    narrowest of :data:`_HEAD_PRECISIONS` that holds every saved number), so that a posterior
    fitted with ``--dtype float32`` applies to the model read with ``--dtype bfloat16`` and
    the other way round, and no other head passes. (bfloat16 and float16 hold neither the
    other: a posterior fitted in one and applied in the other is refused where their two
    roundings of the checkpoint's weights differ.)"""
    if saved is None or own is None:
        return None if saved is None and own is None else "one has none"
    model = own.detach().to(device="cpu", dtype=torch.float64)
    if model.shape != saved.shape:
        return f"shape {tuple(saved.shape)} against {tuple(model.shape)}"
    if torch.equal(model, saved):
        return None
    coarser = {own.dtype} | {
        precision
        for precision in _HEAD_PRECISIONS
        if torch.equal(saved.to(precision).double(), saved)
    }
    for precision in coarser:
        if torch.equal(model.to(precision), saved.to(precision)):
            return None
    return f"largest difference {float((model - saved).abs().max()):.3g}"


@dataclass(frozen=True)
class LaplaceFit(MapFit[LaplaceMap]):
    """A last-layer Laplace approximation fitted on one split (see the module docstring).

    ``prior_precision``: δ chosen by ``prior_rule``: ``marglik`` maximises
    ``log_marginal_likelihood`` (``at_bracket_end``: δ sits on an end of ``prior_bracket``),
    ``nll`` minimises ``heldout_nll`` over ``prior_folds`` folds (``prior_bracket``: the grid's
    ends; ``heldout_nll`` is ``None`` for ``marglik``); ``log_likelihood``: −Σ CE at the MAP; ``nll_before`` /
    ``nll_after``: mean NLL on the fit split of the MAP softmax and of the predictive
    (in-sample). ``n_parameters`` P, ``n_features`` D, ``has_bias``, ``layer`` its name.
    """

    structure: str
    predictive: str
    samples: int
    prior_precision: float
    log_marginal_likelihood: float
    log_likelihood: float
    at_bracket_end: bool
    prior_bracket: tuple[float, float]
    prior_rule: str
    prior_folds: int
    heldout_nll: float | None
    n_parameters: int
    n_features: int
    has_bias: bool
    layer: str


@dataclass(frozen=True)
class Curvature:
    """The GGN of one fit: ``full`` (the P×P matrix ``ggn``) or ``kron`` (``kron_a``, ``kron_g``),
    and its eigenvalues (clipped at 0: H is positive semi-definite, eigh's rounding is not)."""

    structure: str
    eigenvalues: Tensor
    ggn: Tensor | None = None
    kron_a: Tensor | None = None
    kron_g: Tensor | None = None
    eigenvectors: Tensor | None = None
    """``full``: the eigenvectors of ``ggn`` (columns, in the order of ``eigenvalues``)."""


def _rows(n: int, width: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, width))


def ggn_full(features: Tensor, probs: Tensor, has_bias: bool) -> Tensor:
    """H = Σ_n J_nᵀ (diag p_n − p_n p_nᵀ) J_n over θ = [vec(W), b] (float64, P×P).

    Built in the augmented order (k, d̃) with φ̃ = [φ, 1], where H = Σ_n Λ_n ⊗ φ̃_n φ̃_nᵀ
    = blockdiag_k(Σ_n p_nk φ̃φ̃ᵀ) − Σ_n (p_n ⊗ φ̃_n)(p_n ⊗ φ̃_n)ᵀ, then permuted to θ's order.
    """
    phi = _augment(features, has_bias)
    n, dt = phi.shape
    k = probs.shape[1]
    h = torch.zeros(k * dt, k * dt, dtype=torch.float64)
    for c in range(k):
        block = (phi * probs[:, c : c + 1]).T @ phi
        h[c * dt : (c + 1) * dt, c * dt : (c + 1) * dt] = block
    step = _rows(n, k * dt)
    for start in range(0, n, step):
        u = (probs[start : start + step, :, None] * phi[start : start + step, None, :]).reshape(
            -1, k * dt
        )
        h -= u.T @ u
    h = 0.5 * (h + h.T)
    order = _theta_order(k, features.shape[1], has_bias)
    return h[order][:, order]


def kron_factors(features: Tensor, probs: Tensor) -> tuple[Tensor, Tensor]:
    """laplace-torch's KFAC factors of a linear layer: A = (1/N) Σ φφᵀ (D×D) and
    G = Σ_n (diag p_n − p_n p_nᵀ) (K×K); the weight block is G ⊗ A, the bias block G."""
    n = features.shape[0]
    a = features.T @ features / n
    g = torch.diag(probs.sum(0)) - probs.T @ probs
    return 0.5 * (a + a.T), 0.5 * (g + g.T)


def curvature(features: Tensor, probs: Tensor, has_bias: bool, structure: str) -> Curvature:
    """The GGN of ``structure`` (``full`` or ``kron``) and its eigenvalues."""
    if structure == "full":
        h = ggn_full(features, probs, has_bias)
        values, vectors = torch.linalg.eigh(h)
        return Curvature("full", values.clamp_min(0.0), ggn=h, eigenvectors=vectors)
    a, g = kron_factors(features, probs)
    ga = torch.linalg.eigvalsh(g).clamp_min(0.0)
    aa = torch.linalg.eigvalsh(a).clamp_min(0.0)
    eigs = torch.outer(ga, aa).reshape(-1)
    if has_bias:
        eigs = torch.cat([eigs, ga])
    return Curvature("kron", eigs, kron_a=a, kron_g=g)


def log_marginal_likelihood(
    delta: float, eigenvalues: Tensor, theta_sq: float, log_likelihood: float
) -> float:
    """log Z(δ) = log p(D|θ*) − ½ [δ‖θ*‖² + Σ_i log(λ_i + δ) − P log δ] (module docstring)."""
    p = eigenvalues.numel()
    logdet = float(torch.log(eigenvalues + delta).sum())
    return log_likelihood - 0.5 * (delta * theta_sq + logdet - p * math.log(delta))


def optimise_prior_precision(eigenvalues: Tensor, theta_sq: float) -> tuple[float, bool]:
    """δ maximising the log marginal likelihood: the root in log δ of
    Σ_i λ_i/(λ_i + δ) − δ‖θ*‖² (decreasing in δ) by Brent's method over :data:`PRIOR_BRACKET`,
    and whether δ is an end of the bracket (a root outside it, e.g. θ* = 0 or H = 0)."""

    def slope(log_delta: float) -> float:
        delta = math.exp(log_delta)
        return float((eigenvalues / (eigenvalues + delta)).sum()) - delta * theta_sq

    low, high = (math.log(end) for end in PRIOR_BRACKET)
    if slope(low) <= 0:
        return PRIOR_BRACKET[0], True
    if slope(high) >= 0:
        return PRIOR_BRACKET[1], True
    root = brentq(slope, low, high, xtol=1e-14, rtol=1e-15, maxiter=500)
    return math.exp(root), False


def posterior_covariance(ggn: Tensor, delta: float, curv: Curvature | None = None) -> Tensor:
    """Σ = (H + δI)⁻¹ by a symmetric eigendecomposition (float64; that of ``curv`` when
    given, the same H)."""
    if curv is not None and curv.eigenvectors is not None:
        values, vectors = curv.eigenvalues, curv.eigenvectors
    else:
        values, vectors = torch.linalg.eigh(ggn)
    inverse = 1.0 / (values.clamp_min(0.0) + delta)
    cov = (vectors * inverse) @ vectors.T
    return 0.5 * (cov + cov.T)


def _posterior(template: LaplaceMap, curv: Curvature, delta: float) -> LaplaceMap:
    """``template``'s head, predictive and seed with the posterior of ``curv`` at δ."""
    if curv.structure == "full":
        assert curv.ggn is not None
        return replace(
            template,
            prior_precision=delta,
            structure="full",
            covariance=posterior_covariance(curv.ggn, delta, curv),
            kron_a=None,
            kron_g=None,
        )
    return replace(
        template,
        prior_precision=delta,
        structure="kron",
        covariance=None,
        kron_a=curv.kron_a,
        kron_g=curv.kron_g,
    )


@dataclass(frozen=True)
class HeldOutFold:
    """One fold of the held-out NLL rule: the GGN of the other folds' rows, and this fold's
    ``features`` and ``labels``."""

    curvature: Curvature
    features: Tensor
    labels: Tensor
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


def heldout_folds(
    features: Tensor,
    probs: Tensor,
    labels: Tensor,
    has_bias: bool,
    structure: str,
    folds: int = PRIOR_FOLDS,
    seed: int = 0,
) -> list[HeldOutFold]:
    """The ``folds`` stratified folds of the fit split (seeded by ``seed``), each with the
    GGN of ``structure`` built from every other fold's rows (a fold with no row, or with every
    row, is left out)."""
    fold_of = torch.as_tensor(cv_folds(labels, folds, seed))
    out = []
    for j in range(folds):
        held = fold_of == j
        train = ~held
        if not bool(held.any()) or not bool(train.any()):
            continue  # a class-poor split leaves some folds empty
        out.append(
            HeldOutFold(
                curvature(features[train], probs[train], has_bias, structure),
                features[held],
                labels[held],
            )
        )
    return out


def heldout_nll(delta: float, folds: list[HeldOutFold], template: LaplaceMap) -> float:
    """Mean over every held-out row of −log p_y, p the predictive of ``template`` (head,
    predictive, draws, seed) with the posterior of its fold's GGN at prior precision δ."""
    total, count = 0.0, 0
    for fold in folds:
        if fold.labels.numel() == 0:
            continue
        squares = _eigen_projections(template, fold)
        draws = _monte_carlo_fold(template, fold)
        if squares is not None:  # full GGN, probit: the same predictive, δ only rescales
            variances = squares @ (1.0 / (fold.curvature.eigenvalues + delta))
            kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * variances.clamp_min(0.0))
            logp = torch.log_softmax(kappa * logit_mean(template, fold.features), dim=1)
        elif draws is not None:  # Monte Carlo: the same draws and bases at every δ
            total -= _monte_carlo_label_log_likelihood(draws, fold, delta)
            count += int(fold.labels.numel())
            continue
        elif fold.curvature.structure == "kron":  # probit: Σ_f is diagonal in Q_G at every δ
            qg = _kron_fold_basis(fold)[0]
            variances = _kron_fold_spectrum(fold, delta, template.bias is not None) @ (qg * qg).T
            kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * variances)
            logp = torch.log_softmax(kappa * logit_mean(template, fold.features), dim=1)
        else:
            posterior = _posterior(template, fold.curvature, delta)
            logp = predictive_log_probs(posterior, fold.features)
        total -= float(logp.gather(1, fold.labels[:, None]).sum())
        count += int(fold.labels.numel())
    return total / count


def _eigen_projections(template: LaplaceMap, fold: HeldOutFold) -> Tensor | None:
    """For a full GGN H = V diag(λ) Vᵀ and the probit predictive: (J_nk · v_i)² (n×K×P), so
    that the logit variances at any δ are Σ_i (J_nk · v_i)² / (λ_i + δ) (the diagonal of
    J (H + δI)⁻¹ Jᵀ); cached on the fold. ``None`` otherwise, or when that tensor would exceed
    4 × :data:`CHUNK_ELEMENTS` (the posterior is then built at each δ)."""
    curv = fold.curvature
    if template.predictive != "probit" or curv.eigenvectors is None:
        return None
    k = template.n_classes
    n, p = fold.features.shape[0], curv.eigenvectors.shape[1]
    if n * k * p > 4 * CHUNK_ELEMENTS:
        return None
    cached: Tensor | None = fold.cache.get("squares")
    if cached is None:
        proj = _projections(template, fold.features, curv.eigenvectors)
        cached = fold.cache["squares"] = proj * proj
    return cached


def _projections(template: LaplaceMap, features: Tensor, vectors: Tensor) -> Tensor:
    """(J_n v_i)_k (n×K×P): the logits' Jacobian at each row of ``features`` times each column
    v_i of ``vectors`` (P×P, θ in the module docstring's order)."""
    k, d = template.weight.shape
    proj = torch.einsum("nd,kdp->nkp", features, vectors[: k * d].reshape(k, d, vectors.shape[1]))
    return proj if template.bias is None else proj + vectors[k * d :][None]


def _kron_fold_basis(fold: HeldOutFold) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For a ``kron`` fold: Q_G, the eigenvalues g of G and a of A (clipped at 0, as
    :func:`_kron_basis`) and (Q_Aᵀφ_n)² (n×D) of the fold's rows; cached on the fold."""
    cached: tuple[Tensor, Tensor, Tensor, Tensor] | None = fold.cache.get("kron_basis")
    if cached is None:
        curv = fold.curvature
        assert curv.kron_a is not None and curv.kron_g is not None
        ga, qg = torch.linalg.eigh(curv.kron_g)
        aa, qa = torch.linalg.eigh(curv.kron_a)
        c = fold.features @ qa
        cached = fold.cache["kron_basis"] = (qg, ga.clamp_min(0.0), aa.clamp_min(0.0), c * c)
    return cached


def _kron_fold_spectrum(fold: HeldOutFold, delta: float, has_bias: bool) -> Tensor:
    """v (n×K, ≥ 0) with Σ_f(x_n) = Q_G diag(v_n) Q_Gᵀ at prior precision δ for the fold's rows
    (:func:`_kron_spectrum` from the cached :func:`_kron_fold_basis`)."""
    _qg, ga, aa, c_sq = _kron_fold_basis(fold)
    v = c_sq @ (1.0 / (torch.outer(ga, aa) + delta)).T
    return (v + 1.0 / (ga + delta) if has_bias else v).clamp_min(0.0)


@dataclass(frozen=True)
class MonteCarloFold:
    """What the Monte Carlo predictive of one held-out fold keeps across δ: the logit means
    ``mean`` (n×K), the labels, the standard normal draws ``normals`` (n×K×S) that
    :func:`predictive_log_probs` draws for these rows, and the δ-free part of the logit
    covariance, ``basis``: for ``full`` the projections (J_n v_i)_k onto the GGN's
    eigenvectors (n×K×P); empty for ``kron`` (the fold's :func:`_kron_fold_basis`)."""

    mean: Tensor
    labels: Tensor
    normals: Tensor
    basis: tuple[Tensor, ...]
    has_bias: bool


def _monte_carlo_fold(template: LaplaceMap, fold: HeldOutFold) -> MonteCarloFold | None:
    """The fold's :class:`MonteCarloFold` for the Monte Carlo predictive of ``template``'s
    draws and seed (cached on the fold under both);
    ``None`` for probit, or when the draws or the full projections would exceed
    4 × :data:`CHUNK_ELEMENTS` (the posterior is then built at each δ)."""
    if template.predictive != "mc":
        return None
    key = ("monte_carlo", template.samples, template.seed)
    cached = fold.cache.get(key)
    if cached is not None:
        return cached
    curv = fold.curvature
    n, k = fold.features.shape[0], template.n_classes
    samples = template.samples
    wide = curv.eigenvectors is not None and n * k * curv.eigenvectors.shape[1] > 4 * CHUNK_ELEMENTS
    if samples * n * k > 4 * CHUNK_ELEMENTS or wide:
        return None
    chunks = [draws for _, draws in _normal_chunks(n, k, samples, template.seed)]
    normals = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=1)
    if curv.structure == "full":
        assert curv.eigenvectors is not None
        basis: tuple[Tensor, ...] = (_projections(template, fold.features, curv.eigenvectors),)
    else:
        basis = ()  # the fold's own (_kron_fold_basis)
    state = MonteCarloFold(
        logit_mean(template, fold.features),
        fold.labels,
        normals.permute(1, 2, 0).contiguous(),
        basis,
        template.bias is not None,
    )
    fold.cache[key] = state
    return state


def _monte_carlo_label_log_likelihood(
    state: MonteCarloFold, fold: HeldOutFold, delta: float
) -> float:
    """Σ_n log p_{y_n} of the Monte Carlo predictive at prior precision δ: the same roots R_n
    (:func:`covariance_root` of Σ_f = B_n diag(1/(λ+δ)) B_nᵀ, B_n the cached projections, for
    ``full``; Q_G diag(√v_n) for ``kron``) and the same draws ε as :func:`predictive_log_probs`,
    in one batched product; log p_y = logsumexp_s(f_sy − logsumexp_k f_sk) − log S."""
    normals = state.normals
    samples = normals.shape[2]
    if fold.curvature.structure == "full":
        (proj,) = state.basis
        inverse = 1.0 / (fold.curvature.eigenvalues + delta)
        root = covariance_root(torch.bmm(proj * inverse, proj.transpose(1, 2)))
    else:
        qg = _kron_fold_basis(fold)[0]
        root = qg[None] * _kron_fold_spectrum(fold, delta, state.has_bias).sqrt()[:, None, :]
    logits = _logit_draws(state.mean, root, normals)
    label = logits.gather(1, state.labels[:, None, None].expand(-1, 1, samples))[:, 0]
    log_probs = torch.logsumexp(logits, dim=1).neg_().add_(label)
    return float(torch.logsumexp(log_probs, dim=1).sum()) - label.shape[0] * math.log(samples)


def covariance_root(cov: Tensor) -> Tensor:
    """R with R Rᵀ = Σ for each K×K matrix of ``cov`` (n×K×K, symmetrised first): the lower
    Cholesky factor (as ``torch.distributions.MultivariateNormal`` and laplace-torch's Monte
    Carlo predictive draw), or U √max(Λ, 0) of the eigendecomposition Σ = U Λ Uᵀ for a
    matrix that is not numerically positive definite (a zero Σ_f, rounding)."""
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    root, info = torch.linalg.cholesky_ex(cov)
    failed = info != 0
    if bool(failed.any()):
        values, vectors = torch.linalg.eigh(cov[failed])
        root[failed] = vectors * values.clamp_min(0.0).sqrt()[:, None, :]
    return root


def _logit_draws(mean: Tensor, root: Tensor, normals: Tensor) -> Tensor:
    """f_μ,n + R_n ε_s for every row n and draw s: n×K×S from the means (n×K), the roots
    (n×K×K) and the standard normals (n×K×S)."""
    return torch.bmm(root, normals).add_(mean[:, :, None])


@dataclass(frozen=True)
class PriorSearch:
    """The held-out NLL rule's search: ``prior_precision`` chosen, ``grid_choice`` the grid's
    minimiser, ``objective`` the held-out NLL at the choice, ``at_bracket_end`` whether the grid
    minimum is an end of the grid, ``asked``: the δ at which the objective was computed (values
    given as ``known`` not counted)."""

    prior_precision: float
    grid_choice: float
    objective: float
    at_bracket_end: bool
    asked: int = 0


def minimise_on_grid(
    objective: Any,
    grid: tuple[float, ...] = NLL_GRID,
    refine: bool = True,
    start: int | None = None,
    known: Mapping[float, float] | None = None,
) -> PriorSearch:
    """δ minimising ``objective(δ)``: the grid's minimum (the first, i.e. smallest δ, on ties;
    a non-finite value counts as +inf), then, inside the grid, the minimum in log δ between
    the minimum's neighbours (``refine``: :func:`_brent_from_bracket` from the three grid values),
    kept only when its value is no larger.

    ``known``: values of the objective already computed at some δ (never asked again; each δ
    is asked once). ``start``: a grid index where a cheaper criterion of the same shape is
    lowest; the grid minimum is then found by descent from it, asking only the points on the
    way (:func:`_descend`: to the lower neighbour, the smaller δ on a tie, galloping on a long
    way, until both neighbours are higher), and again from the other grid end when it stops on
    one and that end is lower. That is the grid minimum whenever the objective falls and then
    rises along the grid (one valley); elsewhere it may be another valley's. Without ``start``
    every grid point is asked."""
    memo: dict[float, float] = dict(known or {})

    def value_at(delta: float) -> float:
        if delta not in memo:
            found = float(objective(delta))
            memo[delta] = found if math.isfinite(found) else math.inf
        return memo[delta]

    def key(i: int) -> tuple[float, int]:
        return value_at(grid[i]), i

    best = -1
    if start is not None:
        best = _descend(lambda i: value_at(grid[i]), len(grid), start)
        other = len(grid) - 1 - best  # stopped on a grid end: is the other end lower?
        if best in (0, len(grid) - 1) and key(other) < key(best):
            best = min(best, _descend(lambda i: value_at(grid[i]), len(grid), other), key=key)
    if best < 0 or not math.isfinite(memo[grid[best]]):
        finite = [value_at(delta) for delta in grid]
        best = min(range(len(grid)), key=lambda i: (finite[i], i))
    if not math.isfinite(memo[grid[best]]):
        raise NumericalError(_prior_nll(), "the held-out NLL is not finite at any δ")
    choice, value = grid[best], memo[grid[best]]
    at_end = best in (0, len(grid) - 1)
    if refine and not at_end:
        t_best, t_value = _brent_from_bracket(
            lambda t: value_at(math.exp(t)),
            (math.log(grid[best - 1]), math.log(grid[best]), math.log(grid[best + 1])),
            (value_at(grid[best - 1]), value_at(grid[best]), value_at(grid[best + 1])),
        )
        if t_value <= value:
            choice, value = math.exp(t_best), t_value
    return PriorSearch(choice, grid[best], value, at_end, len(memo) - len(known or {}))


#: Golden section's step, as a share of the larger side of a bracket.
_GOLDEN = 0.3819660112501051
#: Relative and absolute tolerance of the refined log δ (those of SciPy's ``fminbound``:
#: √ε relative; the objective's rounding decides δ no more finely).
_REFINE_RTOL, _REFINE_ATOL = 1.4901161193847656e-08, 1e-10
#: Most refinement steps (each asks the objective once).
_REFINE_STEPS = 100


def _brent_from_bracket(
    value: Any, bracket: tuple[float, float, float], values: tuple[float, float, float]
) -> tuple[float, float]:
    """The minimum of ``value`` on [a, c] from a bracket a < b < c whose ``values`` are known,
    value(b) no larger than value(a) and value(c) (the grid minimum and its neighbours):
    Brent's method (Brent 1973, ch. 5; SciPy's ``fminbound``) started from those three points,
    so its first step is the vertex of their parabola rather than a golden-section point.
    Each step is the vertex of the parabola through the three lowest points asked (x, w, v),
    or a golden-section step into the larger side of the bracket when that vertex falls
    outside it or does not halve the step before last. It stops when the bracket around x is
    within four tolerances (√ε |x| + 1e-10) or the parabola's vertex lies within one tolerance
    of x (x is then its minimum to that tolerance). Returns x and its value."""
    low, x, high = bracket
    fa, fx, fc = values
    (w, fw), (v, fv) = sorted(((low, fa), (high, fc)), key=lambda point: point[1])
    step = before = high - low
    for _ in range(_REFINE_STEPS):
        middle = 0.5 * (low + high)
        tol = _REFINE_RTOL * abs(x) + _REFINE_ATOL
        if abs(x - middle) <= 2 * tol - 0.5 * (high - low):
            break
        golden = True
        if abs(before) > tol:
            r = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            p = (x - v) * q - (x - w) * r
            q = 2.0 * (q - r)
            p, q = (-p, q) if q > 0 else (p, -q)
            previous, before = before, step
            if q > 0 and abs(p) < abs(0.5 * q * previous) and q * (low - x) < p < q * (high - x):
                step, golden = p / q, False
                if abs(step) < tol:
                    break  # the parabola's minimum is x, to the tolerance
                if x + step - low < 2 * tol or high - (x + step) < 2 * tol:
                    step = math.copysign(tol, middle - x)
        if golden:
            before = (low - x) if x >= middle else (high - x)
            step = _GOLDEN * before
        u = x + (step if abs(step) >= tol else math.copysign(tol, step))
        fu = value(u)
        if fu <= fx:
            if u >= x:
                low = x
            else:
                high = x
            v, fv, w, fw, x, fx = w, fw, x, fx, u, fu
        else:
            if u < x:
                low = u
            else:
                high = u
            if fu <= fw or w == x:
                v, fv, w, fw = w, fw, u, fu
            elif fu <= fv or v in (x, w):
                v, fv = u, fu
    return x, fx


def _descend(value: Any, size: int, start: int) -> int:
    """A local minimum of ``value`` (grid index ↦ value) over ``size`` grid points, reached from
    ``start`` by descent: points are ordered by (value, index), so a tie goes to the smaller δ
    as the first minimum of the whole grid does. The descent steps to the lower neighbour; after
    two steps one way it gallops (steps of 2, 4, 8, … points) while the values keep falling,
    then narrows the last stride by golden section on the grid indices, and ends with plain
    steps until both neighbours are higher: a local minimum whose neighbours were asked, in
    about 2 log₂ of the distance asked points rather than the distance."""

    def key(i: int) -> tuple[float, int]:
        return value(i), i

    here = min(max(start, 0), size - 1)
    direction = _downhill(key, size, here)
    if direction:
        behind, here = here, here + direction
        stride = 1
        while True:
            ahead = min(max(here + direction * stride, 0), size - 1)
            if ahead == here:
                break
            if key(ahead) >= key(here):
                here = _golden_indices(key, behind, here, ahead)
                break
            behind, here = here, ahead
            stride *= 2 if abs(here - start) > 1 else 1
    while direction := _downhill(key, size, here):
        here += direction
    return here


def _downhill(key: Any, size: int, i: int) -> int:
    """−1 or +1 towards a lower neighbour of grid point ``i`` (the left one first), else 0."""
    if i > 0 and key(i - 1) < key(i):
        return -1
    if i < size - 1 and key(i + 1) < key(i):
        return 1
    return 0


def _golden_indices(key: Any, first: int, middle: int, last: int) -> int:
    """Golden-section search on the grid indices between ``first`` and ``last`` (either order)
    for a point lower than both, starting from ``middle``, lower than both ends."""
    low, high = min(first, last), max(first, last)
    while high - low > 2:
        if middle - low > high - middle:
            probe = middle - max(1, round(_GOLDEN * (middle - low)))
        else:
            probe = middle + max(1, round(_GOLDEN * (high - middle)))
        if key(probe) < key(middle):
            low, high = (low, middle) if probe < middle else (middle, high)
            middle = probe
        elif probe < middle:
            low = probe
        else:
            high = probe
    return middle


def search_prior_precision(
    folds: list[HeldOutFold], template: LaplaceMap, grid: tuple[float, ...] = NLL_GRID
) -> PriorSearch:
    """The held-out NLL rule's search, :func:`minimise_on_grid` of :func:`heldout_nll`, with
    the probit held-out NLL of the whole grid computed at once (:func:`probit_grid_nll`). For
    the probit predictive those are the objective's grid values (the same numbers to rounding:
    the same grid minimum), so only the refinement asks for more. For Monte Carlo they say where
    the descent to the grid minimum starts, and the Monte Carlo objective is asked only on its
    way and by the refinement (on the bundled digits 9 or 10 δ instead of 76). Without them (a
    fold's projections too big to hold) every grid point is asked."""

    check_grid(grid)

    def objective(delta: float) -> float:
        return heldout_nll(delta, folds, template)

    squares = [_fold_squares(template, fold) for fold in folds]
    if template.predictive == "probit":
        values = probit_grid_nll(folds, template, grid, squares)
        if values is None:
            return minimise_on_grid(objective, grid)
        return minimise_on_grid(objective, grid, known=dict(zip(grid, values, strict=True)))
    start = _probit_start(folds, template, grid, squares)
    return minimise_on_grid(objective, grid, start=start)


def check_grid(grid: tuple[float, ...]) -> None:
    """Refuse a grid of prior precisions the search cannot walk: empty, holding a δ that is not
    a positive finite number, or not strictly increasing (the descent steps to neighbours)."""
    where = _prior_nll()
    if not grid:
        raise InputError(where, "the grid of prior precisions holds no δ")
    if not all(math.isfinite(delta) for delta in grid):
        raise InputError(where, "the grid of prior precisions must hold finite numbers")
    if min(grid) <= 0:
        raise InputError(where, "the grid of prior precisions must be positive")
    if any(b <= a for a, b in itertools.pairwise(grid)):
        raise InputError(where, "the grid of prior precisions must be increasing")


#: The probit start of the Monte Carlo descent is looked for on every this many grid points,
#: then among the grid points within this many of the best of those.
_COARSE = 4


def _probit_start(
    folds: list[HeldOutFold],
    template: LaplaceMap,
    grid: tuple[float, ...],
    squares: list[Tensor | None],
) -> int | None:
    """Where the Monte Carlo descent starts: the grid point of lowest probit held-out NLL
    (:func:`probit_grid_nll`), looked for on every :data:`_COARSE`-th point and then next to
    the best of those (a start, not a choice: the descent moves on from it); ``None`` when the
    probit values cannot be had (every grid point is then asked)."""
    centre = 0
    for step in (_COARSE, 1):
        low = 0 if step == _COARSE else max(0, centre - _COARSE + 1)
        high = len(grid) if step == _COARSE else min(len(grid), centre + _COARSE)
        points = list(range(low, high, step))
        values = probit_grid_nll(folds, template, tuple(grid[i] for i in points), squares)
        if values is None:
            return None
        centre = points[min(range(len(points)), key=lambda i: (values[i], i))]
    return centre


def _fold_squares(template: LaplaceMap, fold: HeldOutFold) -> Tensor | None:
    """(J_nk · v_i)² (n×K×P) of a ``full`` fold: the probit rule's cached squares, or the
    square of the Monte Carlo state's projections; ``None`` for ``kron``, or when neither is
    kept (too big)."""
    squares = _eigen_projections(template, fold)
    if squares is not None:
        return squares
    state = _monte_carlo_fold(template, fold)
    if state is None or not state.basis:
        return None
    return state.basis[0] * state.basis[0]


def probit_grid_nll(
    folds: list[HeldOutFold],
    template: LaplaceMap,
    grid: tuple[float, ...],
    squares: list[Tensor | None],
) -> list[float] | None:
    """:func:`heldout_nll` of the probit predictive at every δ of ``grid`` at once (+inf where
    it is not finite). Per fold the logit variances at all δ of a chunk of the grid come from
    one product with the δ-free part: ``full``, the ``squares`` (J_nk · v_i)² (n·K × P) of the
    fold (:func:`_fold_squares`) times 1/(λ_i + δ) (P × grid); ``kron``, (Q_Aᵀφ_n)² times
    1/(g_i a_j + δ) (+ 1/(g_i + δ) with a bias), then Q_G ⊙ Q_G. ``None`` when a ``full``
    fold has no squares (they would exceed 4 × :data:`CHUNK_ELEMENTS`)."""
    k = template.n_classes
    deltas = torch.tensor(grid, dtype=torch.float64)
    totals = torch.zeros(len(grid), dtype=torch.float64)
    count = 0
    for fold, fold_squares in zip(folds, squares, strict=True):
        n = fold.labels.numel()
        if n == 0:
            continue
        curv = fold.curvature
        mean = logit_mean(template, fold.features)
        if curv.structure == "full":
            if fold_squares is None:
                return None
            flat = fold_squares.reshape(n * k, -1)
        else:
            qg, ga, aa, c_sq = _kron_fold_basis(fold)
        # a grid point's temporaries: n×K variances and logits, and K×D (kron) or P inverses
        step = _rows(len(grid), max(2 * n * k, curv.eigenvalues.numel()))
        for first in range(0, len(grid), step):
            chunk = deltas[first : first + step]
            if curv.structure == "full":
                inverse = 1.0 / (curv.eigenvalues[:, None] + chunk[None, :])
                variances = (flat @ inverse).reshape(n, k, -1).clamp_min(0.0)
            else:
                inverse = torch.reciprocal(torch.outer(ga, aa)[None] + chunk[:, None, None])
                v = (c_sq @ inverse.reshape(-1, c_sq.shape[1]).T).reshape(n, -1, k)
                if template.bias is not None:
                    v = v + 1.0 / (ga[None, :] + chunk[:, None])
                variances = torch.matmul(qg * qg, v.clamp_min(0.0).transpose(1, 2))
            kappa = torch.rsqrt(variances.mul_(math.pi / 8.0).add_(1.0))
            logp = torch.log_softmax(kappa.mul_(mean[:, :, None]), dim=1)
            label = logp.gather(1, fold.labels[:, None, None].expand(-1, 1, chunk.numel()))
            totals[first : first + step] -= label[:, 0].sum(0)
        count += n
    values = (totals / count).tolist()
    return [value if math.isfinite(value) else math.inf for value in values]


def fit_laplace(
    features: Any,
    labels: Any,
    weight: Any,
    bias: Any = None,
    *,
    structure: str = "auto",
    predictive: str = "probit",
    samples: int = 100,
    seed: int = 0,
    layer: str = "",
    names: InputNames = FEATURES,
    prior: str = "marglik",
    grid: tuple[float, ...] = NLL_GRID,
) -> LaplaceFit:
    """Fit the last-layer Laplace approximation of a head (``weight`` K×D, ``bias`` K or
    ``None``) on its input ``features`` (N×D) and ``labels``: GGN, prior precision by the
    marginal likelihood (``prior="marglik"``) or by the held-out NLL of the predictive over
    ``grid`` (``prior="nll"``; folds seeded by ``seed``), posterior (module docstring)."""
    w = _matrix_tensor(weight, "last layer weight")
    k, d = w.shape
    b = None if bias is None else as_tensor(bias, "last layer bias").to(torch.float64).reshape(-1)
    if b is not None and b.numel() != k:
        raise InputError("last layer bias", f"has {b.numel()} entries for {k} outputs")
    phi = _features(features, names.scores, d)
    n = phi.shape[0]
    if n == 0:
        raise InputError(names.scores, "the fit split holds no sample", "give a larger fit split")
    y = class_labels(labels, n, k, names.labels)
    if predictive not in PREDICTIVES:
        raise SettingsError("laplace_predictive", f"unknown predictive {predictive!r}")
    if predictive == "mc" and samples < 1:
        raise SettingsError("laplace_samples", "a Monte Carlo predictive needs at least 1 draw")
    if prior not in PRIORS:
        raise SettingsError("laplace_prior", f"unknown prior rule {prior!r}")
    has_bias = b is not None
    n_params = k * d + (k if has_bias else 0)
    chosen = resolve_structure(structure, n_params)
    logits = phi @ w.T + (b if b is not None else 0.0)
    logp = torch.log_softmax(logits, dim=1)
    if not bool(torch.isfinite(logp).all()):
        raise NumericalError(
            names.scores, "the last layer's logits are not finite on the fit split"
        )
    nll = -logp.gather(1, y[:, None])[:, 0]
    log_likelihood = -float(nll.sum())
    curv = curvature(phi, torch.exp(logp), has_bias, chosen)
    theta_sq = float((w * w).sum()) + (float((b * b).sum()) if b is not None else 0.0)
    template = LaplaceMap(
        weight=w,
        bias=b,
        prior_precision=1.0,
        structure=chosen,
        predictive=predictive,
        samples=samples,
        seed=seed,
        layer=layer,
        prior_rule=prior,
    )
    search, n_folds = None, 0
    if prior == "marglik":
        delta, at_end = optimise_prior_precision(curv.eigenvalues, theta_sq)
    else:
        folds = heldout_folds(phi, torch.exp(logp), y, has_bias, chosen, PRIOR_FOLDS, seed)
        if not folds:
            raise InputError(
                _prior_nll(),
                f"the fit split ({n} samples) cannot be dealt into {PRIOR_FOLDS} folds with "
                "held-out and training rows",
                f"give a larger fit split or use {setting_name('laplace_prior')} marglik",
            )
        search, n_folds = search_prior_precision(folds, template, grid), len(folds)
        delta, at_end = search.prior_precision, search.at_bracket_end
    logz = log_marginal_likelihood(delta, curv.eigenvalues, theta_sq, log_likelihood)
    posterior = replace(_posterior(template, curv, delta), log_marginal_likelihood=logz)
    after = predictive_log_probs(posterior, phi)
    return LaplaceFit(
        structure=chosen,
        predictive=predictive,
        samples=samples if predictive == "mc" else 0,
        prior_precision=delta,
        log_marginal_likelihood=logz,
        log_likelihood=log_likelihood,
        at_bracket_end=at_end,
        prior_bracket=PRIOR_BRACKET if search is None else (grid[0], grid[-1]),
        prior_rule=prior,
        prior_folds=n_folds,
        heldout_nll=None if search is None else search.objective,
        n_parameters=n_params,
        n_features=d,
        has_bias=has_bias,
        layer=layer,
        nll_before=float(nll.mean()),
        nll_after=float(-after.gather(1, y[:, None])[:, 0].mean()),
        n_samples=n,
        calibrator=posterior,
    )


def _augmented_covariance(posterior: LaplaceMap) -> Tensor:
    """The full posterior covariance in the augmented order (k, d̃), as a K×D̃×K×D̃ tensor."""
    assert posterior.covariance is not None
    k, d = posterior.weight.shape
    has_bias = posterior.bias is not None
    dt = d + int(has_bias)
    order = _theta_order(k, d, has_bias)
    aug = torch.empty_like(posterior.covariance)
    aug[order[:, None], order[None, :]] = posterior.covariance
    return aug.reshape(k, dt, k, dt)


def _kron_basis(posterior: LaplaceMap) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The eigenbases Q_G, Q_A and the weight-block inverse eigenvalues 1/(g_i a_j + δ), and
    the bias block's 1/(g_i + δ) (``None`` without a bias): in the basis Q_G every logit
    covariance is diagonal, Σ_f = Q_G diag(v) Q_Gᵀ."""
    assert posterior.kron_a is not None and posterior.kron_g is not None
    delta = posterior.prior_precision
    ga, qg = torch.linalg.eigh(posterior.kron_g)
    aa, qa = torch.linalg.eigh(posterior.kron_a)
    ga, aa = ga.clamp_min(0.0), aa.clamp_min(0.0)
    inverse = 1.0 / (torch.outer(ga, aa) + delta)
    bias = None if posterior.bias is None else 1.0 / (ga + delta)
    return qg, qa, inverse, bias


def _kron_spectrum(basis: tuple[Tensor, Tensor, Tensor, Tensor | None], x: Tensor) -> Tensor:
    """v (n×K) with Σ_f(x_n) = Q_G diag(v_n) Q_Gᵀ: v_ni = Σ_j (Q_Aᵀφ_n)_j² / (g_i a_j + δ)
    (+ 1/(g_i + δ) with a bias)."""
    _qg, qa, inverse, bias = basis
    c = x @ qa
    v = (c * c) @ inverse.T
    return v if bias is None else v + bias


def logit_mean(posterior: LaplaceMap, features: Tensor) -> Tensor:
    """f_μ = W φ + b (N×K)."""
    b = posterior.bias
    return features @ posterior.weight.T + (b if b is not None else 0.0)


def logit_variances(posterior: LaplaceMap, features: Tensor) -> Tensor:
    """The diagonal of Σ_f = J Σ Jᵀ at every row of ``features`` (N×K), in chunks (never the
    N×K×K covariances): ``full`` φ̃ᵀ Σ_kk φ̃ per class, ``kron`` (Q_G ⊙ Q_G) v_n."""
    k, d = posterior.weight.shape
    n = features.shape[0]
    out = torch.empty(n, k, dtype=torch.float64)
    if posterior.structure == "full":
        blocks = torch.diagonal(_augmented_covariance(posterior), dim1=0, dim2=2)  # d̃ ẽ k
        blocks = blocks.permute(2, 0, 1).contiguous()
        phi = _augment(features, posterior.bias is not None)
        step = _rows(n, k * phi.shape[1])
        for start in range(0, n, step):
            x = phi[start : start + step]
            out[start : start + step] = torch.einsum("nd,kde,ne->nk", x, blocks, x)
        return out.clamp_min(0.0)
    basis = _kron_basis(posterior)
    squares = basis[0] * basis[0]
    step = _rows(n, k + d)
    for start in range(0, n, step):
        out[start : start + step] = (
            _kron_spectrum(basis, features[start : start + step]) @ squares.T
        )
    return out


def logit_moments(posterior: LaplaceMap, features: Tensor) -> tuple[Tensor, Tensor]:
    """f_μ (N×K) and the whole logit covariances Σ_f = J Σ Jᵀ (N×K×K): N·K² numbers, for a
    few rows at a time (the predictives work in chunks)."""
    mean = logit_mean(posterior, features)
    if posterior.structure == "full":
        phi = _augment(features, posterior.bias is not None)
        cov = torch.einsum("nd,kdle,ne->nkl", phi, _augmented_covariance(posterior), phi)
        return mean, 0.5 * (cov + cov.transpose(1, 2))
    basis = _kron_basis(posterior)
    qg = basis[0]
    v = _kron_spectrum(basis, features)
    return mean, torch.einsum("ki,ni,li->nkl", qg, v, qg)


def predictive_log_probs(posterior: LaplaceMap, features: Tensor) -> Tensor:
    """log p of the predictive at ``features`` (float64 N×K): probit or Monte Carlo.

    Monte Carlo draws f = f_μ + R ε with R Rᵀ = Σ_f (``kron``: R = Q_G diag(√v); ``full``:
    the Cholesky factor, :func:`covariance_root`), ε standard normal from one generator seeded
    by ``seed``, taken row chunk by row chunk in order (:func:`_normal_chunks`: the same rows
    and seed give the same draws), and averages softmax(f) over the draws."""
    mean = logit_mean(posterior, features)
    if posterior.predictive == "probit":
        kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * logit_variances(posterior, features))
        return torch.log_softmax(kappa * mean, dim=1)
    n, k = mean.shape
    samples = posterior.samples
    out = torch.empty(n, k, dtype=torch.float64)
    basis = _kron_basis(posterior) if posterior.structure == "kron" else None
    for start, draws in _normal_chunks(n, k, samples, posterior.seed):
        step = draws.shape[1]
        x = features[start : start + step]
        if basis is not None:
            root = basis[0][None] * _kron_spectrum(basis, x).clamp_min(0.0).sqrt()[:, None, :]
        else:
            root = covariance_root(logit_moments(posterior, x)[1])
        logits = _logit_draws(mean[start : start + step], root, draws.permute(1, 2, 0))
        log_probs = torch.log_softmax(logits, dim=1)
        out[start : start + step] = torch.logsumexp(log_probs, dim=2) - math.log(samples)
    return out


def _normal_chunks(n: int, k: int, samples: int, seed: int) -> Iterator[tuple[int, Tensor]]:
    """The standard normals of the Monte Carlo predictive of n rows: row chunks in order, each
    (first row, S×rows×K draws) from one generator seeded by ``seed``."""
    generator = seeded_generator(seed)
    step = _rows(n, k * k + samples * k)
    for start in range(0, n, step):
        rows = min(step, n - start)
        yield start, torch.randn(samples, rows, k, generator=generator, dtype=torch.float64)


def saved_form_digest(saved: dict[str, Any]) -> str:
    """SHA-256 (hex) of a saved form as UTF-8 JSON with sorted keys and no spaces
    (``json.dumps(saved, sort_keys=True, separators=(",", ":"))``)."""
    import hashlib
    import json

    text = json.dumps(saved, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _theta_order(k: int, d: int, has_bias: bool) -> Tensor:
    """Indices into the augmented order (k, d̃) of θ = [vec(W), b] (laplace-torch's order)."""
    dt = d + int(has_bias)
    weights = (torch.arange(k)[:, None] * dt + torch.arange(d)[None, :]).reshape(-1)
    if not has_bias:
        return weights
    return torch.cat([weights, torch.arange(k) * dt + d])


def _augment(features: Tensor, has_bias: bool) -> Tensor:
    if not has_bias:
        return features
    return torch.cat([features, torch.ones(features.shape[0], 1, dtype=features.dtype)], 1)


def _features(features: Any, source: str, n_features: int) -> Tensor:
    if isinstance(features, HeadFeatures):
        features = features.features
    phi = as_tensor(features, source)
    if phi.ndim != 2:
        raise InputError(source, f"features must be 2-D (samples × D), got {tuple(phi.shape)}")
    if phi.shape[1] != n_features:
        raise InputError(
            source,
            f"features have {phi.shape[1]} columns, the last layer takes {n_features}",
            "a Laplace calibrator applies to the model it was fitted on",
        )
    phi = phi.to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(phi).all()):
        raise NumericalError(source, "the last layer's input features hold a NaN or Inf")
    return phi


def _matrix_tensor(value: Any, what: str) -> Tensor:
    m = as_tensor(value, what).to(device="cpu", dtype=torch.float64)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise InputError(what, f"must be a non-empty 2-D matrix, got shape {tuple(m.shape)}")
    return m
