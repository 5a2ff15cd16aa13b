"""Hessian-vector products of a model sharded with FSDP2, by central differences of gradients.

FSDP2 (``fully_shard``) keeps each parameter as a DTensor shard and gathers the whole tensor
only inside a unit's forward; the sharded parameters are not in the autograd graph, so double
backward (``torch.autograd.grad`` with ``create_graph=True``) fails. Double backward with
respect to the *gathered* parameters can be made to work (every unit kept unsharded after its
forward and backward, gradient reduction off), but then every rank holds the whole model during
a product: the memory sharding is meant to save. What FSDP2 does give, sharded, is the gradient
of a backward. So the product is

    H·v ≈ D(ε) = (G(θ + εv) − G(θ − εv)) / (2ε N),   G(θ) = Σ_{i=1..N} ∇_θ ℓ(f_θ(x_i), y_i),

G summed over every rank's samples by FSDP's reduce-scatter (divide factor 1) and gathered per
parameter at the end (:meth:`CentralDifferenceOperator._gradient_difference`).

Step. Taylor's theorem gives D(ε) − H·v = (ε²/6) ∇³L[v, v, ·] + O(ε⁴) (truncation), and each
gradient carries a rounding error of about u·‖G‖/N (u the unit roundoff of the dtype), which
the difference divides by 2ε. With the loss varying on a length scale s = max(1, ‖θ‖) in
parameter space (‖∇³L[v,v]‖ ≈ ‖H v‖·‖v‖²/s², the rounding ≈ u·‖H v‖·s/‖v‖), the error
ε²‖v‖²/(6 s²) + u·s/(ε‖v‖) (relative to ‖H·v‖) is smallest at

    ε = (3u)^{1/3} · max(1, ‖θ‖) / ‖v‖,

a relative step h = (3u)^{1/3} (4.9e-3 in float32, 8.7e-6 in float64) and a relative error of
about h²/6 + u/h (1.0e-5 and 3.8e-11): the floor of the method, :func:`relative_floor`.
:meth:`CentralDifferenceOperator.error_estimate` measures it on one vector: the truncation by
Richardson's rule from D(2ε) − D(ε) = 3·(ε²/6)∇³L[v,v] + O(ε⁴), the rounding from the
gradients' size.

Every rank must run the same number of forwards and backwards (each is a collective): a rank
with fewer batches runs the missing ones on its first batch with a zero loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from curvcal.curvature.batches import AllReduce, BatchSource
from curvcal.curvature.guard import PRODUCT
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.progress import OnStep
from curvcal.errors import NumericalError
from curvcal.losses import Loss
from curvcal.rows import Inputs

#: the engine name the operator records
ENGINE = "central-difference"


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = machine epsilon / 2 of ``dtype``."""
    return float(torch.finfo(dtype).eps) / 2


def relative_step(dtype: torch.dtype) -> float:
    """h = (3u)^{1/3}: the step ε‖v‖ relative to max(1, ‖θ‖) (module docstring)."""
    return (3 * unit_roundoff(dtype)) ** (1 / 3)


def relative_floor(dtype: torch.dtype) -> float:
    """h²/6 + u/h: the relative error of a product at the chosen step, under the module
    docstring's scale model (1.0e-5 in float32, 3.8e-11 in float64)."""
    h = relative_step(dtype)
    return h * h / 6 + unit_roundoff(dtype) / h


@dataclass(frozen=True)
class ProductError:
    """The measured error of one central-difference product (relative to its norm):
    ``truncation`` by Richardson's rule, ``rounding`` from the gradients' size, ``bound`` their
    sum; ``relative_step`` h and ``floor`` (:func:`relative_floor`) for the dtype."""

    relative_step: float
    floor: float
    truncation: float
    rounding: float

    @property
    def bound(self) -> float:
        return self.truncation + self.rounding

    def as_dict(self) -> dict[str, object]:
        return {
            "method": ENGINE,
            "step": "epsilon = (3u)^(1/3) * max(1, |theta|) / |v|",
            "relative_step": self.relative_step,
            "relative_floor": self.floor,
            "truncation_estimate": self.truncation,
            "rounding_estimate": self.rounding,
            "relative_error_bound": self.bound,
        }


