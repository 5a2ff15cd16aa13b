"""Hessian-vector products of a model sharded with FSDP2, by central differences of gradients.

FSDP2 (``fully_shard``) keeps each parameter as a DTensor shard and gathers the whole tensor
only inside a unit's forward; the sharded parameters are not in the autograd graph, so double
backward (``torch.autograd.grad`` with ``create_graph=True``) fails. Double backward with
respect to the *gathered* parameters can be made to work (every unit kept unsharded after its
forward and backward, gradient reduction off), but then every rank holds the whole model during
a product: the memory sharding is meant to save. What FSDP2 does give, sharded, is the gradient
of a backward, G(θ) = Σ_{i=1..N} ∇_θ ℓ(f_θ(x_i), y_i), summed over every rank's samples by
FSDP's reduce-scatter (divide factor 1). So the product is a central difference of G along v:

* three points (order 2): D₃(ε) = (G(θ + εv) − G(θ − εv)) / (2εN), two gradient passes;
  D₃(ε) − H·v = (ε²/6)∇⁴L[v, v, v, ·] + O(ε⁴);
* five points (order 4, Richardson's extrapolation of D₃ from ε and 2ε):
  D₅(ε) = (8(G(θ + εv) − G(θ − εv)) − (G(θ + 2εv) − G(θ − 2εv))) / (12εN) = (4D₃(ε) − D₃(2ε))/3,
  four gradient passes; D₅(ε) − H·v = O(ε⁴).

Each product takes the rule and the step :mod:`curvcal.curvature.step_control` sets, in every
dtype: three points where their predicted error (the truncation from the derivatives measured
along v by the same two passes, the rounding measured once at the start) is within the stated
bound, Richardson's five points only where it is not. The bound: b'·‖H‖‖v‖ while the
eigenvalues are computed (:func:`eigenvalue_products`; b' = ``product_error`` =
max(b, tol/10)), b·‖H v‖ for every other product (a trace's probe; b = ``own_error``, twice
:func:`relative_floor`). Before, float64
took three points at ε = (3u)^{1/3}·max(1, ‖θ‖)/‖v‖ always (its error along the top eigenvector
of a small transformer was 687× the b it stated) and float32 five points always (4 gradient
passes, 6 along a sharply curved direction). Measured against exact double backward
(``benchmarks/bench_central_steps.py``) on a GELU transformer with LayerNorm, a tanh and a
softplus MLP, in float32 and float64: every product of a Lanczos run within b'·‖H‖‖v‖ at 2.2 to
3.1 gradient passes a product (the start included), and every one of 180 Gaussian products
within b·‖Hv‖ (the worst 0.49) at 4.07 to 4.27, their five points at their own step with
their error predicted as taken (179 of 180, the other 1.02×, at 4 when at the default step).

The relative step h = (3u)^{1/3} and the floors of :func:`relative_floor` (h²/6 + u/h for three
points, 2.4e-11 in float64; h⁴/30 + (3/2)u/h for five, 1.6e-5 in float32) are the precision
floors the eigenvalue and trace rules are judged against, and b is twice the floor.
:meth:`CentralDifferenceOperator.error_estimate` measures the error of one product as the
operator takes it: the truncation by Richardson's rule, ‖D(2ε) − D(ε)‖/(2^p − 1) for a rule of
order p, and the rounding from the gradient's size.

The loss must be smooth along ±2εv: a ReLU kink crossed by the step adds a gradient jump
divided by ε (a large truncation estimate says so).

Every rank must run the same number of forwards and backwards (each is a collective): a rank
with fewer batches runs the missing ones on its first batch with a zero loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.curvature.batches import AllReduce, BatchSource
from curvcal.curvature.guard import PRODUCT
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.step_control import Judgement, StepControl
from curvcal.curvature.vectors import SlicedSpace, VectorSpace
from curvcal.errors import NumericalError, SettingsError
from curvcal.losses import Loss
from curvcal.rows import Inputs
from curvcal.seeds import seeded_generator
from curvcal.settings.hessian import HessianSettings

#: the engine name the operator records
ENGINE = "central-difference"


@dataclass(frozen=True)
class Stencil:
    """A central-difference rule: Σ_k w_k G(θ + c_k εv) / (``denominator`` ε) = H·v + O(ε^order),
    ``points`` the pairs (c_k, w_k)."""

    name: str
    points: tuple[tuple[float, float], ...]
    denominator: float
    order: int


THREE_POINT = Stencil("3-point", ((1.0, 1.0), (-1.0, -1.0)), 2.0, 2)
FIVE_POINT = Stencil("5-point", ((1.0, 8.0), (-1.0, -8.0), (2.0, -1.0), (-2.0, 1.0)), 12.0, 4)
#: the five-point rule's pairs: its sum is 8 × INNER's + OUTER's
INNER = ((1.0, 1.0), (-1.0, -1.0))
OUTER = ((2.0, -1.0), (-2.0, 1.0))
#: the share of the eigenvalues' tolerance their products may spend (``product_error``)
TOL_SHARE = 0.1
#: what to do about a non-finite vector (the eigenvalue and trace rules never make one)
VECTOR_HINT = "check the vectors passed to the operator"
#: the first product measures the rounding at its step over this
ROUNDING_PROBE = 64.0


def stencil_for(dtype: torch.dtype) -> Stencil:
    """Three points in float64 (its truncation is far below 1e-7), five in narrower dtypes."""
    return THREE_POINT if unit_roundoff(dtype) <= 2.0**-53 else FIVE_POINT


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = machine epsilon / 2 of ``dtype``."""
    return float(torch.finfo(dtype).eps) / 2


