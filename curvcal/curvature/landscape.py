"""The loss landscape: loss, accuracy and ECE of a model moved along one or two directions.

For parameters θ (the model's ``requires_grad`` tensors, by name), directions d₁ (and d₂) of the
same shapes and a grid of steps α (and β), each point is the model at θ + α d₁ (+ β d₂) measured
on the whole dataset:

    loss(α, β) = (1/N) Σ_i ℓ(f(x_i; θ + α d₁ + β d₂), y_i)   (the loss object's per-sample ℓ),
    accuracy   = fraction of rows whose argmax (first index on ties) is the label,
    ECE        = the ``ece(logits, labels)`` the caller passes (the pipeline passes top-label
                 ECE with equal-width bins, :func:`curvcal.calibration.metrics`; the
                 curvature kernels import nothing of calibration).

Directions are either top Hessian eigenvectors (unit vectors over all selected parameters, so
the second difference of the loss along one is its eigenvalue, exactly for a quadratic loss) or
random *filter-normalised* directions (Li et al. 2018, "Visualizing the Loss Landscape of
Neural Nets", as PyHessian draws them): a Gaussian draw d, rescaled filter by filter (a filter
is one slice along a tensor's first dimension) to the norm of the weights it perturbs,
d_f ← d_f ‖θ_f‖ / ‖d_f‖; one-dimensional tensors (biases, normalisation scales) get d = 0, as
in the paper, so a step never moves them.

The caller's model is never left changed: its parameters are copied before the first step and
written back afterwards (also on error), and its train/eval mode is restored. Pure otherwise:
no file I/O, no printing; random draws only from the generator passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.errors import InputError
from curvcal.rows import to_device

#: A direction: one tensor per parameter name, each of that parameter's shape.
Direction = Mapping[str, Tensor]


@dataclass(frozen=True)
class LandscapePoint:
    """One grid point: the steps (``beta`` is ``None`` on a 1-D line) and what was measured."""

    alpha: float
    beta: float | None
    loss: float
    accuracy: float
    ece: float


@dataclass(frozen=True)
class Landscape:
    """Every grid point, α varying fastest within each β (``betas`` empty on a 1-D line);
    ``directions`` says what the directions were (``eigenvector`` or ``random``)."""

    alphas: tuple[float, ...]
    betas: tuple[float, ...]
    points: tuple[LandscapePoint, ...]
    directions: str
    n_samples: int

    def grid(self, name: str) -> list[list[float]]:
        """``name`` (loss, accuracy, ece) as rows over β of values over α (one row in 1-D)."""
        values = [getattr(point, name) for point in self.points]
        width = len(self.alphas)
        return [values[row : row + width] for row in range(0, len(values), width)]


@dataclass(frozen=True)
class LandscapeAnalysis:
    """The grid measured (``landscape``), the loss it measured, how many parameter values the
    directions move, and, for eigenvector directions, their eigenvalues (largest first)."""

    landscape: Landscape
    loss: str
    n_parameters: int
    eigenvalues: tuple[float, ...] | None


def selected_parameters(model: nn.Module) -> dict[str, Tensor]:
    """The parameters a landscape moves: every ``requires_grad`` one, by name."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def filter_normalised_direction(model: nn.Module, generator: torch.Generator) -> dict[str, Tensor]:
    """A random direction normalised filter by filter to the model's weights (Li et al. 2018):
    for each tensor of two or more dimensions, d ~ N(0, I) drawn on the CPU from ``generator``
    and each slice along the first dimension scaled to ‖θ_f‖/‖d_f‖; one-dimensional tensors get
    zeros. Same dtype and device as the parameters."""
    direction: dict[str, Tensor] = {}
    for name, p in selected_parameters(model).items():
        if p.ndim <= 1:
            direction[name] = torch.zeros_like(p)
            continue
        draw = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        weights = p.detach().to(device="cpu", dtype=torch.float64)
        flat_draw, flat_weights = draw.reshape(p.shape[0], -1), weights.reshape(p.shape[0], -1)
        scale = flat_weights.norm(dim=1) / flat_draw.norm(dim=1).clamp_min(1e-300)
        direction[name] = (flat_draw * scale[:, None]).reshape(p.shape).to(p.device, p.dtype)
    return direction


def _moved_parameters(model: nn.Module, directions: Sequence[Direction]) -> dict[str, Tensor]:
    """The parameters the directions move (the names of the first; every direction must name
    the same ones, each a ``requires_grad`` parameter, with its shape)."""
    params = selected_parameters(model)
    names = list(directions[0])
    for index, direction in enumerate(directions):
        which = f"direction {index + 1}"
        unknown = sorted(set(direction) - set(params))
        if unknown or set(direction) != set(names) or not names:
            raise InputError(
                which,
                "must name the same trainable parameters as direction 1"
                + (f" (not parameters of the model: {unknown[:3]})" if unknown else ""),
            )
        for name in names:
            if tuple(direction[name].shape) != tuple(params[name].shape):
                raise InputError(
                    which,
                    f"{name} has shape {tuple(direction[name].shape)}, the parameter "
                    f"{tuple(params[name].shape)}",
                )
    return {name: params[name] for name in names}


