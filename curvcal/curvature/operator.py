"""The Hessian of a classifier's mean loss over a whole dataset, as a linear operator.

H = ∇²_θ L(θ) with L(θ) = (1/N) Σ_{i=1..N} ℓ(f_θ(x_i), y_i), θ the selected parameters
flattened in ``model.named_parameters()`` order and ℓ a loss object of :mod:`curvcal.losses`
(ce, focal γ, FLSD-53). A product H·V is accumulated batch by batch: each batch contributes the
Hessian-vector product of its *summed* loss, and the total is divided by N once — the same as
weighting each batch's mean-loss product by (batch size)/N, so the result does not depend on
how the data is batched.

The data loop is written here once; the data itself (cache, streaming, out-of-memory splits) is
:mod:`curvcal.curvature.batches`, and a batch's products come from one of the two engines of
:mod:`curvcal.curvature.engines` (``autograd``: double backward; ``func``: forward-over-reverse),
``engine="auto"`` choosing per product width and falling back to double backward for good, with
the reason in ``engine_fallback``, when ``torch.func`` cannot trace the model. ``engine``
reports the ones that ran (``"autograd"``, ``"func"`` or ``"autograd+func"``); both are exact.

The caller's model is never altered: the training flags of its modules and the values of its
buffers are restored after every product, and no ``.grad`` is written.

Scale. Inside a pass over the data nothing waits on the device: per-batch products are summed
on the device and the host reads one scalar per product (the finiteness check) — the scalars the
stopping rules of the algorithms need. On a CUDA out-of-memory error inside a pass, the pass is
discarded, every batch is split in half and the pass runs again (exact: products are sums over
samples), down to one sample per batch; ``oom_retries`` and ``batch_size_final`` record what
happened. TF32 matrix products are switched off during products unless ``allow_tf32=True``.
Before any product the first batch's autograd graphs are measured and the passes fitted in a
memory budget (:mod:`curvcal.curvature.memory`): fewer vectors per pass than ``probe_batch``,
and batches split into chunks, when that is what fits.

Non-finite numbers. The mean loss and every product are checked (the one host read per
product); one that is NaN or infinite raises :class:`~curvcal.errors.NumericalError` naming the
number of batches whose own loss or product is not finite and the first of them with its sample
range (:mod:`curvcal.curvature.guard` searches them, only after a check failed).

The product through kept gradient graphs (:func:`kept_hvp`) is written here, beside the loop
that sums it: it is the operator's one real method when the graphs fit; one batch's products by
double backward or forward-over-reverse are the kernels of :mod:`curvcal.curvature.engines`.
:func:`~curvcal.curvature.central_difference.build_operator` is how every user-facing path
(the API functions, the analysis behind ``curvcal hessian``, the study) builds one: from a
model, a loss, batches and the :class:`~curvcal.settings.hessian.HessianSettings` themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import itertools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from curvcal import rows as rows_of
from curvcal.curvature.batches import AllReduce, Batch, Batches, BatchSource, is_out_of_memory
from curvcal.curvature.engines import (
    BatchProduct,
    autograd_hvp,
    engine_for,
    engines_between,
    func_hvp,
    gauss_newton_product,
    is_torchscript,
    measure_probe_batch,
    prepared_model,
)
from curvcal.curvature.guard import PRODUCT, located
from curvcal.curvature.kept import (
    KeptGraph,
    KeptState,
    build_kept_graph,
    chunk_rows,
    first_graph,
    versions_of,
)
from curvcal.curvature.memory import GraphSizes, PassPlan, free_memory, probe_graph
from curvcal.curvature.memory_fit import MemoryChoice, fit_memory
from curvcal.curvature.options import (
    AUTO_PROBE_BATCH,
    check_curvature,
    check_model,
    check_options,
    checked_loss,
    operator_settings,
    select_parameters,
)
from curvcal.curvature.precision import (
    accuracy_bound,
    compute_dtype,
    is_half,
    precision_floor,
)
from curvcal.curvature.progress import OnStep
from curvcal.devices import device_named
from curvcal.errors import InputError, NumericalError
from curvcal.losses import (
    LOSS_NAMES,
    Loss,
    UserLoss,
    logit_fisher_product,
    logit_gradient_product,
    logit_hessian_product,
)
from curvcal.rows import Inputs
from curvcal.settings.hessian import HessianSettings

#: Loss names an operator accepts as ``loss``.
CRITERIA = LOSS_NAMES
#: each kind's matrix in the logits, M_n in Σ_n J_nᵀ M_n J_n (the Hessian is not of this form)
_LOGIT_PRODUCTS: dict[str, Callable[[Loss, Tensor, Tensor, Tensor], Tensor]] = {
    "ggn": logit_hessian_product,
    "fisher": logit_fisher_product,
    "empirical-fisher": logit_gradient_product,
}


# -- the kernel of the kept graphs: Σ_B H_B·v_j by one backward per vector ----------------


def kept_hvp(
    kept: KeptGraph,
    indices: Sequence[int],
    tangents: Sequence[Tensor],
    out: Sequence[Tensor],
) -> None:
    """Σ_B H_B·v_j for the parameters ``kept.params[i]``, i in ``indices``, written into ``out``.

    ``tangents[k]`` has shape ``(m, *params[indices[k]].shape)`` (the k-th selected parameter's
    piece of every vector) and ``out[k]`` the same shape; ``out`` is overwritten. One backward
    through the kept graph per vector, H·v_j = J_g(θ)ᵀ v_j restricted to the selected rows and
    columns, the graph retained for the next product. (One backward vmapped over the vectors,
    ``is_grads_batched=True``, measured slower on the CPU: 1.11× on the bundled CNN, 1.39× on
    ResNet-18, for 8 vectors.)
    """
    params = [kept.params[i] for i in indices]
    live = [k for k, i in enumerate(indices) if kept.gradient[i] is not None]
    outputs = [g for g in (kept.gradient[i] for i in indices) if g is not None]
    m = int(tangents[0].shape[0]) if tangents else 0
    with torch.enable_grad():
        for j in range(m):
            if not live:
                for slot in out:
                    slot[j].zero_()
                continue
            products = torch.autograd.grad(
                outputs,
                params,
                grad_outputs=[tangents[k][j] for k in live],
                retain_graph=True,
                allow_unused=True,
            )
            for slot, product in zip(out, products, strict=True):
                if product is None:
                    slot[j].zero_()
                else:
                    slot[j].copy_(product)


class _Totals:
    """Products and data passes of an operator and of every block :meth:`HessianOperator.restrict`
    made from it (one record shared by all of them)."""

    def __init__(self) -> None:
        self.matvecs = 0
        self.data_passes = 0


class HessianOperator:
    """H = ∇²_θ (1/N) Σ_i ℓ(f_θ(x_i), y_i) over a whole dataset, applied to blocks of vectors.

    Parameters
    ----------
    model:
        an ``nn.Module`` (eager or TorchScript) returning logits of shape (batch, K).
    batches:
        the dataset: a re-iterable of ``(x, y)`` pairs (a list, a DataLoader) or a callable
        returning a fresh iterator of them; ``y`` holds integer class labels, ``x`` is a tensor
        or a mapping of named tensors with the same rows (a text model's ``input_ids`` and
        ``attention_mask``), passed to the model as its one argument.
    loss:
        the loss ℓ: a loss object of :mod:`curvcal.losses`, or its name (the settings field
        ``loss``) — ``"ce"`` (cross-entropy, default), ``"focal"`` (−(1 − p_y)^γ log p_y with
        γ = ``gamma``) or ``"flsd53"`` (the focal loss with γ_i = 5 where p_y < 0.2, else 3,
        γ_i held fixed).
    settings:
        a :class:`~curvcal.settings.hessian.HessianSettings` (default: the defaults): the
        operator reads its fields marked ``operator``, described below; any of them may also be
        given as a keyword (``hvp="func"``), on top of ``settings``, checked as the command line
        checks them (an error names the field). Former names (``criterion`` for ``loss``,
        ``engine`` for ``hvp``) are taken with a :class:`DeprecationWarning`. :attr:`settings`
        keeps them.
    params:
        ``()`` (or ``None``) for every parameter with ``requires_grad``, or glob patterns matched
        against ``named_parameters()`` names (``["fc.*"]``); each pattern must match at least one.
    hvp:
        ``"auto"``, ``"func"`` (forward-over-reverse) or ``"autograd"`` (double backward).
    mode:
        ``"eval"`` (default: BatchNorm running statistics, dropout off) or ``"train"`` (refused
        when the model has dropout layers, which would make the loss random).
    cache:
        ``"auto"`` (keep batches on the device when they fit in a quarter of its free memory,
        otherwise stream), ``"device"``, ``"host"`` or ``"none"``.
    device:
        (keyword) where the batches go; defaults to, and must equal, the device of the
        parameters (the model is never moved).
    probe_batch:
        how many vectors share one pass over the data (vectorised); bounds memory. ``"auto"``
        (a keyword of Python only):
        8 on the CPU; on CUDA, from the free memory (``torch.cuda.mem_get_info``) and the
        measured peak memory of a one- and a two-vector product on the first batch, at most 64.
        The value chosen is :attr:`probe_batch` (:attr:`probe_batch_requested` keeps ``"auto"``).
    all_reduce:
        (keyword) a sum across processes (for a dataset sharded over ranks), applied to the sample count
        at construction and to every product's batch sum; ``None`` in one process.
    allow_tf32:
        (keyword) let CUDA matrix products and convolutions use TF32 (about 10 mantissa bits) during
        products; off by default, and the global flags are restored afterwards.
    memory_budget:
        bytes a pass of products may use (``"4GiB"``, ``"50%"`` of the free memory, an integer
        of bytes); ``None``: the default of :mod:`curvcal.curvature.memory` (half the free
        memory of the device when the plan is made). With the cost per sample measured on the
        first batch, it caps ``probe_batch`` and splits batches into chunks (micro-batching,
        exact) only when one batch alone does not fit; :attr:`memory_plan` records the pass and
        :attr:`memory_choice` the choice in words, with the budget's source. Under
        ``all_reduce`` only the chunking applies (every process must run the same passes).
    keep_graphs:
        ``"auto"`` (default): when the double-backward graphs of every batch fit in the memory
        budget together with a pass of products, build them once and answer every product by
        one backward through them (:mod:`curvcal.curvature.kept`: on one CPU thread 1.8× a
        gradient pass on ResNet-18 instead of 3.0×); ``"always"``: keep them whatever the
        budget; ``"never"``: forward and first backward again for every product. Not with
        ``hvp="func"``, nor in train mode (BatchNorm's graph saves the running statistics,
        which are restored after every product). :attr:`graphs_kept` says whether products run
        that way; on a CUDA out-of-memory error the graphs are dropped (:attr:`graphs_dropped`
        says why) and products go on without them.
    curvature:
        ``"hessian"`` (default) or a matrix of the form G = (1/N) Σ_n J_nᵀ M_n J_n, J_n = ∂z_n/∂θ
        the Jacobian of sample n's logits: ``"ggn"`` (M_n = Λ_n = ∇²_z ℓ, the generalised
        Gauss–Newton matrix), ``"fisher"`` (M_n = E_{k~softmax(z_n)}[∇_zℓ(z_n,k)∇_zℓ(z_n,k)ᵀ]; for
        cross-entropy this is Λ_n, the Fisher equals the GGN) or ``"empirical-fisher"``
        (M_n = g_n g_nᵀ, g_n = ∇_zℓ(z_n, y_n): (1/N) Σ_n ∇_θℓ_n ∇_θℓ_nᵀ). Their products are
        :func:`~curvcal.curvature.engines.gauss_newton_product` with M_n in closed form
        (:mod:`curvcal.losses`), the same data loop, weighting, checks and sums as the Hessian's;
        refused for a loss without closed-form derivatives in the logits, in train mode and with
        ``hvp="func"`` (:func:`~curvcal.curvature.options.check_curvature`). No graph is kept
        between their products.

    Floating-point inputs are cast to the parameters' dtype. ``n_matvecs`` counts vectors
    multiplied, ``n_data_passes`` passes over the data (products, retried passes and
    :meth:`mean_loss`); ``total_matvecs`` and ``total_data_passes`` add those of the blocks made
    by :meth:`restrict`; ``oom_retries`` counts the passes run again after an out-of-memory
    error, ``batch_size_final`` the most samples a batch held in the last pass.
    """

    #: whether products are differences of gradients (no double backward), so that a model
    #: sharded with ``fully_shard`` may be given (the central-difference operator)
    differentiates_gradients: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        loss: str | Loss | None = None,
        settings: HessianSettings | None = None,
        *,
        all_reduce: AllReduce | None = None,
        device: torch.device | str | None = None,
        allow_tf32: bool = False,
        **fields: Any,
    ) -> None:
        check_model(model)  # before anything reads its parameters
        if not self.differentiates_gradients:
            from curvcal.sharding import is_sharded

            if is_sharded(model):  # every construction comes here, whoever builds it
                raise InputError(
                    "model",
                    "is sharded with fully_shard, whose parameters double backward cannot reach",
                    "build its operator with curvcal.curvature.build_operator",
                )
        if isinstance(loss, str):
            fields = {"loss": loss, **fields}
            loss = None
        settings, measure_width = operator_settings(settings, fields, type(self).__name__)
        settings = self._runnable(settings, measure_width)
        budget = check_options(model, settings)
        loss = checked_loss(settings, loss)
        check_curvature(settings, loss)
        #: the settings this operator was built with (its fields marked ``operator``; ``loss``
        #: and ``gamma`` not read when a loss object was given: :attr:`loss` is the loss)
        self.settings = settings
        scripted = is_torchscript(model)
        self.curvature = settings.curvature
        self.model = model
        self.loss = loss
        self.gamma = loss.gamma
        self.mode = settings.mode
        self.probe_batch_requested: int | str = (
            AUTO_PROBE_BATCH if measure_width else settings.probe_batch
        )
        self.probe_batch = settings.probe_batch
        self.allow_tf32 = bool(allow_tf32)
        self.oom_retries = 0
        self.requested_engine = settings.hvp
        self.engine_fallback: str | None = None
        # the GGN and Fisher kernel is one of its own (double vjp), never torch.func's
        self._func_usable = (
            settings.hvp != "autograd" and not scripted and settings.curvature == "hessian"
        )
        #: vectors multiplied by each engine so far (``engine`` and per-stage reports read it)
        self.engine_products: dict[str, int] = {}
        self._all_reduce = all_reduce
        # a failed check names the batches at fault (not in the one-batch operators that search)
        self._locates = True
        self._select(settings.params or None)
        self.keep_graphs = settings.keep_graphs
        self._graphs = KeptState(self.param_names, self._params)
        param_device = self._params[0].device
        wanted = (
            param_device
            if device is None
            else device_named(
                device, "device", "use device='cpu', or leave it unset", any_cuda=True
            )
        )
        same = wanted.type == param_device.type and wanted.index in (None, param_device.index)
        self._device = param_device  # "cuda" means the parameters' CUDA device
        if not same:
            raise InputError(
                "device",
                f"the model's parameters are on {param_device}, not {wanted}",
                "move the model before building the operator, or leave device unset",
            )
        self._batches = Batches(
            batches, settings.cache, self._device, self._model_dtype, all_reduce
        )
        self._labels_fit = isinstance(loss, UserLoss)  # a user's loss reads labels as it likes
        self.n_matvecs = 0
        self.n_data_passes = 0
        self._accuracy_bound: float | None = None
        self._totals = _Totals()
        if measure_width and self._device.type == "cuda":
            with self._prepared_model():
                self.probe_batch = measure_probe_batch(
                    self._batch_product(self._engine_for(2)),
                    self._batches.first(),
                    self._params,
                    self._device,
                    is_out_of_memory,
                )
        self.memory_budget = budget
        self.memory_plan: PassPlan | None = None
        #: what the plan chose and why (budget and its source, rows per chunk, kept graphs)
        self.memory_choice: MemoryChoice | None = None
        self.memory_graphs: GraphSizes | None = None
        #: predicted bytes of the kept graphs, and of those with a one-vector product through
        #: them: what keeping needs (None when graphs are never kept)
        self.kept_estimate: int | None = None
        self.kept_need: int | None = None
        self._plan_memory()

    def _runnable(self, settings: HessianSettings, measure_width: bool) -> HessianSettings:
        """The settings as this kind of operator runs them (a subclass refuses or fixes some;
        ``measure_width``: ``probe_batch="auto"`` was asked)."""
        return settings

    # -- parameter selection ---------------------------------------------------------------
    def _select(self, patterns: Sequence[str] | None) -> None:
        self.param_names, self._params = select_parameters(self.model, patterns)
        self._numels = [p.numel() for p in self._params]
        self._model_dtype = self._params[0].dtype
        self._dtype = compute_dtype(self._model_dtype)

    def restrict(self, params: Sequence[str]) -> HessianOperator:
        """A new operator on a subset of the parameters, sharing this one's data and sample count.

        The diagonal block of H for the parameters matching the glob patterns ``params``.
        """
        other = copy.copy(self)
        other._select(params)
        other.n_matvecs = 0
        other.n_data_passes = 0
        other.engine_products = {}
        return other

    def with_loss(self, loss: Loss) -> HessianOperator:
        """The Hessian of another ``loss`` of the same model, parameters and data (its batches,
        cache and memory plan shared, its products counted in this operator's totals): how the
        residual part R = H − G of the Hessian is multiplied
        (:class:`~curvcal.losses.Linearised`).

        Graphs are kept for it as they are for this operator, but never both at once: this
        operator's kept graph is freed here and rebuilt at its next product.
        """
        other = copy.copy(self)
        other.loss, other.gamma = loss, loss.gamma
        other._graphs = KeptState(self.param_names, self._params)
        other._graphs.enabled, other._graphs.chunks = self._graphs.enabled, self._graphs.chunks
        other.n_matvecs = 0
        other.n_data_passes = 0
        other.engine_products = {}
        self._graphs.kept = self._graphs.start = None
        return other

    def with_batches(self, batches: BatchSource) -> HessianOperator:
        """The same Hessian (model, loss, parameters, engine, mode) over other ``batches``, in
        this process alone and without a cache: how the NaN guard examines one batch."""
        single = HessianOperator(
            self.model,
            batches,
            self.loss,
            self.settings.replace(
                params=tuple(glob.escape(name) for name in self.param_names),
                cache="none",
                probe_batch=self.probe_batch,
                keep_graphs="never",
            ),
            allow_tf32=self.allow_tf32,
        )
        single._locates = False
        return single

    def over_batches(self, batches: BatchSource) -> HessianOperator:
        """The same Hessian (model, loss, parameters, settings, engine width) over other
        ``batches``, summed across processes as this one is (its own count and products): how
        a warm start multiplies over a sample of the data
        (:mod:`curvcal.curvature.warm_start`)."""
        return HessianOperator(
            self.model,
            batches,
            self.loss,
            self.settings.replace(
                params=tuple(glob.escape(name) for name in self.param_names),
                probe_batch=self.probe_batch,
            ),
            all_reduce=self._all_reduce,
            allow_tf32=self.allow_tf32,
        )

    def source_batches(self) -> Iterator[Batch]:
        """The batches as the source gives them, read afresh (this process's shard)."""
        return self._batches.originals()

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """The selected parameter tensors, in ``param_names`` order."""
        return self._params

    @property
    def criterion(self) -> str:
        """Deprecated: the loss's name is ``operator.loss.name`` (one name per idea: the
        setting is ``loss``)."""
        warnings.warn(
            "HessianOperator.criterion is deprecated: use operator.loss.name",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.loss.name

    @property
    def budget(self) -> int | None:
        """The memory budget in bytes the pass plan was made for (:attr:`memory_plan`), which
        also bounds what the algorithms hold beside the products (Lanczos' basis, a Hutch++
        sketch); None without a plan."""
        return None if self.memory_plan is None else self.memory_plan.budget

    # -- operator interface ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        n = sum(self._numels)
        return (n, n)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the vectors multiplied and of the products: the parameters' dtype, or
        float32 for a model in bfloat16 or float16 (:mod:`curvcal.curvature.precision`)."""
        return self._dtype

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype the model runs in (its parameters'): vectors are cast to it inside a
        product and the product cast back to :attr:`dtype`."""
        return self._model_dtype

    @property
    def precision_floor(self) -> float:
        """The relative accuracy of one product in :attr:`model_dtype`
        (:func:`~curvcal.curvature.precision.precision_floor`); the eigenvalue stopping rule
        never asks for less."""
        return precision_floor(self._model_dtype)

    @property
    def accuracy_bound(self) -> float:
        """The relative accuracy of a curvature value of the model in :attr:`model_dtype`
        against the same model in float64
        (:func:`~curvcal.curvature.precision.accuracy_bound`: the precision floor plus the
        model's normalising layers, counted over one forward pass on a sample of the first
        batch, once); 0 for float32 and float64 models."""
        if not is_half(self._model_dtype):
            return 0.0
        if self._accuracy_bound is None:
            x, _ = self._batches.first()
            sample = x[:1] if isinstance(x, Tensor) else x
            with self._prepared_model():
                self._accuracy_bound = accuracy_bound(self._model_dtype, self.model, sample)
        return self._accuracy_bound

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def n_samples(self) -> int:
        """N, the number of samples the loss averages over (across all ranks)."""
        return self._batches.n_samples

    @property
    def n_local(self) -> int:
        """The samples of this process's shard of the data (N on one process)."""
        return self._batches.n_local

    @property
    def total_matvecs(self) -> int:
        """Vectors multiplied by this operator and by every block restricted from it."""
        return self._totals.matvecs

    @property
    def total_data_passes(self) -> int:
        """Passes over the data by this operator and by every block restricted from it."""
        return self._totals.data_passes

    @property
    def batch_size_final(self) -> int:
        """The most samples one batch held in the last pass (smaller after out-of-memory splits)."""
        return self._batches.batch_size

    @property
    def micro_batch(self) -> int | None:
        """Rows per chunk when the memory budget splits batches (micro-batching); else None."""
        return self._batches.limit

    @property
    def cache_mode(self) -> str:
        """Where batches live between products: ``device``, ``host`` or ``none`` (streamed)."""
        return self._batches.mode

    def matvec(self, vector: Tensor) -> Tensor:
        """H·v for v of shape (P,)."""
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)

    def matvec_into(self, vector: Tensor, out: Tensor) -> Tensor:
        """H·v for v of shape (P,), written into ``out`` and returned.

        ``out`` is a contiguous floating-point (P,) tensor on this operator's device, of any
        dtype: each parameter's product is cast straight into its place, and the sum over
        batches, the mean and the finiteness check run there, so the P-long result
        :meth:`matvec` allocates is never made (Lanczos writes its products into its float64
        basis this way)."""
        n_params = self._vector_length()
        if tuple(vector.shape) != (n_params,):
            raise InputError("vector", f"expected shape ({n_params},), got {tuple(vector.shape)}")
        if (
            tuple(out.shape) != (n_params,)
            or not out.is_floating_point()
            or not out.is_contiguous()
            or out.device != self._device
        ):
            raise InputError(
                "out",
                f"expected a contiguous floating-point tensor of shape ({n_params},) on "
                f"{self._device}, got {tuple(out.shape)} {out.dtype} on {out.device}",
            )
        block = vector.to(device=self._device, dtype=self._dtype).reshape(-1, 1)
        try:
            self._product(block, out.view(1, -1))
        except NumericalError as error:
            raise self._located(error, block) from None
        return out

    def _vector_length(self) -> int:
        """The length of the vectors this operator multiplies: P (a sharded model's operator
        may take each rank's slice instead)."""
        return self.shape[0]

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def matmat(self, vectors: Tensor) -> Tensor:
        """H·V for V of shape (P, m), ``probe_batch`` columns per pass over the data."""
        n_params = self._vector_length()
        if vectors.ndim != 2 or vectors.shape[0] != n_params:
            raise InputError(
                "vectors", f"expected shape ({n_params}, m), got {tuple(vectors.shape)}"
            )
        vectors = vectors.to(device=self._device, dtype=self._dtype)
        try:
            columns = [
                self._product(vectors[:, start : start + self.probe_batch])
                for start in range(0, vectors.shape[1], self.probe_batch)
            ]
        except NumericalError as error:
            raise self._located(error, vectors) from None
        if len(columns) == 1:
            return columns[0]
        return torch.cat(columns, dim=1) if columns else vectors.new_zeros((n_params, 0))

    def _located(self, error: NumericalError, vectors: Tensor | None) -> NumericalError:
        """``error`` (a failed finiteness check of the mean loss, ``vectors`` None, or of the
        products of ``vectors``) with the batches at fault (:func:`~curvcal.curvature.guard.located`)."""
        if not self._locates:
            return error
        return located(self, error.what, error.why, vectors, sharded=self._all_reduce is not None)

    # -- the products --------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        """The engines that have run (``"autograd"``, ``"func"``, ``"autograd+func"``); before the
        first product, the one a single vector would use."""
        return engines_between(self.engine_products, {}) or self._engine_for(1)

    def _engine_for(self, width: int) -> str:
        return engine_for(self.requested_engine, self._func_usable, width, self._device)

    def _plan_memory(self) -> None:
        """Measure the first batch's graphs and fit the passes, and the kept graphs, in the memory
        budget (:func:`~curvcal.curvature.memory_fit.fit_memory`); when the graphs are kept and
        the measurement ran on the whole first batch, its graph is the kept graph's first part
        (:meth:`~curvcal.curvature.kept.KeptState.adopt`)."""
        x, y = self._batches.first()
        # train mode: BatchNorm's graph saves the running statistics, which are restored in place
        # after every product, so a kept graph could not be differentiated again
        # the GGN and Fisher kernels keep no graph between products
        unkeepable = (
            "hvp func: forward-over-reverse keeps no graph"
            if self.requested_engine == "func"
            else "mode train: BatchNorm's graph would hold the running statistics restored "
            "after every product"
            if self.mode == "train"
            else f"curvature {self.curvature}: its products keep no graph"
            if self.curvature != "hessian"
            else ""
        )
        keepable = not unkeepable
        keep_graphs = self.keep_graphs if keepable else "never"
        # read before the measurement: a graph it hands over is counted in the kept graphs'
        # bytes, not in the free memory as well
        free = free_memory(self._device)
        watched = self._watched()
        versions = versions_of(watched)
        with self._prepared_model():
            probe = probe_graph(
                lambda xs, ys: self._loss_sum(self.model(xs), ys),
                self._params,
                x,
                y,
                keep_whole=keep_graphs != "never",
            )
        graphs = probe.sizes
        # streamed batches would be freed after each pass; kept graphs hold their inputs
        streamed = self._batches.mode == "none"
        fit = fit_memory(
            graphs,
            # the vectors are in the compute dtype (float32 for a 16-bit model): the wider
            param_bytes=self.shape[0] * self._dtype.itemsize,
            batch_sizes=self._batches.sizes,
            rows=self._batches.batch_size,
            width=self.probe_batch,
            requested=self.memory_budget,
            free=free,
            vmapped=self._engine_for(2) == "func",
            sharded=self._all_reduce is not None,
            keep_graphs=keep_graphs,
            input_row_bytes=rows_of.nbytes(x) / max(1, rows_of.n_rows(x)) if streamed else 0.0,
            device=self._device,
            unkeepable=unkeepable,
        )
        self.probe_batch = fit.width
        if fit.limit is not None:
            self._batches.limit = fit.limit
        self.memory_graphs = graphs
        self.memory_plan = fit.plan
        self.memory_choice = fit.choice
        self.kept_estimate, self.kept_need = fit.kept_estimate, fit.kept_need
        self._graphs.enabled, self._graphs.chunks = fit.keep, fit.kept_chunks
        first_chunk = chunk_rows(self._batches.sizes[:1], fit.limit)[0]
        if fit.keep and probe.gradient is not None and first_chunk == probe.rows:
            self._graphs.adopt(
                first_graph(probe.gradient, self._params, watched, versions), probe.rows
            )
            if fit.choice is not None:
                self.memory_choice = dataclasses.replace(
                    fit.choice,
                    graphs_why=f"{fit.choice.graphs_why}; the first batch's graph "
                    f"({probe.rows} rows), built whole by the measurement, is kept as the first",
                )

    @property
    def graphs_kept(self) -> bool:
        """Whether products run through gradient graphs kept between them (see ``keep_graphs``)."""
        return self._graphs.enabled and self._kept_indices() is not None

    @property
    def kept_rows(self) -> int | None:
        """Samples whose gradient graphs are kept between products (all of them when every
        graph fits, fewer when only the leading chunks' do); None when none are kept."""
        if not self.graphs_kept:
            return None
        if self._graphs.chunks is None:
            return self.n_samples
        return sum(chunk_rows(self._batches.sizes, self._batches.limit)[: self._graphs.chunks])

    @property
    def graphs_dropped(self) -> str | None:
        """Why kept graphs were given up (out of memory), or None."""
        return self._graphs.dropped

    def _kept_indices(self) -> list[int] | None:
        return self._graphs.indices(self.param_names)

    def _watched(self) -> tuple[Tensor, ...]:
        """What a kept graph's values depend on: every parameter and buffer."""
        return (*self.model.parameters(), *self.model.buffers())

    def _kept_graph(self) -> KeptGraph:
        """The kept graph, built first when missing or stale (run inside :meth:`_prepared_model`):
        from the first batch's graph the memory plan built, when it handed one over and it is
        still current, and the other kept chunks."""
        state = self._graphs
        kept = state.kept
        if kept is None or not kept.is_current():
            state.kept = None  # free a stale graph before building its replacement
            start = state.take_start(chunk_rows(self._batches.sizes[:1], self._batches.limit)[0])
            skip = 0 if start is None else 1
            chunks = None if state.chunks is None else state.chunks - skip
            kept = build_kept_graph(
                lambda xs, ys: self._loss_sum(self.model(xs), ys),
                state.params,
                itertools.islice(self._batches.chunks_after(skip), chunks),
                self._watched(),
                start,
            )
            state.kept = kept
            self._count(matvecs=0, passes=1)
        return kept

    def _drop_kept_graph(self, error: BaseException) -> None:
        """Give the kept graph up for good after the out-of-memory ``error``."""
        self._graphs.drop(
            f"the kept gradient graphs ran out of memory ({' '.join(str(error).split())[:120]}); "
            "each product builds them again"
        )
        self._free_memory()

    def _batch_product(self, engine: str) -> BatchProduct:
        if self.curvature != "hessian":
            return self._batch_gauss_newton
        return self._batch_hvp_func if engine == "func" else self._batch_hvp_autograd

    def _batch_gauss_newton(
        self, x: Inputs, y: Tensor, tangents: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        """Σ_n J_nᵀ M_n J_n v over the batch, M_n this curvature's matrix in the logits."""
        return gauss_newton_product(self.model, self._logit_product, self._params, x, y, tangents)

    def _logit_product(self, logits: Tensor, labels: Tensor, w: Tensor) -> Tensor:
        self.check_label_range(logits)
        return _LOGIT_PRODUCTS[self.curvature](self.loss, logits, labels, w)

    def _batch_hvp_func(
        self, x: Inputs, y: Tensor, tangents: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        return func_hvp(self.model, self._loss_sum, self.param_names, self._params, x, y, tangents)

    def _batch_hvp_autograd(
        self, x: Inputs, y: Tensor, tangents: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        return autograd_hvp(self.model, self._loss_sum, self._params, x, y, tangents)

    def _loss_sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        """The summed loss of ``logits`` widened to :attr:`dtype` first: a bfloat16 or float16
        model's logits meet the softmax in float32 (a no-op for float32 and float64 models)."""
        self.check_label_range(logits)
        return self.loss.sum(logits.to(self._dtype), labels)

    def _product(self, block: Tensor, total: Tensor | None = None) -> Tensor:
        """H·``block`` (P, m) as a (P, m) view of ``total`` (m, P), allocated when not given."""
        if total is None:
            total = block.new_empty((block.shape[1], self.shape[0]))
        indices = self._kept_indices() if self._graphs.enabled else None
        kept = indices is not None
        if indices is not None:
            # through the kept graph (built first when missing or stale), written into ``total``
            try:
                with self._prepared_model():
                    kept_hvp(self._kept_graph(), indices, self._tangents(block), self._slots(total))
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self._drop_kept_graph(error)
                kept = False
        if kept:
            # through the kept graphs: the second backward of double backward
            engine, skip = "autograd", self._graphs.chunks
            if skip is None:
                result = self._finish(total, block.shape[1])
            else:
                # the chunks whose graphs are not kept, added to the kept ones' products; by
                # double backward, as planned (a pass that failed halfway could not be redone
                # by another engine without the kept part)
                result = self._product_with("autograd", block, total, skip)
        else:
            engine, result = self._rebuilt_product(block, total)
        self.engine_products[engine] = self.engine_products.get(engine, 0) + block.shape[1]
        return result

    def _rebuilt_product(self, block: Tensor, total: Tensor) -> tuple[str, Tensor]:
        """The products with the graphs built again, and the engine that made them (``auto``
        falls back from ``func`` to double backward for good when torch.func fails)."""
        engine = self._engine_for(block.shape[1])
        try:
            return engine, self._product_with(engine, block, total)
        except (NumericalError, InputError):
            raise
        except Exception as error:
            if self.requested_engine != "auto" or engine != "func":
                raise
            self._func_usable = False
            self.engine_fallback = (
                f"torch.func failed ({type(error).__name__}: {' '.join(str(error).split())[:200]}); "
                "double backward used instead"
            )
            return "autograd", self._product_with("autograd", block, total)

    def _product_with(self, engine: str, block: Tensor, total: Tensor, skip: int = 0) -> Tensor:
        """The passes of ``engine`` over the data (all but the first ``skip`` chunks, whose
        products ``total`` holds from kept graphs), each split further after an out-of-memory
        error; then :meth:`_finish`."""
        m = block.shape[1]
        while True:
            try:
                self._pass(engine, block, total, skip)
                break
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self._free_memory()
                if skip:
                    # the kept graphs go first, and the whole product is made again without them
                    self._graphs.drop(
                        "a pass beside the kept gradient graphs ran out of memory; each product "
                        "builds them again"
                    )
                    self._free_memory()
                    skip = 0
                    continue
                if not self._batches.halve():
                    raise InputError(
                        "batches",
                        f"the device ran out of memory even with one sample per batch and {m} vector(s) per pass",
                        "lower probe_batch, use cache='host' or 'none', a smaller model, or a larger device",
                    ) from error
                self.oom_retries += 1
        return self._finish(total, m)  # the passes were counted by _pass

    def _finish(self, total: Tensor, m: int) -> Tensor:
        """The mean over the samples of the summed products ``total`` (m, P), summed across
        processes, counted and checked for finiteness; shape (P, m)."""
        if self._all_reduce is not None:
            total.copy_(self._all_reduce(total))
        self._count(matvecs=m, passes=0)
        result = total.div_(self.n_samples).t()
        # one host read per product: a NaN or Inf anywhere makes the sum non-finite
        if not bool(torch.isfinite(result.sum())) and not bool(torch.isfinite(result).all()):
            raise NumericalError(
                "hessian", PRODUCT, "check the model and data for NaN, or use float64"
            )
        return result

    def _count(self, matvecs: int, passes: int) -> None:
        self.n_matvecs += matvecs
        self.n_data_passes += passes
        self._totals.matvecs += matvecs
        self._totals.data_passes += passes

    def sum_outputs(self, statistic: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """Σ over the dataset of ``statistic(logits, labels)`` per batch, in float64 (one pass,
        no grad, the model in this operator's mode; summed across processes when sharded)."""

        def per_batch(x: Inputs, y: Tensor) -> Tensor:
            with torch.no_grad():
                return statistic(self.model(x), y)

        return self.sum_over_data(per_batch)

    def sum_over_data(
        self, per_batch: Callable[[Inputs, Tensor], Tensor], *, on_batch: OnStep = None
    ) -> Tensor:
        """Σ over the dataset of ``per_batch(x, y)``, in float64: one pass over the batches as
        products see them, the model in this operator's mode, summed across processes when
        sharded. ``on_batch`` is called with the batches done so far."""
        total: Tensor | None = None
        with self._prepared_model():
            for index, (x, y) in enumerate(self._batches):
                value = per_batch(x, y).to(torch.float64)
                total = value if total is None else total + value
                if on_batch is not None:
                    on_batch(index + 1)
            self._owed_forwards(per_batch)
        assert total is not None  # every batch source holds a sample
        self._count(matvecs=0, passes=1)
        return self.sum_across(total)

    def _owed_forwards(self, per_batch: Callable[[Inputs, Tensor], Tensor]) -> None:
        """The forwards of ``per_batch`` this rank owes the others before a sum across ranks,
        their values dropped: none, as every rank holds as many batches here."""

    def sum_across(self, value: Tensor) -> Tensor:
        """``value`` summed across processes when the data is sharded, else itself."""
        return value if self._all_reduce is None else self._all_reduce(value)

    def first_batch(self) -> Batch:
        """The first batch as a product sees it (on the device, cast, micro-batched)."""
        return self._batches.first()

    def prepared(self) -> AbstractContextManager[None]:
        """The model as products run it: this operator's mode, TF32 as allowed, the
        differentiable-twice attention kernel; restored on exit."""
        return self._prepared_model()

    def mean_loss(self) -> float:
        """L(θ) = (1/N) Σ_i ℓ(f_θ(x_i), y_i), the loss whose Hessian this is (one pass, no grad).

        Raises :class:`NumericalError` when it is NaN or infinite: the Hessian would be too.
        """
        total = self.sum_outputs(self._loss_sum)
        value = float(total) / self.n_samples
        if not math.isfinite(value):
            raise self._located(
                NumericalError(
                    "loss",
                    f"the mean {self.loss.name} loss over the {self.n_samples} samples is {value}",
                    "check the model's weights and the data for NaN or Inf, or use float64",
                ),
                None,
            )
        return value

    def _pass(self, engine: str, block: Tensor, total: Tensor, skip: int = 0) -> None:
        """Σ over every sample of the summed-loss products, written into ``total`` (m, P) and
        summed there (in its dtype); no host synchronisation. With ``skip``, the first ``skip``
        chunks are left out and the others' products added to what ``total`` holds."""
        tangents = self._tangents(block)
        slots = self._slots(total)
        batch_hvp = self._batch_product(engine)
        self._count(matvecs=0, passes=1)
        empty = skip == 0
        with self._prepared_model():
            for x, y in self._batches.chunks_after(skip):
                pieces = batch_hvp(x, y, tangents)
                for slot, piece in zip(slots, pieces, strict=True):
                    if empty:
                        slot.copy_(piece)
                    else:
                        slot.add_(piece)
                empty = False
        # every batch source holds a sample (checked when the data is counted): total is written

    def _tangents(self, block: Tensor) -> tuple[Tensor, ...]:
        """The columns of ``block`` (P, m) cut into per-parameter pieces of shape (m, *shape)."""
        m = block.shape[1]
        # the model's dtype for the model (a no-op unless it runs in bfloat16 or float16)
        block = block.to(self._model_dtype)
        return tuple(
            piece.reshape(m, *p.shape)
            for piece, p in zip(block.t().split(self._numels, dim=1), self._params, strict=True)
        )

    def _slots(self, total: Tensor) -> list[Tensor]:
        """Views of ``total`` (m, P) per parameter, (m, *shape): products are written in place,
        never concatenated (splitting the unit-stride dimension always gives a view)."""
        m = total.shape[0]
        return [
            piece.view(m, *p.shape)
            for piece, p in zip(total.split(self._numels, dim=1), self._params, strict=True)
        ]

    def _free_memory(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def check_label_range(self, logits: Tensor) -> None:
        """Refuse labels outside [0, K) for curvcal's own losses, whose labels index the K
        columns of ``logits`` (else torch's own error on the CPU, and on CUDA a device-side
        assert that leaves the device unusable). Called where this operator's logits first meet
        its labels; the labels' range is the one :class:`Batches` read once, and K is a shape,
        so no call reads the device."""
        if self._labels_fit:
            return
        label_range = self._batches.label_range
        n_classes = int(logits.shape[-1])
        if label_range is not None and (label_range[0] < 0 or label_range[1] >= n_classes):
            raise InputError(
                "batches",
                f"labels must lie in [0, {n_classes}) for the model's {n_classes} logits, "
                f"found {label_range[0]}..{label_range[1]}",
                "a loss of your own (loss=callable) may read labels otherwise",
            )
        self._labels_fit = True

    def _prepared_model(self) -> AbstractContextManager[None]:
        return prepared_model(self.model, self.mode, self.allow_tf32)