def relative_step(dtype: torch.dtype) -> float:
    """h = (3u)^{1/3}: the step ε‖v‖ relative to max(1, ‖θ‖) (module docstring)."""
    return (3 * unit_roundoff(dtype)) ** (1 / 3)


def relative_floor(dtype: torch.dtype) -> float:
    """The relative error of a product at the chosen step under the module docstring's scale
    model: h²/6 + u/h for three points (2.4e-11 in float64), h⁴/30 + (3/2)u/h for five
    (1.6e-5 in float32)."""
    h, u = relative_step(dtype), unit_roundoff(dtype)
    if stencil_for(dtype) is THREE_POINT:
        return h * h / 6 + u / h
    return h**4 / 30 + 1.5 * u / h


def sixteen_bit_floor(dtype: torch.dtype) -> tuple[float, float]:
    """(h, error): the best relative step of the five-point rule for a model whose weights and
    gradients are rounded to ``dtype`` (unit roundoff u), and the product's relative error there.

    The perturbed weights θ + cεv are rounded to the weights' grid (the step from a float32
    master copy can be no finer than the 16-bit resolution of the weights, about u·|θ_i| per
    entry) and each gradient carries u·‖G‖: both divided by the step, about 3u/h relative,
    against the truncation h⁴/30. The sum is least at h = (22.5u)^{1/5}: h = 0.61 and 2.4%
    in bfloat16, h = 0.41 and 0.45% in float16 (float32: 1.6e-5 at h = 5.6e-3). A step of
    0.61 of the weights' scale is outside the smooth-loss model the step rests on: along a
    sharply curved direction (ℓ = 0.27 against a scale of 9.6 on the test transformer) the
    truncation is far larger, and the shorter step that fixes it in float32 multiplies the
    rounding by s/ℓ (35× there)."""
    u = unit_roundoff(dtype)
    h = (22.5 * u) ** 0.2
    return h, h**4 / 30 + 3 * u / h


@dataclass(frozen=True)
class ProductError:
    """The measured error of one central-difference product (relative to its norm):
    ``truncation`` by Richardson's rule, ``rounding`` from the gradients' size, ``bound`` their
    sum; ``relative_step`` h and ``floor`` (:func:`relative_floor`) for the dtype; the rule
    taken (``stencil``, ``passes``: its gradient passes), the absolute step ``step_length`` =
    ε‖v‖ and, for a three-point product, the bound the rule ``predicted`` before taking it."""

    relative_step: float
    floor: float
    truncation: float
    rounding: float
    stencil: str = THREE_POINT.name
    passes: int = 2
    step_length: float | None = None
    predicted: float | None = None

    @property
    def bound(self) -> float:
        return self.truncation + self.rounding

    def as_dict(self) -> dict[str, object]:
        return {
            "method": ENGINE,
            "stencil": self.stencil,
            "step": (
                "epsilon = delta / |v|, delta = (R / (2 K))^(1/3): R the measured rounding, K "
                "the largest truncation coefficient measured so far; three points (2 gradient "
                "passes) where their predicted error is within the stated bound, else "
                "Richardson's five (4); outside the eigenvalues at their own step, the least "
                "of a delta^4 + 1.5 R / delta"
            ),
            "relative_step": self.relative_step,
            "relative_floor": self.floor,
            **self.errors(),
        }

    def errors(self) -> dict[str, object]:
        """The rule taken along the vector and its measured errors (for a second vector's
        estimate)."""
        return {
            "stencil": self.stencil,
            "gradient_passes": self.passes,
            "step_length": self.step_length,
            "truncation_estimate": self.truncation,
            "rounding_estimate": self.rounding,
            "relative_error_bound": self.bound,
            "predicted_bound": self.predicted,
        }


