"""The Hessian of the FLSD-53 loss over a dataset, built from two focal-loss Hessians.

FLSD-53 (Mukhoti et al. 2020) is the focal loss −(1 − p_y)^γ_i log p_y with a per-sample
γ_i = 5 where p_y < 0.2 and 3 otherwise (p = softmax of the logits at the current θ). γ_i is
piecewise constant in θ, so away from the switching set {p_y = 0.2} (measure zero) each
sample's Hessian is that of the focal loss with its γ_i held fixed. Grouping the N samples by
γ_i at the current θ,

    H = (N₅/N)·H_focal,γ=5(group p_y < 0.2) + (N₃/N)·H_focal,γ=3(group p_y ≥ 0.2),

where each H_focal is a :class:`~curvcal.curvature.hvp.HessianOperator` (the mean over its own
group). :class:`FLSD53Hessian` is that weighted sum, an operator like any other (``shape``,
``dtype``, ``device``, ``matmat``), so the eigenvalue and trace algorithms accept it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from curvcal.calibration.focal import FLSD53
from curvcal.curvature.hvp import Batch, BatchSource, HessianOperator
from curvcal.errors import InputError

#: p_y below which FLSD-53 uses γ = 5 (else 3).
FLSD53_THRESHOLD = 0.2
FLSD53_GAMMAS = (5.0, 3.0)


def flsd53_groups(
    model: nn.Module, batches: BatchSource, mode: str = "eval"
) -> tuple[list[Batch], list[Batch]]:
    """The samples with p_y < 0.2 (γ = 5) and the rest (γ = 3), as lists of (x, y) batches.

    ``model`` runs in ``mode`` (``eval`` or ``train``); its modes and buffers are restored.
    """
    if mode not in ("eval", "train"):
        raise InputError("mode", f"unknown mode {mode!r}", "choose 'eval' or 'train'")
    source: Iterable[Batch] = batches() if callable(batches) else batches
    param = next(model.parameters())
    flags = [(module, module.training) for module in model.modules()]
    saved = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    low: list[Batch] = []
    high: list[Batch] = []
    try:
        model.train(mode == "train")
        with torch.no_grad():
            for x, y in source:
                inputs = x.to(param.device)
                if inputs.is_floating_point():
                    inputs = inputs.to(param.dtype)
                log_p = torch.log_softmax(model(inputs), dim=1)
                p_y = log_p.gather(1, y.to(param.device, torch.int64)[:, None])[:, 0].exp()
                switched = (p_y < FLSD53_THRESHOLD).cpu()
                if bool(switched.any()):
                    low.append((x[switched], y[switched]))
                if bool((~switched).any()):
                    high.append((x[~switched], y[~switched]))
    finally:
        for module, flag in flags:
            module.training = flag
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return low, high


class FLSD53Hessian:
    """H of the mean FLSD-53 loss over a dataset: Σ_g (N_g/N)·H_focal,γ_g(group g).

    Keyword arguments (``params``, ``engine``, ``mode``, ``cache``, ``probe_batch``) are passed
    to each group's :class:`HessianOperator`. ``groups`` lists ``(γ, N_g)``; ``n_matvecs``
    counts vectors multiplied by the sum (each costs one product per non-empty group).
    """

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        *,
        params: Sequence[str] | None = None,
        engine: str = "auto",
        mode: str = "eval",
        cache: str = "auto",
        probe_batch: int = 8,
    ) -> None:
        low, high = flsd53_groups(model, batches, mode)
        self.parts: list[tuple[float, HessianOperator]] = []
        for gamma, group in zip(FLSD53_GAMMAS, (low, high), strict=True):
            if group:
                operator = HessianOperator(
                    model,
                    group,
                    criterion="focal",
                    gamma=gamma,
                    params=params,
                    engine=engine,
                    mode=mode,
                    cache=cache,
                    probe_batch=probe_batch,
                )
                self.parts.append((gamma, operator))
        if not self.parts:
            raise InputError("batches", "the dataset is empty")
        self.criterion = FLSD53
        self.n_samples = sum(op.n_samples for _, op in self.parts)
        self.groups = tuple((gamma, op.n_samples) for gamma, op in self.parts)
        self.n_matvecs = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.parts[0][1].shape

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0][1].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0][1].device

    @property
    def engine(self) -> str:
        """The product engine that ran (that of the first group)."""
        return self.parts[0][1].engine

    @property
    def param_names(self) -> tuple[str, ...]:
        return self.parts[0][1].param_names

    def matmat(self, vectors: Tensor) -> Tensor:
        """H·V for V of shape (P, m)."""
        total = sum(
            (op.matmat(vectors) * (op.n_samples / self.n_samples) for _, op in self.parts),
            start=torch.zeros((), dtype=self.dtype, device=self.device),
        )
        self.n_matvecs += int(vectors.shape[1])
        assert isinstance(total, Tensor)
        return total

    def matvec(self, vector: Tensor) -> Tensor:
        """H·v for v of shape (P,)."""
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def mean_loss(self) -> float:
        """(1/N) Σ_i FLSD-53 loss of sample i: the group means weighted by N_g/N."""
        return sum(op.mean_loss() * op.n_samples for _, op in self.parts) / self.n_samples
