"""The trace of the Hessian through its Gauss–Newton part: exact for networks linear in each tensor.

With logits z_n = f_θ(x_n) (C classes), J_n = ∂z_n/∂θ (C × P) and Λ_n = ∇²_z ℓ(z_n, y_n)
(C × C, the loss's Hessian in the logits), the Hessian of L(θ) = (1/N) Σ_n ℓ(z_n, y_n) splits as

    H = G + R,   G = (1/N) Σ_n J_nᵀ Λ_n J_n,   R = (1/N) Σ_n Σ_c (∂ℓ/∂z_{n,c}) ∇²_θ z_{n,c}.

When the logits are linear in each parameter tensor on its own — networks of linear layers,
convolutions, eval-mode BatchNorm, residual sums, ReLU and max-pooling, with their activation
pattern held fixed, as autograd differentiates them — every diagonal block ∇²_{tt} z_{n,c} is
zero, so tr(R) = 0 and

    tr(H) = tr(G) = (1/N) Σ_n Σ_k λ_{n,k} ‖J_nᵀ u_{n,k}‖²,

(λ_{n,k}, u_{n,k}) the eigenpairs of Λ_n: no Hessian product and no probe, exact up to
rounding. The same holds for the trace of any block of whole tensors (``params`` patterns), and
:func:`tensor_traces` returns each tensor's share. The squared norms ‖J_nᵀu_{n,k}‖² come from
one of three engines (:class:`EngineChoice`): layer hooks, one backward of the batch per index
k (:mod:`~curvcal.curvature.per_sample`: linear, convolution and eval BatchNorm layers, every
layer that holds a tied Parameter and every call of a layer run twice);
otherwise one backward per sample and k, by an autograd loop or ``torch.func.vmap``. The hooks
engine proves on each batch that it saw every use of every tensor — the batch's gradient summed
from the hooks, for a random cotangent, must equal autograd's
(:func:`~curvcal.curvature.per_sample.unseen_uses`) — and where it does not (a weight also passed
to ``F.linear``, or held by a module of another kind) the autograd loop, which differentiates
every use, takes over for good, and the result says so (:attr:`TensorTraces.note`). The
``torch.func`` engine proves the same on each chunk of rows it runs
(:func:`~curvcal.curvature.per_sample.differing_gradient`, the one check both engines call):
``functional_call`` swaps only the module's registered tensors, so a use of a Parameter held
elsewhere (a closure, a Python list or dict) would be a constant to it and its share lost.

Linearity is checked before anything is spent (:func:`linearity_check`), on every sample of the
data the trace is taken over (so no order of the samples changes the answer), batch by batch.
First by structure: each batch's forward pass is walked back from the logits through its
autograd graph (:mod:`~curvcal.curvature.graph_linearity`), and a tensor every node of whose
path is linear, a product with one factor depending on it, or piecewise linear (ReLU,
max-pooling) is linear for that batch — a forward and one backward, no second derivative. The
walk runs on every batch, since Python control flow may build another graph for other rows.
Then numerically, for the tensors the graph did not prove on that batch: with s = wᵀz for a
random Gaussian w per row and a random direction v_t in each such tensor t scaled to ‖θ_t‖, the
curvature v_tᵀ(∇²_{tt} s)v_t (one double backward per tensor) must be zero up to rounding — at
most ``LINEARITY_RTOL`` × ‖∇_t s‖·‖v_t‖, the size of the first-order term. In both, ∇_t s must
not vanish on every batch (a tensor no sample reaches is not shown linear). For a tensor the
logits are not linear in (a tanh or GELU after it, attention's softmax, a weight used twice in
series), the curvature is nonzero for almost every w and v wherever the nonlinearity is active
in some row of the batch, so one direction per batch decides.

A trace of a loss whose Λ_n are positive semi-definite (cross-entropy) is a sum of non-negative
terms: eigenvalues of Λ_n below zero are rounding and are set to zero, so the trace is never
negative and its interval never excludes 0 from below.

Samples must be independent, so the model runs in eval mode (train-mode BatchNorm couples the
rows of a batch and is refused). Λ_n comes from the loss object itself (cross-entropy,
focal γ, FLSD-53 with its γ_i held fixed), in float64; it may be indefinite (focal loss), which
the eigenpairs handle. Eigenvalues with |λ| ≤ 1e-12 × the batch's largest are skipped
(cross-entropy's Λ_n annihilates the all-ones vector): at most that fraction of the trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from curvcal.curvature.engines import is_torchscript
from curvcal.curvature.graph_linearity import proven_linear
from curvcal.curvature.per_sample import (
    Layer,
    Taps,
    differing_gradient,
    layer_plan,
    parameter_norms,
    proof_cotangent,
    unseen_uses,
)
from curvcal.curvature.precision import is_half, precision_floor
from curvcal.curvature.progress import OnStep
from curvcal.curvature.results import TraceResult
from curvcal.errors import NumericalError, SettingsError, setting_name
from curvcal.losses import CrossEntropy, Loss, closed_form_problem
from curvcal.rows import Inputs, as_batch_of_one, device_of, n_rows, take_rows
from curvcal.seeds import seeded_generator

METHOD = "gauss-newton"
INTERVAL = (
    "exact up to rounding (the logits are linear in each selected parameter tensor, checked on "
    "every sample: structurally on every batch's autograd graph, numerically by a second "
    "derivative along a random direction for the tensors the graph did not prove, so tr(H) is "
    "the trace of the Gauss–Newton matrix); the interval is a rounding allowance of 1024 ε of "
    "the parameters' dtype (bfloat16/float16: their precision floor) times (1/N) Σ |λ|·‖Jᵀu‖²"
)
#: the interval's text when the matrix measured is the GGN itself (no linearity needed)
GGN_INTERVAL = (
    "exact up to rounding (the trace of the Gauss–Newton matrix itself, on any network); the "
    "interval is a rounding allowance of 1024 ε of the parameters' dtype (bfloat16/float16: "
    "their precision floor) times (1/N) Σ |λ|·‖Jᵀu‖²"
)
#: the rounding allowance, in units of the parameters' ε: float32 1.2e-4 of Σ|λ|‖Jᵀu‖², float64
#: 2.3e-13. Measured on ResNet-18 in float32 against float64 (64 images): 1.4e-7 by the hooks,
#: 9.0e-6 by the per-sample loop (batch-1 convolution gradients summed in float32)
ROUNDING_ULPS = 1024
#: curvature allowed along the checked direction, relative to the first-order term
LINEARITY_RTOL = 1e-6
_HINT = "check the model's weights and the data for NaN or Inf, or use float64"
#: eigenvalues of Λ_n below this fraction of the batch's largest are skipped
EIGEN_FLOOR = 1e-12


class GaussNewtonSource(Protocol):
    """What the Gauss–Newton trace needs of an operator (a HessianOperator, or its guard)."""

    model: nn.Module
    loss: Loss
    mode: str
    param_names: tuple[str, ...]

    @property
    def parameters(self) -> tuple[Tensor, ...]: ...

    @property
    def n_samples(self) -> int: ...

    def first_batch(self) -> tuple[Inputs, Tensor]: ...

    def sum_across(self, value: Tensor) -> Tensor: ...

    def prepared(self) -> AbstractContextManager[None]: ...

    def sum_over_data(
        self, per_batch: Callable[[Inputs, Tensor], Tensor], *, on_batch: OnStep = None
    ) -> Tensor: ...


@dataclass(frozen=True)
class LinearityCheck:
    """Which selected tensors the logits were shown linear in.

    ``nonlinear``: tensors with curvature along the checked direction; ``unreached``: tensors
    the checked rows' logits do not depend on; ``failed``: why the check could not run (then
    nothing is shown linear)."""

    names: tuple[str, ...]
    nonlinear: tuple[str, ...] = ()
    unreached: tuple[str, ...] = ()
    failed: str | None = None
    #: tensors the autograd graph did not prove linear, so checked by a second derivative
    numerical: tuple[str, ...] = ()

    @property
    def linear(self) -> bool:
        """Whether every selected tensor was shown linear."""
        return self.failed is None and not self.nonlinear and not self.unreached

    def reason(self) -> str:
        """Why the Gauss–Newton trace is not exact here, in a phrase ('' when it is)."""
        if self.failed is not None:
            return f"the linearity check could not run ({self.failed})"
        parts = []
        if self.nonlinear:
            parts.append(f"the logits are not linear in {_names(self.nonlinear)}")
        if self.unreached:
            parts.append(f"the samples' logits do not depend on {_names(self.unreached)}")
        return "; ".join(parts)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def loss_hessians(loss: Loss, logits: Tensor, labels: Tensor) -> Tensor:
    """Λ_n = ∇²_z ℓ(z_n, y_n) for each row n of ``logits`` (B, C): a (B, C, C) float64 tensor.

    For cross-entropy Λ_n = diag(p_n) − p_n p_nᵀ with p_n = softmax(z_n), formed directly, its
    diagonal as p_i·Σ_{j≠i} p_j: p_i − p_i² would cancel to 0 where p_i rounds to 1 (a saturated
    row), leaving a matrix with a negative eigenvalue as large as the others; other losses by
    ``torch.func.jacrev`` twice of the loss object on each row."""
    z = logits.detach().to(torch.float64)
    if isinstance(loss, CrossEntropy):
        p = torch.softmax(z, dim=1)
        classes = p.shape[1]
        off = 1.0 - torch.eye(classes, dtype=p.dtype, device=p.device)
        others = (p.unsqueeze(1) * off).sum(2)  # Σ_{j≠i} p_j, without 1 − p_i's cancellation
        hessians = -p.unsqueeze(2) * p.unsqueeze(1)
        return hessians * off + torch.diag_embed(p * others)

    def one(row: Tensor, label: Tensor) -> Tensor:
        return loss.sum(row.unsqueeze(0), label.unsqueeze(0))

    hessian = torch.func.jacrev(torch.func.jacrev(one))
    return torch.func.vmap(hessian)(z, labels)


def linearity_check(
    model: nn.Module,
    names: Sequence[str],
    params: Sequence[Tensor],
    x: Inputs,
    *,
    seed: int = 0,
) -> LinearityCheck:
    """Whether the logits of the rows ``x`` are linear in each tensor of ``params`` (see the
    module's docstring): one forward, whose autograd graph proves the tensors it can
    (:func:`~curvcal.curvature.graph_linearity.proven_linear`), and one backward, whose
    gradients say which tensors the rows reach; for the tensors the graph did not prove, that
    backward keeps its graph and one double backward per tensor decides. The model is called as
    it is (its mode is the caller's)."""
    generator = seeded_generator(seed)
    names = tuple(names)
    try:
        with torch.enable_grad():
            logits = model(x)
            proven = proven_linear(logits, params)
            weights = torch.randn(logits.shape, generator=generator, dtype=torch.float64)
            score = (logits * weights.to(logits)).sum()
            grads = torch.autograd.grad(
                score, params, create_graph=not all(proven), allow_unused=True
            )
            nonlinear, unreached, numerical = [], [], []
            for name, param, grad, shown in zip(names, params, grads, proven, strict=True):
                if grad is None or not bool(grad.detach().abs().max() > 0):
                    unreached.append(name)
                    continue
                if shown or not grad.requires_grad:  # the gradient does not depend on θ
                    continue
                numerical.append(name)
                direction = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                scale = float(param.detach().norm()) or 1.0
                direction = (direction * (scale / float(direction.norm()))).to(param)
                first = float(grad.detach().double().norm()) * scale
                (second,) = torch.autograd.grad(
                    (grad * direction).sum(), param, retain_graph=True, allow_unused=True
                )
                curvature = 0.0 if second is None else float((second * direction).double().sum())
                if not math.isfinite(curvature) or abs(curvature) > LINEARITY_RTOL * first:
                    nonlinear.append(name)
    except RuntimeError as error:  # an operation without a second derivative
        return LinearityCheck(names, failed=str(error).splitlines()[0][:160])
    return LinearityCheck(names, tuple(nonlinear), tuple(unreached), numerical=tuple(numerical))


class EngineChoice:
    """How the per-sample backward passes run, decided on the first rows and kept after.

    ``hooks`` (first choice, when :func:`~curvcal.curvature.per_sample.layer_plan` covers every
    selected tensor: linear, convolution and eval BatchNorm layers): one forward of the batch
    with each layer's input and output recorded, then one backward to the layers' outputs per
    eigenvector index, every sample's squared norms from the layers' inputs and output
    gradients (:mod:`~curvcal.curvature.per_sample`); a layer run several times and layers
    sharing a Parameter are summed over every call before squaring.

    ``loop``: per row, one forward and one ``autograd.grad`` per kept eigenpair (any model,
    TorchScript included). ``func``: rows in chunks through ``torch.func.vmap`` of ``vjp``, every
    eigenpair of a chunk in one call (``VMAP_BYTES`` of per-sample gradients at most). Measured
    on one CPU thread, ``func`` is 4× faster on the bundled DigitsCNN (Python overhead per row
    dominates) and 20× slower on ResNet-18 (vmapped per-sample convolution gradients), so the
    first two rows run by ``loop`` (the second timed); when it took under ``VMAP_TRY_SECONDS``,
    one row and then 32 are run by ``func`` (the 32 timed) and the faster per row is kept. A
    model ``vmap`` cannot run (data-dependent control flow such as Hugging Face's attention
    masks, an operator without a batching rule) fails on that one row before anything of it is
    added, and stays on ``loop``.
    Every row counts, whichever engine ran it. ``engine`` is ``None`` until decided.

    The hooks must prove on every batch that they saw every use of every selected tensor
    (:func:`~curvcal.curvature.per_sample.unseen_uses`); where they do not, they are dropped for
    good in favour of the autograd ``loop``, which differentiates the Parameter itself and so
    every use of it, and ``fallback`` says why. ``func`` proves the same on each chunk of rows
    (:func:`_func_sums`) and is dropped for good in the same way."""

    def __init__(self, func_usable: bool, hooks: dict[str, Layer] | None = None) -> None:
        self.func_usable = func_usable
        self.hooks = hooks
        self.engine: str | None = "hooks" if hooks else (None if func_usable else "loop")
        #: the engines that ran, named as the operator names them (``autograd``, ``func``)
        self.ran: set[str] = set()
        #: why the layer hooks were dropped ('' when they were not)
        self.fallback = ""


#: a row cheaper than this by ``loop`` is worth trying with ``func``
VMAP_TRY_SECONDS = 0.02
#: per-sample gradients one ``func`` call may hold
VMAP_BYTES = 256 * 2**20


def positive_semidefinite(loss: Loss) -> bool:
    """Whether every Λ_n of ``loss`` is positive semi-definite (cross-entropy: Λ_n = diag(p) −
    ppᵀ), so that every tr(G_tt) is ≥ 0; the focal losses' may be indefinite."""
    return isinstance(loss, CrossEntropy)


def _eigenpairs(loss: Loss, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """λ, U and which are kept, of the loss's Hessians in the logits: (B, C), (B, C, C) and
    (B, C) bool. For a positive semi-definite Λ_n (:func:`positive_semidefinite`) an eigenvalue
    below zero is rounding (at most about ε·‖Λ_n‖) and is set to zero."""
    hessians = loss_hessians(loss, logits, y)
    if not bool(torch.isfinite(hessians).all()):
        raise NumericalError(
            "trace",
            "the Gauss–Newton trace is not finite: the loss's Hessian in the logits is NaN or "
            f"infinite for a batch of {logits.shape[0]} samples",
            _HINT,
        )
    values, vectors = torch.linalg.eigh(hessians)
    if positive_semidefinite(loss):
        values = values.clamp(min=0.0)
    return values, vectors, values.abs() > EIGEN_FLOOR * float(values.abs().max())


@dataclass(frozen=True)
class _Work:
    """One batch: its inputs, the eigenpairs of its Λ_n (λ, U, which are kept) and the
    per-tensor sums the engines add into."""

    x: Inputs
    values: Tensor
    vectors: Tensor
    keep: Tensor
    sums: Tensor


def _loop_sums(
    model: nn.Module, params: tuple[Tensor, ...], work: _Work, rows: range
) -> tuple[float, int]:
    """Adds the rows' Σ_k λ ‖(Jᵀu)_t‖² into ``work.sums``; returns their Σ |λ|·‖Jᵀu‖² and the
    backward passes."""
    x, values, vectors, keep, sums = work.x, work.values, work.vectors, work.keep, work.sums
    magnitude, passes = 0.0, 0
    for row in rows:
        kept = torch.nonzero(keep[row]).flatten().tolist()
        if not kept:
            continue
        with torch.enable_grad():
            z = model(take_rows(x, slice(row, row + 1)))[0]
        for position, k in enumerate(kept):
            grads = torch.autograd.grad(
                z,
                params,
                grad_outputs=vectors[row, :, k].to(z),
                retain_graph=position < len(kept) - 1,
                allow_unused=True,
            )
            norms = torch.stack(
                [
                    g.detach().double().pow(2).sum() if g is not None else sums.new_zeros(())
                    for g in grads
                ]
            )
            sums.add_(norms, alpha=float(values[row, k]))
            magnitude += abs(float(values[row, k])) * float(norms.sum())
            passes += 1
    return magnitude, passes


@dataclass(frozen=True)
class _FuncDone:
    """What :func:`_func_sums` added: Σ |λ|·‖Jᵀu‖² and the norms taken of the rows before
    ``stop``, and ``unseen``: the first tensor with a use ``torch.func`` did not see on the
    chunk from ``stop`` on ('' when it saw every use and ``stop`` is the end of the rows)."""

    magnitude: float
    passes: int
    stop: int
    unseen: str = ""


def _func_sums(
    model: nn.Module, names: tuple[str, ...], params: tuple[Tensor, ...], work: _Work, rows: range
) -> _FuncDone:
    """:func:`_loop_sums` by ``torch.func``: ``vmap`` over rows of ``vjp``, ``vmap`` over each
    row's eigenvectors, in chunks of rows holding at most ``VMAP_BYTES`` of gradients.

    ``functional_call`` swaps only the module's registered tensors, so a use of the Parameter
    that does not go through them (a closure or a list holding it) is a constant to
    ``torch.func`` and its share of every gradient would be lost. Each chunk therefore proves
    it saw every use before it is added: each row's vjp also pulls back the cotangent w_n of
    :func:`~curvcal.curvature.per_sample.proof_cotangent`, and the sum over the chunk's rows
    must equal autograd's gradient of Σ_n w_nᵀz_n through the model called as it is
    (:func:`~curvcal.curvature.per_sample.differing_gradient`). The first chunk that fails is
    not added, and the rows from it on are left to the caller."""
    x, values, vectors, keep, sums = work.x, work.values, work.vectors, work.keep, work.sums
    frozen = {name: p.detach() for name, p in model.named_parameters()}
    primals = tuple(p.detach() for p in params)
    classes = values.shape[1]
    per_row_bytes = (classes + 1) * sum(p.numel() * p.element_size() for p in params)
    chunk = max(1, VMAP_BYTES // max(per_row_bytes, 1))

    def row_norms(row_x: Inputs, cotangents: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        def logits(selected: tuple[Tensor, ...]) -> Tensor:
            values_ = {**frozen, **dict(zip(names, selected, strict=True))}
            return torch.func.functional_call(model, values_, (as_batch_of_one(row_x),))[0]

        pull = torch.func.vjp(logits, primals)[1]
        grads = torch.func.vmap(pull)(cotangents)[0]  # eigenvectors, then the proof's w_n
        norms = torch.stack(
            [g[:classes].reshape(classes, -1).double().pow(2).sum(1) for g in grads]
        )
        return norms, tuple(g[classes] for g in grads)

    weights = torch.where(keep, values, torch.zeros_like(values))
    magnitude, passes = 0.0, 0
    for start in range(rows.start, rows.stop, chunk):
        part = slice(start, min(start + chunk, rows.stop))
        chunk_x = take_rows(x, part)
        proof = proof_cotangent((part.stop - start, classes), primals[0].device)
        cotangents = torch.cat([vectors[part].transpose(1, 2), proof.unsqueeze(1)], dim=1)
        norms, proved = torch.func.vmap(row_norms)(chunk_x, cotangents.to(primals[0].dtype))
        with torch.enable_grad():
            z = model(chunk_x)
            truth = torch.autograd.grad(z, params, grad_outputs=proof.to(z), allow_unused=True)
        found = [g.detach().sum(0) for g in proved]
        unseen = differing_gradient(names, params, found, truth, ROUNDING_ULPS)
        if unseen:
            return _FuncDone(magnitude, passes, start, unseen)
        norms = norms.detach()  # a use outside the swapped tensors may have carried a graph
        sums.add_(torch.einsum("btc,bc->t", norms, weights[part]))
        magnitude += float(torch.einsum("btc,bc->", norms, weights[part].abs()))
        passes += int(keep[part].sum())
    return _FuncDone(magnitude, passes, rows.stop)


def _unseen_note(engine: str, name: str) -> str:
    """Why ``engine`` was dropped for the autograd loop: it did not see every use of ``name``."""
    return (
        f"{engine} did not see every use of {name} (the summed gradient differs from "
        "autograd's), so one backward per sample and eigenvector of the loss's Hessian took over"
    )


def _func_then_loop(
    model: nn.Module,
    names: tuple[str, ...],
    params: tuple[Tensor, ...],
    work: _Work,
    rows: range,
    choice: EngineChoice,
    done: _FuncDone | None = None,
) -> tuple[float, int]:
    """The rows by :func:`_func_sums` (``done``: its result when already run), and from the
    first chunk it did not see every use on, by :func:`_loop_sums`, which differentiates the
    Parameters themselves; ``choice`` then keeps the loop for good and says why. Returns Σ
    |λ|·‖Jᵀu‖² and the norms taken."""
    done = done or _func_sums(model, names, params, work, rows)
    if done.stop > rows.start:
        choice.ran.add("func")
    if not done.unseen:
        return done.magnitude, done.passes
    choice.engine, choice.func_usable = "loop", False
    choice.fallback = _unseen_note("torch.func", done.unseen)
    rest = _loop_sums(model, params, work, range(done.stop, rows.stop))
    return done.magnitude + rest[0], done.passes + rest[1]


def _hook_sums(
    names: tuple[str, ...], taps: Taps, logits: Tensor, work: _Work
) -> tuple[float, int]:
    """:func:`_loop_sums` for the whole batch from a forward the ``taps`` recorded (``logits``
    its output): per eigenvector index k that some row keeps, one backward of Σ_n u_{n,k}·z_n
    to the layers' outputs (every call of each), every row's norms from the layers' inputs and
    those gradients, each tensor's summed over all its uses before squaring."""
    outputs = taps.flat_outputs()
    index = {name: position for position, name in enumerate(names)}
    indices = torch.nonzero(work.keep.any(0)).flatten().tolist()
    magnitude = work.sums.new_zeros(())
    for position, k in enumerate(indices):
        weights = torch.where(work.keep[:, k], work.values[:, k], 0.0)
        deltas = torch.autograd.grad(
            logits,
            outputs,
            grad_outputs=work.vectors[:, :, k].to(logits),
            retain_graph=position < len(indices) - 1,
            allow_unused=True,
        )
        for selected, norms in parameter_norms(taps, deltas).items():
            work.sums[index[selected]] += (norms * weights).sum()
            magnitude += (norms * weights.abs()).sum()
    return float(magnitude), int(work.keep.sum())


def gauss_newton_sums(
    model: nn.Module,
    loss: Loss,
    names: Sequence[str],
    params: Sequence[Tensor],
    x: Inputs,
    y: Tensor,
    choice: EngineChoice | None = None,
) -> tuple[Tensor, float, int]:
    """Σ over the rows n of one batch of Σ_k λ_{n,k} ‖(J_nᵀ u_{n,k})_t‖², for each tensor t of
    ``params`` (a float64 tensor of shape (len(params),), on the parameters' device); the same
    sum of |λ_{n,k}|·‖J_nᵀ u_{n,k}‖² over all tensors (what rounding is relative to); and the
    count of (row, kept eigenpair) norms, one backward each outside the hooks engine. ``choice``
    picks the engine (:class:`EngineChoice`; ``None``: ``loop``)."""
    names, params = tuple(names), tuple(params)
    choice = choice or EngineChoice(func_usable=False)
    taps = Taps(choice.hooks) if choice.engine == "hooks" and choice.hooks else None
    with taps.recording() if taps else nullcontext(), torch.set_grad_enabled(bool(taps)):
        logits = model(x)  # recorded for the hooks; otherwise only for the eigenpairs
    sums = torch.zeros(len(params), dtype=torch.float64, device=params[0].device)
    work = _Work(x, *_eigenpairs(loss, logits, y), sums)
    if taps is not None:
        unseen = (
            unseen_uses(taps, logits, names, params, ROUNDING_ULPS)
            if taps.complete()
            else "a planned layer did not run"
        )
        if not unseen:
            choice.ran.add("autograd")
            return (sums, *_hook_sums(names, taps, logits, work))
        # a use the hooks did not see: autograd's loop, which sees every use, from now on
        choice.hooks, choice.engine = None, "loop"
        choice.fallback = _unseen_note("the layer hooks", unseen)
    total = n_rows(x)
    magnitude, passes, start = 0.0, 0, 0
    if choice.engine is None:  # decide on this batch's first rows, each engine once warm
        found = _loop_sums(model, params, work, range(0, min(total, 1)))
        began = time.perf_counter()
        more = _loop_sums(model, params, work, range(1, min(total, 2)))
        loop_row = time.perf_counter() - began
        magnitude, passes, start = found[0] + more[0], found[1] + more[1], min(total, 2)
        choice.engine = "loop"
        warm = None
        if loop_row < VMAP_TRY_SECONDS and total > 3:
            try:  # one row, added only once it is whole and proven
                warm = _func_sums(model, names, params, work, range(2, 3))
            except Exception:  # vmap cannot run this model: data-dependent control flow,
                choice.func_usable = False  # an operator without a batching rule
        if warm is not None:
            found = _func_then_loop(model, names, params, work, range(2, 3), choice, warm)
            magnitude, passes, start = magnitude + found[0], passes + found[1], 3
        if warm is not None and choice.func_usable:
            trial = range(3, min(total, 3 + 32))
            began = time.perf_counter()
            timed = _func_then_loop(model, names, params, work, trial, choice)
            func_row = (time.perf_counter() - began) / len(trial)
            magnitude, passes, start = magnitude + timed[0], passes + timed[1], trial.stop
            if choice.func_usable and func_row < loop_row:
                choice.engine = "func"
    rest = range(start, total)
    choice.ran.add("autograd")
    if choice.engine == "func":
        found = _func_then_loop(model, names, params, work, rest, choice)
    else:
        found = _loop_sums(model, params, work, rest)
    return work.sums, magnitude + found[0], passes + found[1]


@dataclass(frozen=True)
class TensorTraces:
    """tr(G_tt) of each selected tensor t (name → value, in selection order; their sum is the
    trace of the whole block), the (sample, kept eigenpair) norms taken, and ``rounding``: the
    allowance for rounding, ``ROUNDING_ULPS`` × ε of the parameters' dtype ×
    (1/N) Σ |λ_{n,k}|·‖J_nᵀu_{n,k}‖²."""

    traces: dict[str, float]
    norms_taken: int
    rounding: float = 0.0
    engine: str = "autograd"
    #: why the per-sample engine changed on the way ('' when it did not)
    note: str = ""
    #: whether every Λ_n is positive semi-definite, so each tr(G_tt) is ≥ 0
    psd: bool = False
    #: the matrix whose trace this is: ``"hessian"`` (the Hessian's, where the logits are linear
    #: in each tensor) or the curvature kind the operator measures (``"ggn"``, ``"fisher"``)
    curvature: str = "hessian"

    @property
    def total(self) -> float:
        """The trace of the selected block."""
        return math.fsum(self.traces.values())


def gauss_newton_problem(operator: GaussNewtonSource) -> str:
    """Why the Gauss–Newton trace of ``operator`` would not be exact ('' when it would be): train
    mode, or a tensor the logits are not shown linear in by :func:`linearity_check` on every
    batch of the data (one pass: a forward whose autograd graph is walked and a backward, then
    one double backward per tensor the graph did not prove), so that no order of the samples
    changes the answer. A tensor is
    nonlinear when any batch shows curvature in it, unreached when no batch's logits depend on
    it. When the data is sharded every process checks its own batches and the flags are summed
    across processes: a failure anywhere is a failure everywhere. A loss whose Hessian in the
    logits is not known in closed form (a user's loss,
    :func:`~curvcal.losses.closed_form_problem`) is refused before any pass."""
    loss_problem = closed_form_problem(operator.loss)
    if loss_problem:
        return loss_problem
    kind = str(getattr(operator, "curvature", "hessian"))
    if kind != "hessian":
        # tr(G) is the GGN's trace on any network, and the Fisher's for cross-entropy
        if kind == "ggn" or (kind == "fisher" and operator.loss.name == "ce"):
            return ""
        return (
            f"it is the trace of the GGN, not of the {kind} of the {operator.loss.name} loss "
            "(for cross-entropy only the Fisher equals the GGN)"
        )
    if operator.mode != "eval":
        return "train mode couples the samples of a batch (BatchNorm's batch statistics)"
    names, params = operator.param_names, operator.parameters
    failures: list[str] = []

    def per_batch(x: Inputs, _y: Tensor) -> Tensor:
        check = linearity_check(operator.model, names, params, x)
        if check.failed is not None:
            failures.append(check.failed)
        flags = [float(name in check.nonlinear) for name in names]
        flags += [float(check.failed is None and name not in check.unreached) for name in names]
        failed = float(check.failed is not None)
        return torch.tensor([*flags, failed], dtype=torch.float64, device=device_of(x))

    totals = operator.sum_over_data(per_batch).cpu()
    count = len(names)
    if float(totals[-1]) > 0:
        why = failures[0] if failures else "in another process"
        return LinearityCheck(names, failed=why).reason()
    nonlinear = tuple(name for name, flag in zip(names, totals[:count], strict=True) if flag > 0)
    unreached = tuple(
        name for name, flag in zip(names, totals[count : 2 * count], strict=True) if flag == 0
    )
    return LinearityCheck(names, nonlinear, unreached).reason()


def linear_claim(operator: GaussNewtonSource) -> str:
    """What :func:`gauss_newton_problem` checked when it found no problem, in a phrase."""
    return (
        f"the logits are linear in each selected tensor (checked on all {operator.n_samples} "
        "samples: structurally on every batch's autograd graph, and numerically, by a zero second "
        "derivative along a random direction, for the tensors a graph did not prove)"
    )


def declined(operator: GaussNewtonSource, probes: int) -> str:
    """Why ``--trace-method auto`` would not take the Gauss–Newton trace of ``operator`` with a
    budget of ``probes`` products ('' when it would): it is not exact here
    (:func:`gauss_newton_problem`), or its C − 1 gradient norms per sample (C classes) exceed
    ``probes``: they cost C − 1 backwards of the data through the layer hooks (one sample a
    pass otherwise), against 2–3 gradients per product for Hutch++."""
    problem = gauss_newton_problem(operator)
    if problem:
        return f"the Gauss–Newton trace is not exact here: {problem}"
    classes = n_classes(operator)
    if classes - 1 > probes:
        return (
            f"the Gauss–Newton trace would take up to {classes - 1} gradient norms per sample, "
            f"more than {setting_name('probes')} {probes}"
        )
    return ""


def n_classes(operator: GaussNewtonSource) -> int:
    """C, the number of logits the model gives (one forward of the first row, no grad)."""
    x, _ = operator.first_batch()
    with operator.prepared(), torch.no_grad():
        return int(operator.model(take_rows(x, slice(0, 1))).shape[-1])


def tensor_traces(operator: GaussNewtonSource, *, on_step: OnStep = None) -> TensorTraces:
    """tr(G_tt) for each selected tensor of ``operator`` over its whole dataset (one pass, summed
    across processes when sharded), without checking linearity: the Gauss–Newton part of each
    diagonal block's trace, which is the block's whole trace where the logits are linear in it.
    Raises :class:`NumericalError` when a value is not finite."""
    model, loss, params = operator.model, operator.loss, operator.parameters
    plan = layer_plan(model, operator.param_names)
    choice = EngineChoice(
        func_usable=not is_torchscript(model), hooks=plan if isinstance(plan, dict) else None
    )

    def per_batch(x: Inputs, y: Tensor) -> Tensor:
        sums, magnitude, passes = gauss_newton_sums(
            model, loss, operator.param_names, params, x, y, choice
        )
        return torch.cat([sums, sums.new_tensor([magnitude, passes])])

    totals = operator.sum_over_data(per_batch, on_batch=on_step)
    traces = (totals[:-2] / operator.n_samples).tolist()
    # half precision: the products' precision floor, not 1024 ε (800 % in bfloat16)
    dtype = params[0].dtype
    share = precision_floor(dtype) if is_half(dtype) else ROUNDING_ULPS * torch.finfo(dtype).eps
    rounding = share * float(totals[-2]) / operator.n_samples
    if not all(math.isfinite(value) for value in traces):
        raise NumericalError(
            "trace",
            f"the Gauss–Newton trace over the {operator.n_samples} samples is not finite",
            _HINT,
        )
    return TensorTraces(
        dict(zip(operator.param_names, traces, strict=True)),
        int(totals[-1]),
        rounding,
        "+".join(sorted(choice.ran)),
        choice.fallback,
        positive_semidefinite(loss),
        str(getattr(operator, "curvature", "hessian")),
    )


def gauss_newton_trace(
    operator: GaussNewtonSource, *, on_step: OnStep = None, checked: bool = False
) -> TraceResult:
    """tr(H) of ``operator`` (a :class:`~curvcal.curvature.operator.HessianOperator` or its
    guard) as the trace of its Gauss–Newton matrix: exact when the logits are linear in each
    selected tensor, which is checked first.

    Raises :class:`~curvcal.errors.SettingsError` naming the reason when that is not shown
    (:func:`gauss_newton_problem`), :class:`NumericalError` when the result is not finite.
    ``n_probes`` of the result counts the norms ‖J_nᵀu_{n,k}‖² taken (one per sample and kept eigenpair of
    Λ_n); ``matvecs`` is 0. ``checked``: the caller has already found no problem (the check is
    not run again)."""
    if not checked:
        require_exact(operator)
    return trace_result(tensor_traces(operator, on_step=on_step))


def require_exact(operator: GaussNewtonSource) -> None:
    """Raises :class:`~curvcal.errors.SettingsError` on ``trace_method`` with
    :func:`gauss_newton_problem`'s reason when the Gauss–Newton trace of ``operator`` would not
    be exact."""
    problem = gauss_newton_problem(operator)
    if problem:
        raise SettingsError(
            "trace_method",
            f"the Gauss–Newton trace is not exact here: {problem}",
            "ask for hutchpp or xtrace instead",
        )


def trace_result(found: TensorTraces, names: Sequence[str] | None = None) -> TraceResult:
    """The trace of the block of the tensors ``names`` (``None``: all of them) from
    :func:`tensor_traces`, as a :class:`TraceResult` of method ``gauss-newton``: exact where the
    logits are linear in those tensors (the caller's check). Its interval is the whole trace's
    rounding allowance (conservative for a block), cut at 0 below for a positive semi-definite
    Λ_n; the interval's text says so, and names the engine's fallback when there was one."""
    chosen = found.traces if names is None else {name: found.traces[name] for name in names}
    estimate = math.fsum(chosen.values())
    low = estimate - found.rounding
    interval = INTERVAL if found.curvature == "hessian" else GGN_INTERVAL
    if found.psd:  # a sum of non-negative terms: the interval does not reach below 0
        low = max(low, 0.0)
        interval += "; Λ_n is positive semi-definite, so the interval starts at 0 at the lowest"
    if found.note:
        interval += f"; {found.note}"
    return TraceResult(
        estimate=estimate,
        standard_error=0.0,
        ci95=(low, estimate + found.rounding),
        n_probes=found.norms_taken,
        matvecs=0,
        method=METHOD,
        distribution="none",
        seed=0,
        rtol=None,
        stopped_by="exact",
        converged=True,
        engine=found.engine,
        interval=interval,
    )