@dataclass(frozen=True)
class Taken:
    """A product's rule as taken: the ``stencil``, the step ``epsilon``, the weighted
    gradient sum Σ_k w_k G(θ + c_k εv) (per parameter piece), the gradient ``passes`` it took
    and the ``rule``'s name when not the stencil's."""

    stencil: Stencil
    epsilon: float
    weighted: list[Tensor]
    passes: int
    rule: str = ""

    @property
    def name(self) -> str:
        return self.rule or self.stencil.name


class CentralDifferenceOperator(HessianOperator):
    """The Hessian of the mean loss of a model sharded by ``fully_shard``, its products by
    central differences of gradients (module docstring); same interface and counts as
    :class:`HessianOperator`. Products are exact to the error :meth:`error_estimate` measures.

    ``vectors``: ``"sliced"`` (the default) — the vectors multiplied and the products are this
    rank's local slices (:attr:`vector_space`, a
    :class:`~curvcal.curvature.vectors.SlicedSpace`: each selected parameter's local shard,
    flattened, in order), the product the local shard of the reduce-scattered gradient
    difference, so no rank ever holds a P-long vector; ``"whole"`` — whole P-long vectors on
    every rank, the product's gradients all-gathered. Parameters not sharded along dimension 0
    fall back to whole vectors. Batches are not kept on the device beyond what the cache says,
    no gradient graph is kept, and the memory plan is not measured (a product costs two to six
    gradient passes)."""

    differentiates_gradients = True

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        loss: str | Loss | None = None,
        settings: HessianSettings | None = None,
        *,
        vectors: str = "sliced",
        **keywords: Any,
    ) -> None:
        from curvcal.sharding import agreed_count, reshard

        # FSDP2 leaves the root unit gathered after a no-grad forward (the check that the model
        # takes the data): its registered parameters are then the gathered tensors, whose
        # storage is freed at the next reshard. Select the sharded ones.
        reshard(model)
        super().__init__(model, batches, loss, settings, **keywords)
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
        #: where the vectors multiplied live: this rank's slices (None: whole vectors)
        self.vector_space = self._sliced_space() if vectors == "sliced" else None
        #: the per-product rule's state (:mod:`curvcal.curvature.step_control`)
        self.control = StepControl(
            bound=self.own_error,
            norm_bound=self.product_error,
            default_step=relative_step(self._dtype) * max(1.0, self.parameter_norm),
        )
        #: the products taken by each rule, G(θ) (taken once, float32) and the last judgement
        self.rule_counts: dict[str, int] = {}
        self.product_passes = 0
        self.start_passes = 0
        self._base: list[Tensor] | None = None
        self.last_judgement: Judgement | None = None
        #: the last five-point product's predicted error per unit ‖v‖ (as taken)
        self.last_five_point_bound: float | None = None

    def _runnable(self, settings: HessianSettings, measure_width: bool) -> HessianSettings:
        """The settings as central differences run them: refused where they need double
        backward or torch.func (:func:`refuse_unsharded_settings`), products by gradients
        (``autograd``) and no graph kept."""
        refuse_unsharded_settings(settings, measure_width)
        return settings.replace(hvp="autograd", keep_graphs="never")

    def _sliced_space(self) -> SlicedSpace | None:
        """The space of this rank's slices of the selected parameters, or None when one of them
        is not sharded along dimension 0 (or no sum across ranks is given)."""
        from curvcal.sharding import collect_rows, gather_slices, local_range

        ranges = [local_range(p) for p in self._params]
        pieces = [r for r in ranges if r is not None]
        if len(pieces) != len(ranges) or self._all_reduce is None:
            return None
        params = list(self._params)
        return SlicedSpace(
            pieces, self._all_reduce, lambda block: gather_slices(block, params), collect_rows
        )

    def _vector_length(self) -> int:
        return self.shape[0] if self.vector_space is None else self.vector_space.size

    def _norm(self, vector: Tensor) -> float:
        """‖v‖ in float64 (summed over the ranks' slices when sliced)."""
        wide = vector.to(torch.float64)
        return float(wide.norm() if self.vector_space is None else self.vector_space.norm(wide))

    def _tangents(self, block: Tensor) -> tuple[Tensor, ...]:
        """As :meth:`HessianOperator._tangents`; sliced, the pieces have the local shards'
        shapes."""
        if self.vector_space is None:
            return super()._tangents(block)
        m = block.shape[1]
        block = block.to(self._model_dtype)
        shapes = [_local(p).shape for p in self._params]
        sizes = [_local(p).numel() for p in self._params]
        return tuple(
            piece.reshape(m, *shape)
            for piece, shape in zip(block.t().split(sizes, dim=1), shapes, strict=True)
        )

    def _slots(self, total: Tensor) -> list[Tensor]:
        """As :meth:`HessianOperator._slots`; sliced, views of the local shards' shapes."""
        if self.vector_space is None:
            return super()._slots(total)
        m = total.shape[0]
        shapes = [_local(p).shape for p in self._params]
        sizes = [_local(p).numel() for p in self._params]
        return [
            piece.view(m, *shape)
            for piece, shape in zip(total.split(sizes, dim=1), shapes, strict=True)
        ]

    @property
    def precision_floor(self) -> float:
        """The relative accuracy of one product: the stated floor of the rule at its step,
        :func:`relative_floor` (1.6e-5 in float32, 2.4e-11 in float64; a 16-bit model's own
        floor when that is larger). The eigenvalue and trace stopping rules never ask for less,
        as for a model in half precision."""
        return max(relative_floor(self._dtype), super().precision_floor)

    @property
    def product_error(self) -> float:
        """b' in ‖computed H·v − H·v‖ ≤ b'·‖H‖·‖v‖, what the eigenvalue rules allow for
        (:mod:`curvcal.curvature.eigen`) and what each product of the eigenvalue stage keeps
        within (:mod:`curvcal.curvature.step_control`): max(b, tol/10), b twice
        :func:`relative_floor` (each other product keeps within b·‖H·v‖) and tol the
        eigenvalues' tolerance in the operator's settings."""
        return max(self.own_error, self.settings.tol * TOL_SHARE)

    @property
    def own_error(self) -> float:
        """b in ‖computed H·v − H·v‖ ≤ b·‖H·v‖ outside the eigenvalue stage: twice
        :func:`relative_floor` (3.2e-5 in float32, 4.8e-11 in float64)."""
        return 2 * relative_floor(self._dtype)

    def _plan_memory(self) -> None:
        """No measured plan: the sharded parameters cannot be differentiated twice."""

    def _engine_for(self, width: int) -> str:
        return ENGINE

    def _product(self, block: Tensor, total: Tensor | None = None) -> Tensor:
        """H·``block`` (P, m) as a (P, m) view of ``total`` (m, P): per column, the gradient
        passes of the rule :meth:`_adaptive` takes and their gathered weighted sum."""
        m = block.shape[1]
        if total is None:
            total = block.new_empty((m, self._vector_length()))
        tangents = self._tangents(block)
        slots = self._slots(total)
        for j in range(m):
            taken = self._adaptive(block[:, j], [t[j] for t in tangents])
            self._record(taken)
            for slot, piece in zip(slots, taken.weighted, strict=True):
                slot[j].copy_(piece).div_(taken.stencil.denominator * taken.epsilon)
        self.engine_products[ENGINE] = self.engine_products.get(ENGINE, 0) + m
        return self._finish(total, m)

    @contextmanager
    def errors_relative_to_norm(self) -> Iterator[None]:
        """Within: each product's error is judged against b·‖H‖‖v‖ (the bound the eigenvalue
        rules allow for: more three-point products) instead of b·‖H v‖ (a trace's need)."""
        before = self.control.relative_to_norm
        self.control.relative_to_norm = True
        try:
            yield
        finally:
            self.control.relative_to_norm = before

    def _record(self, taken: Taken) -> None:
        self.rule_counts[taken.name] = self.rule_counts.get(taken.name, 0) + 1
        self.product_passes += taken.passes

    @property
    def passes_per_product(self) -> float:
        """The mean gradient passes of the products taken so far (2 a three-point product, 4 a
        retaken or five-point one, 6 a five-point one at a retaken step; the passes taken once
        at the start are not counted: :attr:`start_passes`); 0 before any."""
        products = sum(self.rule_counts.values())
        return self.product_passes / products if products else 0.0

    def rules_taken(self) -> dict[str, object]:
        """What the products cost: per rule the products taken, the mean gradient passes of a
        product and the passes taken once at the start (G(θ) and the rounding probe); and the
        five-point products outside the eigenvalue stage whose predicted error was over
        b·‖H v‖ even at their best step, with the largest predicted / allowed among them
        (their bound is the prediction: :mod:`curvcal.curvature.step_control`)."""
        return {
            "products_by_rule": dict(self.rule_counts),
            "passes_per_product": self.passes_per_product,
            "start_passes": self.start_passes,
            "products_over_bound": self.control.over_bound,
            "worst_predicted_over_bound": self.control.worst_over_bound,
        }

    def _base_gradient(self) -> list[Tensor]:
        """G(θ), the summed gradient at the parameters (one gradient pass, the first time; as
        the products' pieces are held), and R = u·‖G(θ)‖·√B / N set in :attr:`control`."""
        if self._base is None:
            # the tangents _points_sum takes: this rank's slice, or each parameter whole
            zeros = [
                torch.zeros_like(_local(p))
                if self.vector_space is not None
                else torch.zeros(p.shape, dtype=p.dtype, device=_local(p).device)
                for p in self._params
            ]
            self._base = self._points_sum(zeros, 0.0, ((0.0, 1.0),))
            self.start_passes += 1
            (norm,) = self._norms(self._base)
            batches = self._batches.n_batches + self._padding
            self.control.rounding_unit = (
                unit_roundoff(self._dtype) * norm * math.sqrt(batches) / self.n_samples
            )
        return self._base

    def _norms(self, *pieces: Iterable[Tensor]) -> list[float]:
        """‖·‖ of each sequence of per-parameter pieces (taken one at a time: a generator
        makes one piece at a time), in float64, summed over the ranks' slices when sliced:
        every rank gets the same figures, so takes the same rule."""
        sums = torch.zeros(len(pieces), dtype=torch.float64, device=self._device)
        for index, listed in enumerate(pieces):
            for piece in listed:
                sums[index] += piece.to(device=sums.device, dtype=torch.float64).square().sum()
        if self.vector_space is not None:
            sums = self.vector_space.reduce(sums)
        return [math.sqrt(float(x)) for x in sums]

    def _pair(
        self, tangents: Sequence[Tensor], epsilon: float
    ) -> tuple[list[Tensor], float, float]:
        """G(θ + εv) − G(θ − εv) (per parameter piece), ‖D₃‖ and ‖S‖/N, S the even part
        G(θ + εv) + G(θ − εv) − 2G(θ) (two gradient passes)."""
        base = self._base_gradient()
        plus = self._points_sum(tangents, epsilon, ((1.0, 1.0),))
        minus = self._points_sum(tangents, epsilon, ((-1.0, 1.0),))
        (even_norm,) = self._norms(
            p.to(torch.float64) + m.to(torch.float64) - 2 * b.to(torch.float64)
            for p, m, b in zip(plus, minus, base, strict=True)
        )
        difference = [p.sub_(m) for p, m in zip(plus, minus, strict=True)]
        del minus
        (difference_norm,) = self._norms(difference)
        n = self.n_samples
        return difference, difference_norm / (2 * epsilon * n), even_norm / n

    def _adaptive(self, vector: Tensor, tangents: Sequence[Tensor]) -> Taken:
        """The product's rule (:mod:`curvcal.curvature.step_control`): the pair G(θ ± εv) at the
        step δ = ε‖v‖ the control sets; three points when their predicted error is within the
        stated bound. Otherwise, once calibrated, the pair again at this direction's own
        three-point step (from its measured derivatives) when it is over 2× off and three
        points are predicted to be within the bound there, and three points if they are; or
        the pair again at a step under half the one taken where five points need it (the
        three-point step while the eigenvalues are computed, else
        :meth:`~curvcal.curvature.step_control.StepControl.five_point_step`); else the outer
        pair G(θ ± 2εv) completes Richardson's five points at the last step: 4 or 6 passes. The first product
        calibrates: Richardson, its three-point truncation measured, and a pair at a
        64× shorter step measures the rounding against the five-point product."""
        control = self.control
        norm = self._norm(vector)
        if not math.isfinite(norm):  # no pass, and the rule learns nothing from it
            raise NumericalError(
                "hessian", "a vector to multiply is not finite (NaN or Inf)", VECTOR_HINT
            )
        if norm == 0.0:  # H·0 = 0, without a pass (a step ε = δ/0 would overflow)
            zeros = [torch.zeros_like(t) for t in tangents]
            return Taken(THREE_POINT, 1.0, zeros, 0, "zero vector")
        step = control.step()
        epsilon = step / norm
        difference, image, even = self._pair(tangents, epsilon)
        judgement = control.judge(step, image / norm, even)
        self.last_judgement = judgement
        if control.calibrated and judgement.three_points_enough:
            return Taken(THREE_POINT, epsilon, difference, 2)
        passes = 4
        if control.calibrated:
            own = control.step_for(judgement.ladder, image / norm)
            promising = control.expect(judgement.ladder, own, image / norm).three_points_enough
            if control.relative_to_norm:  # five points at the three-point step where shorter
                shorter = own
                moved = shorter < step / 2
            else:  # five points' own step (a trace's probe: longer where rounding rules)
                shorter = control.five_point_step(judgement, image / norm)
                here = control.five_point_bound(judgement, step, image / norm)
                moved = not step / 2 <= shorter <= 2 * step or (
                    here > judgement.allowed
                    and control.five_point_bound(judgement, shorter, image / norm) < here
                )
            if ((own < step / 2 or own > 2 * step) and promising) or moved:
                retake = own if promising else shorter
                step, epsilon, passes = retake, retake / norm, 6
                difference, image, even = self._pair(tangents, epsilon)
                judgement = control.judge(step, image / norm, even)
                self.last_judgement = judgement
                if judgement.three_points_enough:
                    return Taken(THREE_POINT, epsilon, difference, 4, "3-point, step retaken")
        outer = self._points_sum(tangents, epsilon, OUTER)  # −(G(θ + 2εv) − G(θ − 2εv))
        # D₃(2ε) − D₃(ε) = −(outer + 2·difference) / (4εN); a third of it is D₃(ε)'s truncation
        (change,) = self._norms(o + 2 * d for o, d in zip(outer, difference, strict=True))
        first = not control.calibrated
        control.measured(step, judgement, change / (4 * epsilon * self.n_samples) / 3 / norm)
        weighted = [o.add_(d, alpha=8.0) for o, d in zip(outer, difference, strict=True)]
        if not first:
            self._five_points_taken(judgement, step, image / norm)
            return Taken(FIVE_POINT, epsilon, weighted, passes)
        # the rounding: three points at a 64× shorter step (truncation 4096× smaller) against
        # the five-point product, the difference per unit ‖v‖ times that step
        short = step / ROUNDING_PROBE
        near, _, _ = self._pair(tangents, short / norm)
        five, three = FIVE_POINT.denominator * epsilon, 2 * short / norm
        (error,) = self._norms(a / three - w / five for a, w in zip(near, weighted, strict=True))
        control.rounding_measured(short, error / self.n_samples / norm)
        self.start_passes += 2
        self._five_points_taken(judgement, step, image / norm)
        return Taken(FIVE_POINT, epsilon, weighted, 4)

    def _five_points_taken(self, judgement: Judgement, step: float, image_norm: float) -> None:
        """A five-point product's predicted error as taken (c and R as they now stand) kept in
        :attr:`last_five_point_bound`; outside the eigenvalue stage the next probe starts at
        this direction's own five-point step."""
        control = self.control
        self.last_five_point_bound = control.five_points_taken(judgement, step, image_norm)
        if not control.relative_to_norm:
            control.probe_step = control.five_point_step(judgement, image_norm)

    def _finish(self, total: Tensor, m: int) -> Tensor:
        """The mean over the samples of ``total`` (m, P), already summed over the ranks by the
        gradients' reduce-scatter; counted and checked for finiteness; shape (P, m)."""
        self._count(matvecs=m, passes=0)
        result = total.div_(self.n_samples).t()
        check = result.sum()
        if self.vector_space is not None:  # every rank raises, or none: a NaN on one slice
            check = self.vector_space.reduce(check.to(torch.float64))
        if not bool(torch.isfinite(check)) and not bool(torch.isfinite(result).all()):
            raise NumericalError(
                "hessian", PRODUCT, "check the model and data for NaN, or use float64"
            )
        return result

    def _points_sum(
        self, tangents: Sequence[Tensor], epsilon: float, points: Sequence[tuple[float, float]]
    ) -> list[Tensor]:
        """Σ_k w_k G(θ + c_k εv) over ``points`` (c_k, w_k), per selected parameter (whole on
        every rank, or this rank's shard when the vectors are sliced), G summed over every
        sample of every rank and accumulated in the sharded ``.grad``; the parameters are
        restored bit for bit afterwards."""
        from curvcal.sharding import gather_whole, local_shard, reshard

        sliced = self.vector_space is not None
        pieces = (
            list(tangents)
            if sliced
            else [local_shard(t, p) for t, p in zip(tangents, self._params, strict=True)]
        )
        locals_ = [_local(p) for p in self._params]
        saved = [tensor.detach().clone() for tensor in locals_]
        self._clear_gradients()
        try:
            for offset, weight in points:
                with torch.no_grad():
                    for tensor, value, piece in zip(locals_, saved, pieces, strict=True):
                        tensor.copy_(value).add_(piece, alpha=offset * epsilon)
                reshard(self.model)  # the next forwards gather the written shards
                self._gradient_pass(weight)
        finally:
            with torch.no_grad():
                for tensor, value in zip(locals_, saved, strict=True):
                    tensor.copy_(value)
            reshard(self.model)
        # a parameter the loss does not reach has no gradient: zero
        gradients = [torch.zeros_like(p) if p.grad is None else p.grad for p in self._params]
        # the reduce-scattered gradients are already this rank's slice: nothing to gather
        shards = [_local(g) for g in gradients] if sliced else gather_whole(gradients)
        weighted = [g.to(self._device) for g in shards]
        self._clear_gradients()
        return weighted

    def _gradient_pass(self, weight: float) -> None:
        """``weight`` × the gradient of the summed loss over this rank's batches, accumulated
        into the parameters' (sharded, summed over ranks) ``.grad``; zero-loss passes on the
        first batch make up for the batches this rank lacks."""
        self._count(matvecs=0, passes=1)
        with self._prepared_model(), torch.enable_grad():
            for x, y in self._batches:
                (self.loss.sum(self.model(x), y) * weight).backward()
            if self._padding:
                x, y = self._batches.first()
                for _ in range(self._padding):
                    (self.loss.sum(self.model(x), y) * 0.0).backward()

    def _clear_gradients(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def _owed_forwards(self, per_batch: Callable[[Inputs, Tensor], Tensor]) -> None:
        """The forwards this rank owes the others, run on its first batch (their values
        dropped) before a sum across ranks (:meth:`HessianOperator.sum_over_data`): every rank
        reaches the all-reduce after as many parameter gathers."""
        from curvcal.sharding import pad_forwards

        if self._padding:
            x, y = self._batches.first()
            pad_forwards(lambda: per_batch(x, y), self._padding)

    def error_estimate(self, seed: int = 0, vector: Tensor | None = None) -> ProductError:
        """The error of one product, relative to its norm, on ``vector`` (as the operator's
        vectors are held: whole, or this rank's slice; e.g. the top eigenvector, along which
        the error is largest) or else on a Gaussian vector seeded by ``seed``: the product the
        operator takes along that vector (its rule and step), its truncation
        ‖D(2ε) − D(ε)‖/(2^p − 1) (Richardson, p the order of the rule taken) and its rounding
        u·‖G(θ)‖·√B·Σ_k|w_k| / (denominator·ε), B the batches summed; and the bound the rule
        predicted for the product (a three-point one before taking it, a five-point one as
        taken: :mod:`curvcal.curvature.step_control`). Two products and, in float64, a
        gradient pass."""
        space = self.vector_space or VectorSpace(self.shape[0])
        if vector is None:
            vector = space.normal(seeded_generator(seed), self._dtype)
        vector = vector.to(device=self._device, dtype=self._dtype)
        single = [t[0] for t in self._tangents(vector.reshape(-1, 1))]
        taken = self._adaptive(vector, single)  # the rule and the step the operator takes
        stencil, epsilon = taken.stencil, taken.epsilon

        def flatten(weighted: Sequence[Tensor], step: float) -> Tensor:
            flat = torch.cat([w.reshape(-1) for w in weighted]).to(torch.float64)
            return flat / (stencil.denominator * step)

        near = flatten(taken.weighted, epsilon)
        far = flatten(self._points_sum(single, 2 * epsilon, stencil.points), 2 * epsilon)
        norm = max(float(space.norm(near)), 1e-300)
        truncation = float(space.norm(far - near)) / (2**stencil.order - 1) / norm
        weights = sum(abs(w) for _, w in stencil.points)
        batches = self._batches.n_batches + self._padding
        (gradient_norm,) = self._norms(self._base_gradient())
        rounding = (
            unit_roundoff(self._dtype)
            * gradient_norm
            * math.sqrt(batches)
            * weights
            / (stencil.denominator * epsilon)
            / norm
        )
        predicted = None
        if stencil is FIVE_POINT and self.last_five_point_bound is not None:
            predicted = self.last_five_point_bound * self._norm(vector) / norm
        elif self.last_judgement is not None and stencil is THREE_POINT:
            predicted = self.last_judgement.bound * self._norm(vector) / norm
        return ProductError(
            relative_step(self._dtype),
            relative_floor(self._dtype),
            truncation,
            rounding,
            stencil.name,
            passes=taken.passes,
            step_length=epsilon * self._norm(vector),
            predicted=predicted,
        )


def _local(parameter: Tensor) -> Tensor:
    from curvcal.sharding import local_tensor

    return local_tensor(parameter)


def eigenvalue_products(operator: object) -> AbstractContextManager[None]:
    """The products as the eigenvalue rules need them: for a central-difference operator each
    within b·‖H‖‖v‖ (:meth:`CentralDifferenceOperator.errors_relative_to_norm`), any other
    operator as it is."""
    if isinstance(operator, CentralDifferenceOperator):
        return operator.errors_relative_to_norm()
    return nullcontext()


def refuse_unsharded_settings(settings: HessianSettings, measure_width: bool) -> None:
    """Refuse what a model sharded by ``fully_shard`` cannot run (its products are central
    differences of gradients: the Hessian only, eval mode, no torch.func, a fixed
    ``probe_batch``), naming the field."""
    refused = {
        "curvature": settings.curvature != "hessian",
        "hvp": settings.hvp == "func",
        "mode": settings.mode == "train",
        "probe_batch": measure_width,
    }
    for name, bad in refused.items():
        if bad:
            value = "auto" if name == "probe_batch" else getattr(settings, name)
            raise SettingsError(
                name,
                f"{value!r} cannot run on a model sharded with fully_shard "
                "(its products are central differences of gradients, Hessian only, eval mode)",
            )


def build_operator(
    model: nn.Module,
    loss: Loss,
    batches: BatchSource,
    settings: HessianSettings | None = None,
    *,
    all_reduce: AllReduce | None = None,
    vectors: str = "sliced",
    **keywords: Any,
) -> HessianOperator:
    """The Hessian of the mean ``loss`` of ``model`` over ``batches``, run as ``settings`` say
    (their fields marked ``operator``; default: the defaults) with ``keywords`` on top (settings
    fields, ``device``, ``allow_tf32``): a :class:`~curvcal.curvature.operator.HessianOperator`,
    or for a model sharded by ``fully_shard`` a :class:`CentralDifferenceOperator` (its vectors
    ``vectors``: each rank's slices, or ``"whole"``), where what needs double backward or
    torch.func (another curvature, ``hvp="func"``, train mode) is refused
    (:func:`refuse_unsharded_settings`). The commands, the study and the Python API build every
    operator here (it lives beside the one operator class that can take a sharded model).

    Every path behaves the same on non-finite numbers: the mean loss and every product that is
    NaN or infinite anywhere raise :class:`~curvcal.errors.NumericalError` (exit code 3 on the
    command line) naming the number of batches whose own loss or product is not finite and the
    first of them with its sample range (or saying that no single batch is at fault, the sum
    overflowing); nothing is returned with a NaN in it. Blocks made by ``restrict`` are checked
    the same way. ``all_reduce`` sums the sample count and every product across processes when
    the data is sharded.
    """
    from curvcal.curvature.options import check_model
    from curvcal.sharding import is_sharded

    check_model(model)  # before anything reads its parameters
    if not is_sharded(model):
        return HessianOperator(model, batches, loss, settings, all_reduce=all_reduce, **keywords)
    return CentralDifferenceOperator(
        model, batches, loss, settings, all_reduce=all_reduce, vectors=vectors, **keywords
    )


def operator_for(*arguments: Any, **keywords: Any) -> HessianOperator:
    """The former name of :func:`build_operator`, taken with a :class:`DeprecationWarning`."""
    import warnings

    warnings.warn(
        "operator_for is now called build_operator (curvcal.curvature.build_operator); "
        "the old name will be removed",
        DeprecationWarning,
        stacklevel=2,
    )
    return build_operator(*arguments, **keywords)


__all__ = [
    "ENGINE",
    "FIVE_POINT",
    "THREE_POINT",
    "CentralDifferenceOperator",
    "ProductError",
    "build_operator",
    "eigenvalue_products",
    "refuse_unsharded_settings",
    "relative_floor",
    "relative_step",
    "sixteen_bit_floor",
    "stencil_for",
    "unit_roundoff",
]