def loss_landscape(
    model: nn.Module,
    batches: Callable[[], Iterable[tuple[Any, Tensor]]],
    loss_sum: Callable[[Tensor, Tensor], Tensor],
    directions: Sequence[Direction],
    alphas: Sequence[float],
    betas: Sequence[float] = (),
    *,
    ece: Callable[[Tensor, Tensor], float],
    kind: str = "random",
    on_point: Callable[[int], None] | None = None,
) -> Landscape:
    """Measure ``model`` at θ + α d₁ (+ β d₂) for every α in ``alphas`` (and β in ``betas``).

    ``batches()`` gives a fresh iterator of ``(x, y)`` (``x`` a tensor, or a mapping of keyword
    tensors); ``loss_sum(logits, labels)`` is the loss summed over a batch; ``ece(logits,
    labels)`` the calibration error of all rows' float64 logits (on the CPU); ``on_point(1)``
    hears each point as it is measured. One direction with
    no ``betas`` draws a 1-D line, two with ``betas`` a 2-D grid. The model runs in the mode it
    is in (eval for BatchNorm's running statistics) under ``torch.no_grad``; its parameters and
    mode are as before on return. The directions may cover some of the parameters (those the
    Hessian was restricted to); the others stay where they are.
    """
    if len(directions) not in (1, 2) or (len(directions) == 2) != bool(betas):
        raise InputError("directions", "give one direction and no betas, or two and betas")
    if not alphas:
        raise InputError("alphas", "give at least one step")
    params = _moved_parameters(model, directions)
    saved = {name: p.detach().clone() for name, p in params.items()}
    training = model.training
    points: list[LandscapePoint] = []
    n_samples = 0
    try:
        with torch.no_grad():
            for beta in betas or (None,):
                for alpha in alphas:
                    for name, p in params.items():
                        moved = saved[name] + float(alpha) * directions[0][name]
                        if beta is not None:
                            moved = moved + float(beta) * directions[1][name]
                        p.copy_(moved)
                    logits, labels, total = _measure(model, batches, loss_sum, saved)
                    n_samples = int(labels.shape[0])
                    # far out, the moved model may overflow: its point is not finite, not an error
                    finite = bool(torch.isfinite(logits).all())
                    points.append(
                        LandscapePoint(
                            alpha=float(alpha),
                            beta=None if beta is None else float(beta),
                            loss=total / n_samples,
                            accuracy=float((logits.argmax(dim=1) == labels).double().mean())
                            if finite
                            else math.nan,
                            ece=float(ece(logits, labels)) if finite else math.nan,
                        )
                    )
                    if on_point is not None:
                        on_point(1)
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])
        model.train(training)
    return Landscape(
        alphas=tuple(float(a) for a in alphas),
        betas=tuple(float(b) for b in betas),
        points=tuple(points),
        directions=kind,
        n_samples=n_samples,
    )


def _measure(
    model: nn.Module,
    batches: Callable[[], Iterable[tuple[Any, Tensor]]],
    loss_sum: Callable[[Tensor, Tensor], Tensor],
    like: Mapping[str, Tensor],
) -> tuple[Tensor, Tensor, float]:
    """Logits and labels of every row (on the CPU, float64) and the summed loss; the inputs
    moved to the device of the parameters and, when floating, to their dtype."""
    first = next(iter(like.values()))
    all_logits: list[Tensor] = []
    all_labels: list[Tensor] = []
    total = 0.0
    for inputs, labels in batches():
        x = to_device(inputs, first.device, first.dtype)
        y = labels.to(first.device)
        logits = model(**x) if isinstance(x, Mapping) else model(x)
        total += float(loss_sum(logits, y))
        all_logits.append(logits.detach().to("cpu", torch.float64))
        all_labels.append(y.detach().to("cpu"))
    if not all_labels:
        raise InputError("data", "has no rows to measure the landscape on")
    return torch.cat(all_logits), torch.cat(all_labels), total


def second_difference(losses: Sequence[float], step: float) -> list[float]:
    """(ℓ(α − h) − 2ℓ(α) + ℓ(α + h))/h² at every interior point of an evenly spaced line: the
    curvature along the direction (for a unit eigenvector of a quadratic loss, its
    eigenvalue)."""
    return [
        (losses[i - 1] - 2.0 * losses[i] + losses[i + 1]) / step**2
        for i in range(1, len(losses) - 1)
    ]
