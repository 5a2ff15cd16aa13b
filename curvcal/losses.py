"""Classification losses as objects: cross-entropy, focal (γ) and FLSD-53, one formula each.

With p = softmax(z) for logits z and label y, the per-sample losses are

    ce:      −log p_y
    focal:   −(1 − p_y)^γ · log p_y                           (Lin et al. 2017; γ = 0 is ce)
    FLSD-53: the focal loss with γ_i = 5 where p_y,i < 0.2, else γ_i = 3  (Mukhoti et al. 2020)

FLSD-53's γ_i is taken from the *detached* p_y at the current parameters: it is piecewise
constant in θ, so its gradient and Hessian (away from the measure-zero switching set
{p_y = 0.2}) are those of the focal loss with every γ_i held fixed. That makes FLSD-53 a loss
like the others: one Hessian operator serves all three.

A loss object's :meth:`~Loss.sum` gives the loss *summed* over a batch (the curvature operator
divides by the dataset size once); :func:`focal_loss` is the public function with a
``reduction``. :func:`loss_from_name` turns a name and γ (an option, or the training loss a
checkpoint records) into one of these objects, and :func:`as_loss` turns whatever the Python
API is given (a name, a loss object, a torch loss module, a callable) into one: a user's loss
is a :class:`UserLoss`, whose Hessian in the logits curvcal does not know in closed form
(:func:`closed_form_problem`). Imports nothing of curvcal but its errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from curvcal.errors import InputError, SettingsError, setting_name
from curvcal.settings.calibration import check_gamma

FLSD53 = "flsd53"
#: The losses :func:`loss_from_name` knows.
LOSS_NAMES = ("ce", "focal", FLSD53)
#: p_y below which FLSD-53 uses γ = 5 (else 3).
FLSD53_THRESHOLD = 0.2
FLSD53_GAMMAS = (5.0, 3.0)


def flsd53_gammas(p_y: Tensor) -> Tensor:
    """FLSD-53's per-sample γ: 5 where p_y < 0.2, else 3, in the dtype of ``p_y``; a constant
    (no gradient flows through it)."""
    with torch.no_grad():
        return torch.where(p_y.detach() < FLSD53_THRESHOLD, *FLSD53_GAMMAS).to(p_y.dtype)


def _check_rows(logits: Any, labels: Any) -> None:
    """Real floating 2-D ``logits`` (samples × classes) and one integer label per row, each in
    [0, K), else :class:`InputError` naming the argument (the public :func:`focal_loss` checks
    this; the operator's losses take batches checked once when the data was read)."""
    for name, value in (("logits", logits), ("labels", labels)):
        if not isinstance(value, Tensor):
            raise InputError(name, f"must be a torch tensor, got {type(value).__name__}")
    if not logits.is_floating_point():
        raise InputError("logits", f"must be a real floating-point tensor, got {logits.dtype}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise InputError("labels", f"must be integers, got {labels.dtype}")
    _check_shapes(logits, labels)
    n_classes = logits.shape[1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= n_classes):
        raise InputError(
            "labels",
            f"must lie in [0, {n_classes}), found {int(labels.min())}..{int(labels.max())}",
            "the number of classes is the number of logit columns",
        )


def _check_shapes(logits: Tensor, labels: Tensor) -> None:
    """2-D ``logits`` (samples × classes) and one label per row, else :class:`InputError` (no
    host read: this runs inside torch.func transforms, once per batch)."""
    if logits.ndim != 2:
        raise InputError(
            "logits", f"must be 2-D (samples × classes), got shape {tuple(logits.shape)}"
        )
    if labels.ndim != 1 or labels.shape[0] != logits.shape[0]:
        raise InputError(
            "labels",
            f"need one label per row: shape {tuple(labels.shape)} for {logits.shape[0]} rows",
        )


def focal_loss(
    logits: Tensor, labels: Tensor, gamma: float | str, reduction: str = "mean"
) -> Tensor:
    """Focal loss -(1 - p_y)^γ log p_y with p = softmax(logits), differentiable in ``logits``.

    ``gamma`` is a number >= 0 or ``"flsd53"`` (Mukhoti et al. 2020: γ = 5 where p_y < 0.2,
    else 3). The sample-dependent γ is a constant for the gradient. ``reduction`` is
    ``"mean"`` (default), ``"sum"`` or ``"none"``. Computed in the dtype of ``logits``.
    """
    _check_rows(logits, labels)
    if reduction not in ("mean", "sum", "none"):
        raise InputError("reduction", f"unknown reduction {reduction!r}", "mean, sum or none")
    loss = _focal_per_sample(logits, labels, gamma)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _focal_per_sample(logits: Tensor, labels: Tensor, gamma: float | str) -> Tensor:
    """−(1 − p_y)^γ log p_y per row, of logits and labels already checked."""
    logp_y = torch.log_softmax(logits, dim=1).gather(1, labels[:, None].to(torch.int64))[:, 0]
    p_y = torch.exp(logp_y)
    gamma_per_sample: Any
    if isinstance(gamma, str):
        if gamma.lower() != FLSD53:
            raise InputError(
                "gamma", f"unknown focal-loss gamma {gamma!r}", "a number >= 0 or flsd53"
            )
        gamma_per_sample = flsd53_gammas(p_y).to(logits.dtype)
    else:
        gamma_per_sample = check_gamma(gamma)
    # (1 - p)^γ with 0^0 = 1, written as a power of -expm1(log p) for accuracy near p = 1.
    modulating = torch.pow(-torch.expm1(logp_y), gamma_per_sample)
    return -modulating * logp_y


def cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """Σ_i −log softmax(z_i)[y_i]  (natural log, summed over the batch)."""
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def focal_loss_sum(logits: Tensor, labels: Tensor, gamma: float) -> Tensor:
    """Σ_i −(1 − p_{i,y_i})^γ · log p_{i,y_i}, with p = softmax(z)  (Lin et al. 2017); γ = 0 is
    cross-entropy."""
    if gamma == 0.0:
        return cross_entropy_sum(logits, labels)
    return _focal_per_sample(logits, labels, gamma).sum()


class Loss(Protocol):
    """A classification loss: its ``name`` (one of :data:`LOSS_NAMES`), its fixed ``gamma``
    (0 for ce, ``None`` for FLSD-53's per-sample γ) and its sum over a batch."""

    @property
    def name(self) -> str: ...

    @property
    def gamma(self) -> float | None: ...

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ over the batch of the per-sample loss (logits (B, K), integer labels (B,))."""
        ...


@dataclass(frozen=True)
class CrossEntropy:
    """Cross-entropy −log p_y."""

    name: str = "ce"
    gamma: float | None = 0.0

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ_i −log p_{i,y_i}."""
        return cross_entropy_sum(logits, labels)


@dataclass(frozen=True)
class Focal:
    """The focal loss −(1 − p_y)^γ log p_y with a fixed γ ≥ 0."""

    gamma: float
    name: str = "focal"

    def __post_init__(self) -> None:
        if not (isinstance(self.gamma, int | float) and math.isfinite(self.gamma)) or not (
            self.gamma >= 0
        ):
            raise InputError(
                "gamma", f"the focal parameter must be finite and ≥ 0, got {self.gamma}"
            )
        object.__setattr__(self, "gamma", float(self.gamma))

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ_i −(1 − p_{i,y_i})^γ log p_{i,y_i}."""
        return focal_loss_sum(logits, labels, float(self.gamma or 0.0))


@dataclass(frozen=True)
class FLSD53Loss:
    """FLSD-53: the focal loss with γ_i = 5 where the detached p_y,i < 0.2, else 3."""

    name: str = FLSD53
    gamma: float | None = None

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ_i −(1 − p_{i,y_i})^γ_i log p_{i,y_i}, γ_i from the detached p_{i,y_i}."""
        return _focal_per_sample(logits, labels, FLSD53).sum()


def logit_gradient(loss: Loss, logits: Tensor, labels: Tensor) -> Tensor:
    """∂ℓ_i/∂z_i for every row of ``logits`` (B, K), in closed form and without autograd (so
    it runs inside any torch.func transform and under saved-tensor hooks).

    Each loss here is ℓ = φ(u) of u = log p_y, so ∂ℓ/∂z = φ'(u)·(e_y − p):

        ce:    φ'(u) = −1
        focal: φ'(u) = (1 − p_y)^γ · (γ p_y log p_y / (1 − p_y) − 1)

    with p_y log p_y / (1 − p_y) taken as −1 at p_y = 1 (its limit) and 0^0 = 1, and FLSD-53's
    γ_i from :func:`flsd53_gammas`, held fixed like the loss holds it. The result has the
    dtype of ``logits`` and is a function of them; detach them for a constant. Raises
    :class:`InputError` unless ``logits`` are 2-D with one label per row.
    """
    _check_shapes(logits, labels)
    logp = torch.log_softmax(logits, dim=1)
    index = labels[:, None].to(torch.int64)
    gradient = logp.exp()
    if loss.name == "ce" or loss.gamma == 0.0:
        weight = torch.ones_like(gradient[:, 0])
    else:
        logp_y = logp.gather(1, index)[:, 0]
        p_y = logp_y.exp()
        gamma = flsd53_gammas(p_y) if loss.gamma is None else float(loss.gamma)
        q = -torch.expm1(logp_y)  # 1 − p_y, accurate near p_y = 1
        ratio = torch.where(q > 0, p_y * logp_y / torch.where(q > 0, q, 1.0), -1.0)
        weight = -torch.pow(q, gamma) * (gamma * ratio - 1.0)
    # φ'(u)(e_y − p) = −φ'(u)·(p − e_y), and −φ'(u) is ``weight``
    gradient = gradient.scatter_add(1, index, -torch.ones_like(index, dtype=gradient.dtype))
    return weight[:, None] * gradient


def _focal_derivatives(gamma: Tensor | float, logp: Tensor) -> tuple[Tensor, Tensor]:
    """φ'(u) and φ''(u) of the focal loss φ(u) = −(1 − e^u)^γ u at u = ``logp`` (any shape),
    with q = 1 − e^u and r = e^u·u/q (−1 at q = 0, its limit):

        φ'(u)  = q^γ (γ r − 1)
        φ''(u) = γ q^(γ−1) e^u (2 + u − (γ − 1) r)        (0 for γ = 0, cross-entropy)

    At q = 0 (p = 1) φ'' is γ(γ+1)·0^(γ−1): 0 for γ > 1, 2 for γ = 1, infinite for 0 < γ < 1,
    as the focal loss itself is there."""
    p = logp.exp()
    q = -torch.expm1(logp)
    ratio = torch.where(q > 0, p * logp / torch.where(q > 0, q, 1.0), -1.0)
    first = torch.pow(q, gamma) * (gamma * ratio - 1.0)
    second = (
        gamma
        * torch.pow(q, torch.as_tensor(gamma) - 1.0)
        * p
        * (2.0 + logp - (torch.as_tensor(gamma) - 1.0) * ratio)
    )
    second = torch.where(torch.as_tensor(gamma) > 0, second, 0.0)
    return first, second


def _row_gamma(loss: Loss, p: Tensor) -> Tensor | float:
    """The focal γ of ``loss`` for probabilities ``p`` of the label (FLSD-53's γ_i from them)."""
    if loss.gamma is None:
        return flsd53_gammas(p)
    return float(loss.gamma)


def _softmax_fisher_product(p: Tensor, w: Tensor) -> Tensor:
    """(diag p − p pᵀ) w for every row: the Hessian of cross-entropy in the logits, O(B·K)."""
    return p * w - p * (p * w).sum(1, keepdim=True)


def logit_hessian_product(loss: Loss, logits: Tensor, labels: Tensor, w: Tensor) -> Tensor:
    """Λ_n w_n with Λ_n = ∇²_z ℓ(z_n, y_n), for every row n, in closed form and O(B·K) (no
    (B, K, K) tensor), computed in float64 and returned in the dtype of ``w``.

    With u = log p_y and a = e_y − p = ∂u/∂z, ∇²_z u = −(diag p − p pᵀ), so for ℓ = φ(u)

        Λ = φ''(u) a aᵀ − φ'(u) (diag p − p pᵀ)

    cross-entropy: φ' = −1, φ'' = 0, Λ = diag p − p pᵀ (positive semi-definite); focal γ and
    FLSD-53 (γ_i held fixed): :func:`_focal_derivatives` (Λ may be indefinite)."""
    z, v = logits.to(torch.float64), w.to(torch.float64)
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    product = _softmax_fisher_product(p, v)
    if not (loss.name == "ce" or loss.gamma == 0.0):
        index = labels[:, None].to(torch.int64)
        logp_y = logp.gather(1, index)[:, 0]
        first, second = _focal_derivatives(_row_gamma(loss, logp_y.exp()), logp_y)
        a = -p.scatter_add(1, index, -torch.ones_like(index, dtype=p.dtype))  # e_y − p
        product = second[:, None] * a * (a * v).sum(1, keepdim=True) - first[:, None] * product
    return product.to(w.dtype)


def logit_fisher_product(loss: Loss, logits: Tensor, labels: Tensor, w: Tensor) -> Tensor:
    """F_n w_n with F_n = E_{k~p_n}[∇_z ℓ(z_n, k) ∇_z ℓ(z_n, k)ᵀ], the Fisher of the loss under
    the model's own predictive distribution p_n = softmax(z_n) (``labels`` are not used), in
    closed form and O(B·K), float64 inside, returned in the dtype of ``w``.

    ∇_z ℓ(z, k) = −φ'(log p_k)(e_k − p), so with c_k = p_k φ'(log p_k)² (w_k − pᵀw),
    F w = c − p Σ_k c_k. For cross-entropy φ' = −1 and F = diag p − p pᵀ: the Fisher is the
    GGN. For the focal loss it is the Fisher of the focal loss's gradients (each candidate label
    k with its own γ under FLSD-53), positive semi-definite, and not the GGN."""
    del labels
    z, v = logits.to(torch.float64), w.to(torch.float64)
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    if loss.name == "ce" or loss.gamma == 0.0:
        return _softmax_fisher_product(p, v).to(w.dtype)
    first, _ = _focal_derivatives(_row_gamma(loss, p), logp)
    c = p * first.square() * (v - (p * v).sum(1, keepdim=True))
    return (c - p * c.sum(1, keepdim=True)).to(w.dtype)


def logit_gradient_product(loss: Loss, logits: Tensor, labels: Tensor, w: Tensor) -> Tensor:
    """g_n (g_nᵀ w_n) with g_n = ∂ℓ(z_n, y_n)/∂z_n (:func:`logit_gradient`): the empirical
    Fisher's matrix in the logits, since the per-sample gradient is ∇_θ ℓ_n = J_nᵀ g_n and so
    ∇_θ ℓ_n ∇_θ ℓ_nᵀ = J_nᵀ g_n g_nᵀ J_n. O(B·K), float64 inside, the dtype of ``w`` out."""
    g = logit_gradient(loss, logits.to(torch.float64), labels)
    v = w.to(torch.float64)
    return (g * (g * v).sum(1, keepdim=True)).to(w.dtype)


@dataclass(frozen=True)
class Linearised:
    """``inner`` linearised in the logits at the current parameters: ℓ̃(z) = ḡᵀz with
    ḡ = ∂ℓ/∂z (:func:`logit_gradient`) held fixed.

    Its Hessian in θ is R = (1/N) Σ_n Σ_c ḡ_{n,c} ∇²_θ z_{n,c}, the part of the loss Hessian
    H = G + R that the Gauss–Newton matrix G = (1/N) Σ_n J_nᵀ Λ_n J_n leaves out: what the
    curvature of the network itself adds. ``name`` and ``gamma`` are those of ``inner``, the
    loss whose Hessian R is part of.
    """

    inner: Loss

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def gamma(self) -> float | None:
        return self.inner.gamma

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ_i ḡ_iᵀ z_i, ḡ_i = ∂ℓ_i/∂z_i at the detached logits."""
        return (logit_gradient(self.inner, logits.detach(), labels) * logits).sum()


def loss_from_name(name: str, gamma: float | None = None) -> Loss:
    """The loss object for ``name`` (``ce``, ``focal``, ``flsd53``) and its γ.

    ``focal`` needs a finite γ ≥ 0; ``ce`` and ``flsd53`` take none (γ 0 or ``None``). This is
    how a ``--loss`` option, and ``own`` (the training loss a checkpoint records), become a
    loss.
    """
    if name not in LOSS_NAMES:
        raise SettingsError(
            "loss", f"unknown loss {name!r}", f"choose one of {', '.join(LOSS_NAMES)}"
        )
    usable = isinstance(gamma, int | float) and not isinstance(gamma, bool)
    if gamma is not None and not (usable and 0.0 <= gamma < float("inf")):
        raise SettingsError("gamma", f"the focal parameter must be finite and ≥ 0, got {gamma}")
    if name == "focal":
        if gamma is None:
            raise SettingsError("gamma", "the focal loss needs γ")
        return Focal(float(gamma))
    if gamma not in (None, 0.0):
        loss = setting_name("loss")
        raise SettingsError("gamma", f"{gamma} is only used by {loss} focal", f"pass {loss} focal")
    return CrossEntropy() if name == "ce" else FLSD53Loss()


#: How a :class:`UserLoss` reduces a batch: its value is the batch's mean, or its sum.
REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class UserLoss:
    """A loss the user gives as a torch module or a callable ``function(logits, labels)`` that
    returns one scalar per batch: the batch's ``mean`` of the per-sample loss (torch's default
    reduction) or its ``sum``.

    :meth:`sum` turns the value into the batch's sum: B·value for a mean over a batch of B rows,
    the value itself for a sum. The Hessian operator divides the sum over every batch by N once,
    so a batch mean is weighted by B/N and the Hessian is that of the mean over the dataset of
    the per-sample loss, whatever the batch sizes. The operator may split a batch into smaller
    chunks (a memory budget, an out-of-memory retry), so the function must be a mean or sum of
    per-sample terms; a torch loss whose ``mean`` divides by something else than the number of
    rows (``weight=`` or ``ignore_index`` of ``CrossEntropyLoss``) gives the batch-size-weighted
    mean of those batch values: give such a module ``reduction="sum"`` for the dataset mean of
    its per-sample loss. ``gamma`` is ``None``: a user's loss has no focal γ.
    """

    function: Callable[[Tensor, Tensor], Tensor]
    reduction: str = "mean"
    name: str = "user"
    gamma: float | None = None

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise InputError(
                "loss",
                f"{self.name} has reduction={self.reduction!r}: the Hessian needs one scalar per "
                "batch",
                "use reduction='mean' or 'sum'",
            )

    def sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Σ over the batch of the per-sample loss: B·value for a ``mean``, else the value."""
        value = self.function(logits, labels)
        if not isinstance(value, Tensor) or value.ndim != 0:
            got = (
                f"a tensor of shape {tuple(value.shape)}"
                if isinstance(value, Tensor)
                else f"a {type(value).__name__}"
            )
            raise InputError(
                "loss",
                f"{self.name} returned {got} for a batch of {logits.shape[0]} samples, not a "
                "scalar tensor",
                "return the batch's mean (or sum, with reduction='sum') as a 0-d tensor",
            )
        return value * logits.shape[0] if self.reduction == "mean" else value


def _reduction_of(function: Any) -> str:
    """The reduction a loss module or callable declares (its ``reduction`` attribute, or the
    ``reduction`` keyword of a ``functools.partial``); ``mean`` when it declares none."""
    declared = getattr(function, "reduction", None)
    if declared is None:
        declared = (getattr(function, "keywords", None) or {}).get("reduction")
    return "mean" if declared is None else declared


def _name_of(function: Any) -> str:
    name = getattr(function, "__name__", None) or getattr(
        getattr(function, "func", None), "__name__", None
    )
    return name or type(function).__name__


def as_loss(loss: Any = "ce", gamma: float | None = None) -> Loss:
    """The loss object of what the Python API is given as ``loss``.

    A name (``"ce"``, ``"focal"`` with ``gamma``, ``"flsd53"``: :func:`loss_from_name`), a loss
    object of this module (returned as it is), a ``torch.nn.CrossEntropyLoss`` without class
    weights, label smoothing or another ``ignore_index`` (exactly cross-entropy: :class:`CrossEntropy`, whose Hessian in
    the logits is known), or any other torch loss module or callable ``loss(logits, labels)``
    returning a scalar: a :class:`UserLoss` with the reduction the module declares (``mean``
    unless it says ``sum``; ``none`` is refused). ``gamma`` goes with a name only.
    """
    if isinstance(loss, str):
        return loss_from_name(loss, gamma)
    if gamma is not None:
        raise InputError(
            "gamma", "goes with a loss name ('focal')", "leave gamma unset when passing a loss"
        )
    if isinstance(loss, CrossEntropy | Focal | FLSD53Loss | UserLoss | Linearised):
        return loss
    if not callable(loss):
        raise InputError(
            "loss",
            f"expected a loss name, a torch loss module or a callable, got {type(loss).__name__}",
            f"one of {', '.join(LOSS_NAMES)}, torch.nn.CrossEntropyLoss(), or "
            "loss(logits, labels) -> scalar",
        )
    reduction = _reduction_of(loss)
    if (
        isinstance(loss, torch.nn.CrossEntropyLoss)
        and loss.weight is None
        and loss.label_smoothing == 0.0
        and loss.ignore_index == -100  # F.cross_entropy's, as CrossEntropy calls it
        and reduction in REDUCTIONS
    ):
        return CrossEntropy()
    return UserLoss(loss, reduction, _name_of(loss))


def closed_form_problem(loss: Loss) -> str:
    """Why the Hessian of ``loss`` in the logits is not known in closed form ('' when it is):
    cross-entropy, focal and FLSD-53 are; a user's loss is not, so the Gauss–Newton trace, whose
    Λ_n and ∂ℓ/∂z_n come from that closed form, cannot be taken of it."""
    if isinstance(loss, CrossEntropy | Focal | FLSD53Loss):
        return ""
    name = loss.name if isinstance(loss, UserLoss) else type(loss).__name__
    return (
        f"the loss {name} is a module or callable whose Hessian in the logits curvcal does not "
        "know in closed form (it knows ce, focal and flsd53)"
    )