class CentralDifferenceOperator(HessianOperator):
    """The Hessian of the mean loss of a model sharded by ``fully_shard``, its products by
    central differences of gradients (module docstring); same interface and counts as
    :class:`HessianOperator`. Products are exact to the error :meth:`error_estimate` measures.

    Every rank holds the whole product (the gradients are gathered). Batches are not kept on
    the device beyond what the cache says, no gradient graph is kept, and the memory plan is
    not measured (a product costs two gradient passes)."""

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        criterion: str | Loss = "ce",
        gamma: float = 0.0,
        params: Sequence[str] | None = None,
        mode: str = "eval",
        cache: str = "auto",
        probe_batch: int = 8,
        all_reduce: AllReduce | None = None,
        allow_tf32: bool = False,
    ) -> None:
        from curvcal.sharding import agreed_count

        super().__init__(
            model,
            batches,
            criterion,
            gamma,
            params=params,
            engine="autograd",
            mode=mode,
            cache=cache,
            probe_batch=probe_batch,
            all_reduce=all_reduce,
            allow_tf32=allow_tf32,
            keep_graphs="never",
        )
        self.requested_engine = ENGINE
        self._func_usable = False
        self._locates = False  # the NaN search runs one batch alone: not on a sharded model
        # forwards and backwards are collectives: each rank runs as many as the busiest one
        self._padding = agreed_count(self._batches.n_batches) - self._batches.n_batches
        squares = sum(
            (_local(p).detach().to(torch.float64).square().sum() for p in self._params),
            start=torch.zeros((), dtype=torch.float64),
        )
        self.parameter_norm = math.sqrt(float(self.sum_across(squares.to(self._device))))

    def _plan_memory(self) -> None:
        """No measured plan: the sharded parameters cannot be differentiated twice."""

    def _engine_for(self, width: int) -> str:
        return ENGINE

    def step(self, vector: Tensor) -> float:
        """ε = (3u)^{1/3} · max(1, ‖θ‖) / ‖v‖ for the vector ``vector`` (module docstring)."""
        norm = float(vector.to(torch.float64).norm())
        return relative_step(self._dtype) * max(1.0, self.parameter_norm) / max(norm, 1e-300)

    def _product(self, block: Tensor, total: Tensor | None = None) -> Tensor:
        """H·``block`` (P, m) as a (P, m) view of ``total`` (m, P): per column, two gradient
        passes and their gathered difference."""
        m = block.shape[1]
        if total is None:
            total = block.new_empty((m, self.shape[0]))
        tangents = self._tangents(block)
        slots = self._slots(total)
        for j in range(m):
            epsilon = self.step(block[:, j])
            difference = self._gradient_difference([t[j] for t in tangents], epsilon)
            for slot, piece in zip(slots, difference, strict=True):
                slot[j].copy_(piece).div_(2 * epsilon)
        self.engine_products[ENGINE] = self.engine_products.get(ENGINE, 0) + m
        return self._finish(total, m)

    def _finish(self, total: Tensor, m: int) -> Tensor:
        """The mean over the samples of ``total`` (m, P), already summed over the ranks by the
        gradients' reduce-scatter; counted and checked for finiteness; shape (P, m)."""
        self._count(matvecs=m, passes=0)
        result = total.div_(self.n_samples).t()
        if not bool(torch.isfinite(result.sum())) and not bool(torch.isfinite(result).all()):
            raise NumericalError(
                "hessian", PRODUCT, "check the model and data for NaN, or use float64"
            )
        return result

    def _gradient_difference(self, tangents: Sequence[Tensor], epsilon: float) -> list[Tensor]:
        """G(θ + εv) − G(θ − εv) per selected parameter (whole, on every rank), G summed over
        every sample of every rank; the parameters are restored bit for bit afterwards."""
        from curvcal.sharding import full_tensor, local_shard, reshard

        reshard(self.model)  # the next forwards gather the written shards
        pieces = [local_shard(t, p) for t, p in zip(tangents, self._params, strict=True)]
        locals_ = [_local(p) for p in self._params]
        saved = [tensor.detach().clone() for tensor in locals_]
        self._clear_gradients()
        try:
            with torch.no_grad():
                for tensor, piece in zip(locals_, pieces, strict=True):
                    tensor.add_(piece, alpha=epsilon)
            self._gradient_pass(1.0)
            with torch.no_grad():
                for tensor, value, piece in zip(locals_, saved, pieces, strict=True):
                    tensor.copy_(value).add_(piece, alpha=-epsilon)
            reshard(self.model)
            self._gradient_pass(-1.0)
        finally:
            with torch.no_grad():
                for tensor, value in zip(locals_, saved, strict=True):
                    tensor.copy_(value)
            reshard(self.model)
        difference = [
            torch.zeros(p.shape, dtype=self._dtype, device=self._device)
            if p.grad is None
            else full_tensor(p.grad).to(self._device)
            for p in self._params
        ]
        self._clear_gradients()
        return difference

    def _gradient_pass(self, sign: float) -> None:
        """``sign`` × the gradient of the summed loss over this rank's batches, accumulated
        into the parameters' (sharded, summed over ranks) ``.grad``; zero-loss passes on the
        first batch make up for the batches this rank lacks."""
        self._count(matvecs=0, passes=1)
        with self._prepared_model(), torch.enable_grad():
            for x, y in self._batches:
                (self.loss.sum(self.model(x), y) * sign).backward()
            if self._padding:
                x, y = self._batches.first()
                for _ in range(self._padding):
                    (self.loss.sum(self.model(x), y) * 0.0).backward()

    def _clear_gradients(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def sum_over_data(
        self, per_batch: Callable[[Inputs, Tensor], Tensor], *, on_batch: OnStep = None
    ) -> Tensor:
        """As :meth:`HessianOperator.sum_over_data`, with the forwards this rank owes the others
        run on its first batch (their values dropped)."""
        from curvcal.sharding import pad_forwards

        total = super().sum_over_data(per_batch, on_batch=on_batch)
        if self._padding:
            x, y = self._batches.first()
            with self._prepared_model():
                pad_forwards(lambda: per_batch(x, y), self._padding)
        return total

    def error_estimate(self, seed: int = 0) -> ProductError:
        """The error of one product on a Gaussian vector (seeded by ``seed``): truncation
        ‖D(2ε) − D(ε)‖/3 (Richardson) and rounding u·(‖G(θ+εv)‖ + ‖G(θ−εv)‖)·√B/(2ε), B the
        batches summed, each relative to ‖D(ε)‖. Four gradient passes."""
        generator = torch.Generator().manual_seed(seed)
        vector = torch.randn(self.shape[0], generator=generator, dtype=torch.float64)
        vector = vector.to(device=self._device, dtype=self._dtype)
        epsilon = self.step(vector)
        tangents = self._tangents(vector.reshape(-1, 1))
        single = [t[0] for t in tangents]
        near = torch.cat([d.reshape(-1) for d in self._gradient_difference(single, epsilon)])
        far = torch.cat([d.reshape(-1) for d in self._gradient_difference(single, 2 * epsilon)])
        product = near.to(torch.float64) / (2 * epsilon)
        wide = far.to(torch.float64) / (4 * epsilon)
        norm = max(float(product.norm()), 1e-300)
        truncation = float((wide - product).norm()) / 3 / norm
        gradient = self._gradient_norm()
        batches = self._batches.n_batches + self._padding
        rounding = (
            unit_roundoff(self._dtype) * 2 * gradient * math.sqrt(batches) / (2 * epsilon) / norm
        )
        return ProductError(
            relative_step(self._dtype), relative_floor(self._dtype), truncation, rounding
        )

    def _gradient_norm(self) -> float:
        """‖G(θ)‖, the summed gradient over every sample."""
        from curvcal.sharding import full_tensor

        self._clear_gradients()
        self._gradient_pass(1.0)
        squares = sum(
            (
                float(full_tensor(p.grad).to(torch.float64).square().sum())
                for p in self._params
                if p.grad is not None
            ),
            start=0.0,
        )
        self._clear_gradients()
        return math.sqrt(squares)


def _local(parameter: Tensor) -> Tensor:
    from curvcal.sharding import local_tensor

    return local_tensor(parameter)


def build_sharded_operator(
    model: nn.Module,
    loss: Loss,
    batches: BatchSource,
    *,
    params: Sequence[str] | None,
    mode: str,
    cache: str,
    probe_batch: int,
    all_reduce: AllReduce | None,
    allow_tf32: bool = False,
) -> CentralDifferenceOperator:
    """The :class:`CentralDifferenceOperator` of ``model`` (sharded) over ``batches``."""
    return CentralDifferenceOperator(
        model,
        batches,
        loss,
        params=params,
        mode=mode,
        cache=cache,
        probe_batch=probe_batch,
        all_reduce=all_reduce,
        allow_tf32=allow_tf32,
    )


__all__ = [
    "ENGINE",
    "CentralDifferenceOperator",
    "ProductError",
    "build_sharded_operator",
    "relative_floor",
    "relative_step",
    "unit_roundoff",
]
