"""How a Hessian operator runs, apart from its model, loss and data: the options, checked.

:class:`OperatorOptions` gathers them; :func:`checked_loss`, :func:`check_options` and
:func:`select_parameters` refuse impossible requests (an unknown engine, train mode with
dropout, a pattern that matches no parameter) before any pass over the data, each error naming
the option at fault.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from curvcal.curvature.batches import CACHES
from curvcal.curvature.engines import (
    CURVATURES,
    ENGINES,
    MODES,
    is_torchscript,
    stochastic_layers,
)
from curvcal.curvature.kept import KEEP_GRAPHS
from curvcal.errors import InputError
from curvcal.losses import Loss, closed_form_problem, loss_from_name
from curvcal.settings.sizes import MemoryBudget, parse_memory_budget


@dataclass(frozen=True)
class OperatorOptions:
    """How a :class:`~curvcal.curvature.operator.HessianOperator` runs, apart from its model,
    loss and data.

    ``params`` (``None``: every parameter with ``requires_grad``; else glob patterns),
    ``engine`` (``auto``/``func``/``autograd``), ``mode`` (``eval``/``train``), ``cache``
    (``auto``/``device``/``host``/``none``), ``device``, ``probe_batch`` (an integer ≥ 1 or
    ``"auto"``), ``allow_tf32``, ``memory_budget`` and ``keep_graphs``
    (``auto``/``always``/``never``), as the operator documents them; checked when it is built.
    """

    params: tuple[str, ...] | None = None
    engine: str = "auto"
    mode: str = "eval"
    cache: str = "auto"
    device: torch.device | str | None = None
    probe_batch: int | str = 8
    allow_tf32: bool = False
    memory_budget: str | int | MemoryBudget | None = None
    keep_graphs: str = "auto"
    curvature: str = "hessian"


def check_curvature(curvature: str, loss: Loss, engine: str, mode: str) -> None:
    """Refuse a curvature kind the loss or the options cannot give (each error names its
    option): the GGN and both Fishers need the loss's derivatives in the logits in closed form
    (ce, focal, flsd53: not a user's loss), independent samples (eval mode: train-mode BatchNorm
    couples a batch's rows, so ∂z_n/∂θ is not one sample's), and are made by their own kernel
    (``gauss_newton_product``), not by torch.func's Hessian product."""
    _choice("curvature", curvature, CURVATURES, "curvature")
    if curvature == "hessian":
        return
    problem = closed_form_problem(loss)
    if problem:
        raise InputError(
            "--curvature", f"{curvature} cannot be taken of this loss: {problem}", "use hessian"
        )
    if mode != "eval":
        raise InputError(
            "--curvature",
            f"{curvature} needs per-sample logits, and train mode couples the samples of a batch",
            "use --mode eval",
        )
    if engine == "func":
        raise InputError(
            "--hvp",
            f"func computes Hessian products; {curvature} products have their own kernel",
            "use --hvp auto or autograd",
        )


def checked_loss(criterion: str | Loss, gamma: float) -> Loss:
    """The loss object of ``criterion`` (a name of :mod:`curvcal.losses` with its ``gamma``, or
    a loss object, which carries its own γ: a ``gamma`` beside it is refused)."""
    if isinstance(criterion, str):
        return loss_from_name(criterion, gamma)
    if gamma != 0.0:
        raise InputError(
            "gamma", "is part of the loss object", "leave gamma unset when passing a loss"
        )
    return criterion


def _choice(option: str, value: str, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise InputError(option, f"unknown {what} {value!r}", f"choose one of {', '.join(allowed)}")


def check_options(
    model: nn.Module,
    *,
    engine: str,
    mode: str,
    cache: str,
    probe_batch: int | str,
    memory_budget: str | int | MemoryBudget | None,
    keep_graphs: str,
) -> MemoryBudget | None:
    """Refuse options that cannot run on ``model`` (each error names its option); the memory
    budget parsed (None when not given)."""
    if not isinstance(model, nn.Module):
        raise InputError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
    _choice("engine", engine, ENGINES, "engine")
    if mode not in MODES:
        raise InputError("mode", f"unknown mode {mode!r}", "choose 'eval' or 'train'")
    _choice("keep_graphs", keep_graphs, KEEP_GRAPHS, "choice")
    _choice("cache", cache, CACHES, "cache mode")
    if probe_batch != "auto" and (
        isinstance(probe_batch, bool) or not isinstance(probe_batch, int) or probe_batch < 1
    ):
        raise InputError(
            "probe_batch", f"must be a positive integer or 'auto', got {probe_batch!r}"
        )
    budget = None if memory_budget is None else parse_memory_budget(memory_budget)
    if mode == "train":
        stochastic = stochastic_layers(model)
        if stochastic:
            raise InputError(
                "mode",
                f"train mode with dropout ({', '.join(stochastic)}) makes the loss random, so its Hessian is undefined",
                "use mode='eval'",
            )
    if engine == "func" and is_torchscript(model):
        raise InputError(
            "engine",
            "torch.func cannot trace a TorchScript module",
            "use engine='autograd' (double backward) or 'auto'",
        )
    return budget


def select_parameters(
    model: nn.Module, patterns: Sequence[str] | str | None
) -> tuple[tuple[str, ...], tuple[Tensor, ...]]:
    """The names and tensors of the parameters a Hessian is taken in, in
    ``named_parameters()`` order: every one with ``requires_grad`` (``patterns`` None), or
    those whose names match one of the glob ``patterns`` (each must match at least one). They
    must share one floating dtype."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if patterns is None:
        chosen = trainable
    else:
        if isinstance(patterns, str):
            patterns = [patterns]
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in trainable):
                names = ", ".join(n for n, _ in trainable[:8]) + (
                    ", …" if len(trainable) > 8 else ""
                )
                raise InputError(
                    "params",
                    f"pattern {pattern!r} matches no trainable parameter",
                    f"names are: {names}",
                )
        chosen = [
            (n, p) for n, p in trainable if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)
        ]
    if not chosen:
        raise InputError("model", "has no trainable parameters (requires_grad=True)")
    dtypes = {p.dtype for _, p in chosen}
    if len(dtypes) != 1 or not chosen[0][1].is_floating_point():
        raise InputError(
            "params",
            f"the selected parameters must share one floating dtype, got {sorted(map(str, dtypes))}",
        )
    return tuple(n for n, _ in chosen), tuple(p for _, p in chosen)
