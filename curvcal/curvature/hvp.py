"""The Hessian of a classifier's mean loss over a whole dataset, as a linear operator.

H = ∇²_θ L(θ) with L(θ) = (1/N) Σ_{i=1..N} ℓ(f_θ(x_i), y_i), θ the selected parameters
flattened in ``model.named_parameters()`` order. A product H·V is accumulated batch by batch:
each batch contributes the Hessian-vector product of its *summed* loss, and the total is divided
by N once — the same as weighting each batch's mean-loss product by (batch size)/N, so the result
does not depend on how the data is batched.

Two engines compute a batch's products:

* ``func`` — forward-over-reverse: ``torch.func.jvp`` of ``torch.func.grad`` of a
  ``functional_call`` of the model, vectorised over the probe vectors with ``torch.func.vmap``;
* ``autograd`` — double backward: ``torch.autograd.grad`` with ``create_graph=True``, then one
  more ``grad`` per probe vector against the kept graph. Works on TorchScript modules too.

``engine="auto"`` picks per product, by what was measured on the CPU (one thread): ``autograd``
for a single vector (on the bundled CNN 110 ms against 146 ms for ``func``: forward-mode
differentiation of a convolution's backward costs about three convolution backwards where double
backward needs two, and the ``torch.func`` transforms add a fixed cost per call), and ``func`` for
a block of several vectors, where ``vmap`` shares the forward and first backward among them (75
ms a vector against 117 ms for a block of 8). When ``torch.func`` cannot trace the model
(TorchScript, custom autograd Functions without ``setup_context``, BatchNorm in train mode) auto
falls back to ``autograd`` for good and says why in ``engine_fallback``.
During products ``scaled_dot_product_attention`` is held to its composite "math" kernel: the fused
kernels have neither a second derivative nor a forward-mode rule.
Both engines are exact; ``engine`` reports the ones that ran (``"autograd"``, ``"func"`` or
``"autograd+func"``).

The caller's model is never altered: the training flags of its modules and the values of its
buffers are restored after every product, and no ``.grad`` is written.

Scale. Inside a pass over the data nothing waits on the device: per-batch products are summed
on the device and the host reads one scalar per product (the finiteness check) — the scalars the
stopping rules of the algorithms need. On a CUDA out-of-memory error inside a pass, the pass is
discarded, every batch is split in half and the pass runs again (exact: products are sums over
samples), down to one sample per batch; ``oom_retries`` and ``batch_size_final`` record what
happened. TF32 matrix products are switched off during products unless ``allow_tf32=True``.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from curvcal.curvature.losses import cross_entropy_sum, focal_loss_sum
from curvcal.errors import InputError, NumericalError

CRITERIA = ("ce", "focal")
ENGINES = ("auto", "func", "autograd")
MODES = ("eval", "train")
CACHES = ("auto", "device", "host", "none")

Batch = tuple[Tensor, Tensor]
BatchSource = Iterable[Batch] | Callable[[], Iterator[Batch]]
AllReduce = Callable[[Tensor], Tensor]

# Share of free accelerator memory that cache="auto" may fill with batches.
_AUTO_CACHE_FRACTION = 0.25
# probe_batch="auto": the CPU default, the share of free CUDA memory the probes of one pass may
# use, and the largest block chosen (beyond it a pass gains nothing measurable).
_CPU_PROBE_BATCH = 8
_AUTO_PROBE_FRACTION = 0.5
_MAX_AUTO_PROBE_BATCH = 64


def is_out_of_memory(error: BaseException) -> bool:
    """True for a CUDA out-of-memory error, which a smaller batch may avoid.

    Never for an illegal memory access (or any other CUDA error): those leave the CUDA context
    unusable, and retrying would hide a bug.
    """
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    if "illegal memory access" in message:
        return False
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in message


def _is_torchscript(model: nn.Module) -> bool:
    return isinstance(model, torch.jit.ScriptModule)


def _stochastic_layers(model: nn.Module) -> list[str]:
    """Names of modules whose forward is random in training mode (dropout of any kind)."""
    found = []
    for name, module in model.named_modules():
        kind = getattr(module, "original_name", type(module).__name__)
        if isinstance(module, nn.modules.dropout._DropoutNd) or "Dropout" in str(kind):
            found.append(name or "<root>")
    return found


class _Batches:
    """The dataset as (x, y) batches on the compute device: counted once, cached when it fits.

    ``mode`` after construction is what runs: ``device`` (batches kept on the device and reused),
    ``host`` (kept in host memory, pinned on CUDA, moved per pass) or ``none`` (the source is
    iterated again for every pass and each batch moved with pinned memory).
    """

    def __init__(
        self,
        source: BatchSource,
        cache: str,
        device: torch.device,
        dtype: torch.dtype,
        all_reduce: AllReduce | None,
    ) -> None:
        if callable(source) and not isinstance(source, Iterable):
            self._fresh: Callable[[], Iterator[Batch]] = source
        elif isinstance(source, Iterable):
            if iter(source) is source:
                raise InputError(
                    "batches",
                    "an iterator can be read only once, and every Hessian product reads the data again",
                    "pass a list of (x, y) pairs, a DataLoader, or a function returning a fresh iterator",
                )
            self._fresh = lambda: iter(source)
        else:
            raise InputError(
                "batches",
                f"expected an iterable of (x, y) pairs or a callable, got {type(source).__name__}",
            )
        self.device = device
        self.dtype = dtype
        pinned = device.type == "cuda"
        budget = None
        if cache == "auto":
            if device.type == "cpu":
                budget = None  # the data is already in the memory it would be cached in
            else:
                free, _total = torch.cuda.mem_get_info(device)
                budget = int(free * _AUTO_CACHE_FRACTION)
        stored: list[Batch] | None = [] if cache in ("auto", "device", "host") else None
        used = 0
        n_local = 0
        n_batches = 0
        max_rows = 0
        for x, y in self._fresh():
            self._check(x, y, n_batches)
            n_local += int(y.shape[0])
            max_rows = max(max_rows, int(y.shape[0]))
            n_batches += 1
            if stored is None:
                continue
            if cache == "host":
                stored.append((x.pin_memory(), y.pin_memory()) if pinned else (x, y))
                continue
            used += x.numel() * x.element_size() + y.numel() * y.element_size()
            if budget is not None and used > budget:
                stored = None  # does not fit: stream instead
                continue
            stored.append(self._move(x, y))
        if n_batches == 0 or n_local == 0:
            raise InputError(
                "batches", "the dataset is empty", "give at least one (x, y) batch with one sample"
            )
        self.n_local = n_local
        self.n_batches = n_batches
        count = torch.tensor([float(n_local)], dtype=torch.float64, device=device)
        self.n_samples = round(float((all_reduce(count) if all_reduce else count).item()))
        self._stored = stored
        self.largest = max_rows
        self.limit: int | None = None  # rows per chunk after out-of-memory splits
        if stored is None:
            self.mode = "none"
        elif cache == "host":
            self.mode = "host"
        else:
            self.mode = "device"

    @staticmethod
    def _check(x: Any, y: Any, index: int) -> None:
        where = f"batches[{index}]"
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise InputError(where, "each batch must be a pair of tensors (inputs, labels)")
        if y.ndim != 1 or y.is_floating_point() or y.is_complex():
            raise InputError(
                where,
                f"labels must be a 1-D integer tensor, got {y.dtype} of shape {tuple(y.shape)}",
            )
        if x.ndim < 1 or x.shape[0] != y.shape[0]:
            raise InputError(
                where,
                f"inputs have {x.shape[0] if x.ndim else 0} rows but labels have {y.shape[0]}",
            )

    def _move(self, x: Tensor, y: Tensor) -> Batch:
        non_blocking = x.is_pinned()
        x = x.to(self.device, non_blocking=non_blocking)
        if x.is_floating_point():
            x = x.to(self.dtype)
        return x, y.to(self.device, non_blocking=non_blocking)

    @property
    def batch_size(self) -> int:
        """The most rows a batch handed to a product has (after out-of-memory splits)."""
        return self.largest if self.limit is None else min(self.largest, self.limit)

    def halve(self) -> bool:
        """Split every batch in two (rows ⌈b/2⌉ at most); False when batches are one row already."""
        current = self.batch_size
        if current <= 1:
            return False
        self.limit = (current + 1) // 2
        return True

    def _chunks(self, x: Tensor, y: Tensor) -> Iterator[Batch]:
        if self.limit is None or y.shape[0] <= self.limit:
            yield x, y
            return
        yield from zip(x.split(self.limit), y.split(self.limit), strict=True)

    def _host_batches(self) -> Iterator[Batch]:
        if self.mode == "host":
            assert self._stored is not None
            yield from self._stored
            return
        pin = self.device.type == "cuda"
        for index, (x, y) in enumerate(self._fresh()):
            self._check(x, y, index)
            yield (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    def _streamed(self) -> Iterator[Batch]:
        """Host batches moved to the device; on CUDA the copy of the next batch runs on a side
        stream (pinned memory, non-blocking) while the current batch is being computed."""
        if self.device.type != "cuda":
            for x, y in self._host_batches():
                yield self._move(x, y)
            return
        side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)

        def start(batch: Batch) -> Batch:
            with torch.cuda.stream(side):
                return self._move(*batch)

        source = self._host_batches()
        ahead = next(source, None)
        pending = start(ahead) if ahead is not None else None
        while pending is not None:
            main.wait_stream(side)
            for tensor in pending:  # allocated on the side stream, used on the main one
                tensor.record_stream(main)
            current = pending
            following = next(source, None)
            pending = start(following) if following is not None else None
            yield current

    def __iter__(self) -> Iterator[Batch]:
        if self.mode == "device":
            assert self._stored is not None
            batches: Iterable[Batch] = self._stored
        else:
            batches = self._streamed()
        for x, y in batches:
            yield from self._chunks(x, y)

    def first(self) -> Batch:
        """The first batch as a product would see it."""
        return next(iter(self))


def engines_between(operator: HessianOperator, before: dict[str, int]) -> str:
    """The engines that multiplied vectors since ``before`` (a copy of ``engine_products``),
    joined by ``+`` in name order; empty when none did."""
    return "+".join(sorted(e for e, n in operator.engine_products.items() if n > before.get(e, 0)))


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
        the dataset: a re-iterable of ``(x, y)`` tensor pairs (a list, a DataLoader) or a callable
        returning a fresh iterator of them; ``y`` holds integer class labels.
    criterion:
        ``"ce"`` (cross-entropy, default) or ``"focal"``: −(1 − p_y)^γ log p_y with γ = ``gamma``.
    params:
        ``None`` for every parameter with ``requires_grad``, or glob patterns matched against
        ``named_parameters()`` names (``["fc.*"]``); each pattern must match at least one.
    engine:
        ``"auto"``, ``"func"`` (forward-over-reverse) or ``"autograd"`` (double backward).
    mode:
        ``"eval"`` (default: BatchNorm running statistics, dropout off) or ``"train"`` (refused
        when the model has dropout layers, which would make the loss random).
    cache:
        ``"auto"`` (keep batches on the device when they fit in a quarter of its free memory,
        otherwise stream), ``"device"``, ``"host"`` or ``"none"``.
    device:
        where the batches go; defaults to, and must equal, the device of the parameters (the
        model is never moved).
    probe_batch:
        how many vectors share one pass over the data (vectorised); bounds memory. ``"auto"``:
        8 on the CPU; on CUDA, from the free memory (``torch.cuda.mem_get_info``) and the
        measured peak memory of a one- and a two-vector product on the first batch, at most 64.
        The value chosen is :attr:`probe_batch` (:attr:`probe_batch_requested` keeps ``"auto"``).
    all_reduce:
        a sum across processes (for a dataset sharded over ranks), applied to the sample count
        at construction and to every product's batch sum; ``None`` in one process.
    allow_tf32:
        let CUDA matrix products and convolutions use TF32 (about 10 mantissa bits) during
        products; off by default, and the global flags are restored afterwards.

    Floating-point inputs are cast to the parameters' dtype. ``n_matvecs`` counts vectors
    multiplied, ``n_data_passes`` passes over the data (products, retried passes and
    :meth:`mean_loss`); ``total_matvecs`` and ``total_data_passes`` add those of the blocks made
    by :meth:`restrict`; ``oom_retries`` counts the passes run again after an out-of-memory
    error, ``batch_size_final`` the most samples a batch held in the last pass.
    """

    def __init__(
        self,
        model: nn.Module,
        batches: BatchSource,
        criterion: str = "ce",
        gamma: float = 0.0,
        params: Sequence[str] | None = None,
        engine: str = "auto",
        mode: str = "eval",
        cache: str = "auto",
        device: torch.device | str | None = None,
        probe_batch: int | str = 8,
        all_reduce: AllReduce | None = None,
        allow_tf32: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InputError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
        if criterion not in CRITERIA:
            raise InputError(
                "criterion",
                f"unknown criterion {criterion!r}",
                f"choose one of {', '.join(CRITERIA)}",
            )
        if not gamma >= 0.0 or gamma == float("inf"):
            raise InputError("gamma", f"the focal parameter must be finite and ≥ 0, got {gamma}")
        if criterion == "ce" and gamma != 0.0:
            raise InputError(
                "gamma",
                f"gamma={gamma} is only used by criterion 'focal'",
                "pass criterion='focal'",
            )
        if engine not in ENGINES:
            raise InputError(
                "engine", f"unknown engine {engine!r}", f"choose one of {', '.join(ENGINES)}"
            )
        if mode not in MODES:
            raise InputError("mode", f"unknown mode {mode!r}", "choose 'eval' or 'train'")
        if cache not in CACHES:
            raise InputError(
                "cache", f"unknown cache mode {cache!r}", f"choose one of {', '.join(CACHES)}"
            )
        if probe_batch != "auto" and (
            isinstance(probe_batch, bool) or not isinstance(probe_batch, int) or probe_batch < 1
        ):
            raise InputError(
                "probe_batch", f"must be a positive integer or 'auto', got {probe_batch!r}"
            )
        if mode == "train":
            stochastic = _stochastic_layers(model)
            if stochastic:
                raise InputError(
                    "mode",
                    f"train mode with dropout ({', '.join(stochastic)}) makes the loss random, so its Hessian is undefined",
                    "use mode='eval'",
                )
        scripted = _is_torchscript(model)
        if engine == "func" and scripted:
            raise InputError(
                "engine",
                "torch.func cannot trace a TorchScript module",
                "use engine='autograd' (double backward) or 'auto'",
            )
        self.model = model
        self.criterion = criterion
        self.gamma = float(gamma)
        self.mode = mode
        self.probe_batch_requested = probe_batch
        self.probe_batch = probe_batch if isinstance(probe_batch, int) else _CPU_PROBE_BATCH
        self.allow_tf32 = bool(allow_tf32)
        self.oom_retries = 0
        self.requested_engine = engine
        self.engine_fallback: str | None = None
        self._func_usable = engine != "autograd" and not scripted
        #: vectors multiplied by each engine so far (``engine`` and per-stage reports read it)
        self.engine_products: dict[str, int] = {}
        self._all_reduce = all_reduce
        self._select(params)
        param_device = self._params[0].device
        wanted = torch.device(device) if device is not None else param_device
        same = wanted.type == param_device.type and wanted.index in (None, param_device.index)
        self._device = param_device  # "cuda" means the parameters' CUDA device
        if not same:
            raise InputError(
                "device",
                f"the model's parameters are on {param_device}, not {wanted}",
                "move the model before building the operator, or leave device unset",
            )
        self._batches = _Batches(batches, cache, self._device, self._dtype, all_reduce)
        self.n_matvecs = 0
        self.n_data_passes = 0
        self._totals = _Totals()
        if probe_batch == "auto" and self._device.type == "cuda":
            self.probe_batch = self._measure_probe_batch()

    # -- parameter selection ---------------------------------------------------------------
    def _select(self, patterns: Sequence[str] | None) -> None:
        trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
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
        self.param_names: tuple[str, ...] = tuple(n for n, _ in chosen)
        self._params: tuple[Tensor, ...] = tuple(p for _, p in chosen)
        self._numels = [p.numel() for p in self._params]
        self._dtype = chosen[0][1].dtype

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

    # -- operator interface ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        n = sum(self._numels)
        return (n, n)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def n_samples(self) -> int:
        """N, the number of samples the loss averages over (across all ranks)."""
        return self._batches.n_samples

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
    def cache_mode(self) -> str:
        """Where batches live between products: ``device``, ``host`` or ``none`` (streamed)."""
        return self._batches.mode

    def matvec(self, vector: Tensor) -> Tensor:
        """H·v for v of shape (P,)."""
        return self.matmat(vector.reshape(-1, 1)).reshape(-1)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def matmat(self, vectors: Tensor) -> Tensor:
        """H·V for V of shape (P, m), ``probe_batch`` columns per pass over the data."""
        n_params = self.shape[0]
        if vectors.ndim != 2 or vectors.shape[0] != n_params:
            raise InputError(
                "vectors", f"expected shape ({n_params}, m), got {tuple(vectors.shape)}"
            )
        vectors = vectors.to(device=self._device, dtype=self._dtype)
        columns = [
            self._product(vectors[:, start : start + self.probe_batch])
            for start in range(0, vectors.shape[1], self.probe_batch)
        ]
        if len(columns) == 1:
            return columns[0]
        return torch.cat(columns, dim=1) if columns else vectors.new_zeros((n_params, 0))

    # -- the products --------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        """The engines that have run (``"autograd"``, ``"func"``, ``"autograd+func"``); before the
        first product, the one a single vector would use."""
        return engines_between(self, {}) or self._engine_for(1)

    def _engine_for(self, width: int) -> str:
        if self.requested_engine == "func":
            return "func"
        if self.requested_engine == "auto" and self._func_usable and width > 1:
            return "func"
        return "autograd"

    def _product(self, block: Tensor) -> Tensor:
        engine = self._engine_for(block.shape[1])
        try:
            result = self._product_with(engine, block)
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
            engine = "autograd"
            result = self._product_with(engine, block)
        self.engine_products[engine] = self.engine_products.get(engine, 0) + block.shape[1]
        return result

    def _product_with(self, engine: str, block: Tensor) -> Tensor:
        m = block.shape[1]
        while True:
            try:
                total = self._pass(engine, block)
                break
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self._free_memory()
                if not self._batches.halve():
                    raise InputError(
                        "batches",
                        f"the device ran out of memory even with one sample per batch and {m} vector(s) per pass",
                        "lower probe_batch, use cache='host' or 'none', a smaller model, or a larger device",
                    ) from error
                self.oom_retries += 1
        if self._all_reduce is not None:
            total = self._all_reduce(total)
        self._count(matvecs=m, passes=0)  # the passes were counted by _pass
        result = total.div_(self.n_samples).t()
        # one host read per product: a NaN or Inf anywhere makes the sum non-finite
        if not bool(torch.isfinite(result.sum())) and not bool(torch.isfinite(result).all()):
            raise NumericalError(
                "hessian",
                "a Hessian-vector product is not finite (NaN or Inf)",
                "check the model and data for NaN, or use float64",
            )
        return result

    def _count(self, matvecs: int, passes: int) -> None:
        self.n_matvecs += matvecs
        self.n_data_passes += passes
        self._totals.matvecs += matvecs
        self._totals.data_passes += passes

    def mean_loss(self) -> float:
        """L(θ) = (1/N) Σ_i ℓ(f_θ(x_i), y_i), the loss whose Hessian this is (one pass, no grad).

        Raises :class:`NumericalError` when it is NaN or infinite: the Hessian would be too.
        """
        total = torch.zeros((), dtype=torch.float64, device=self._device)
        with self._prepared_model(), torch.no_grad():
            for x, y in self._batches:
                total += self._loss_sum(self.model(x), y).to(torch.float64)
        if self._all_reduce is not None:
            total = self._all_reduce(total)
        self._count(matvecs=0, passes=1)
        value = float(total) / self.n_samples
        if not math.isfinite(value):
            raise NumericalError(
                "loss",
                f"the mean {self.criterion} loss over the {self.n_samples} samples is {value}",
                "check the model's weights and the data for NaN or Inf, or use float64",
            )
        return value

    def _pass(self, engine: str, block: Tensor) -> Tensor:
        """Σ over every sample of the summed-loss products, shape (m, P); no host synchronisation."""
        m = block.shape[1]
        tangents = tuple(
            piece.reshape(m, *p.shape)
            for piece, p in zip(block.t().split(self._numels, dim=1), self._params, strict=True)
        )
        total = block.new_empty((m, self.shape[0]))
        # views of ``total`` per parameter: batch products are added in place, never concatenated
        slots = [
            piece.view(m, *p.shape)  # splits the unit-stride dimension: always a view
            for piece, p in zip(total.split(self._numels, dim=1), self._params, strict=True)
        ]
        batch_hvp = self._batch_hvp_func if engine == "func" else self._batch_hvp_autograd
        self._count(matvecs=0, passes=1)
        empty = True
        with self._prepared_model():
            for x, y in self._batches:
                pieces = batch_hvp(x, y, tangents)
                for slot, piece in zip(slots, pieces, strict=True):
                    if empty:
                        slot.copy_(piece)
                    else:
                        slot.add_(piece)
                empty = False
        return total  # every batch source holds a sample (checked when the data is counted)

    def _free_memory(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def _measure_probe_batch(self) -> int:
        """Vectors per pass that fit in a share of the free CUDA memory (see ``probe_batch``)."""
        x, y = self._batches.first()
        engine = self._engine_for(2)
        batch_hvp = self._batch_hvp_func if engine == "func" else self._batch_hvp_autograd
        peaks = []
        try:
            for m in (1, 2):
                tangents = tuple(
                    torch.zeros((m, *p.shape), dtype=p.dtype, device=p.device) for p in self._params
                )
                torch.cuda.synchronize(self._device)
                torch.cuda.reset_peak_memory_stats(self._device)
                before = torch.cuda.memory_allocated(self._device)
                with self._prepared_model():
                    batch_hvp(x, y, tangents)
                torch.cuda.synchronize(self._device)
                peaks.append(torch.cuda.max_memory_allocated(self._device) - before)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            self._free_memory()
            return 1
        self._free_memory()
        free, _total = torch.cuda.mem_get_info(self._device)
        per_probe = max(peaks[1] - peaks[0], 1)
        budget = free * _AUTO_PROBE_FRACTION - peaks[0]
        return int(min(_MAX_AUTO_PROBE_BATCH, max(1, budget // per_probe + 1)))

    def _loss_sum(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.criterion == "focal":
            return focal_loss_sum(logits, labels, self.gamma)
        return cross_entropy_sum(logits, labels)

    def _batch_hvp_func(
        self, x: Tensor, y: Tensor, tangents: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        frozen = {name: p.detach() for name, p in self.model.named_parameters()}
        primals = tuple(p.detach() for p in self._params)
        names = self.param_names

        def loss(selected: tuple[Tensor, ...]) -> Tensor:
            values = {**frozen, **dict(zip(names, selected, strict=True))}
            return self._loss_sum(torch.func.functional_call(self.model, values, (x,)), y)

        gradient = torch.func.grad(loss)

        def hvp(tangent: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            return torch.func.jvp(gradient, (primals,), (tangent,))[1]

        if tangents[0].shape[0] == 1:  # one vector: skip vmap's overhead
            return tuple(h.unsqueeze(0) for h in hvp(tuple(t[0] for t in tangents)))
        return torch.func.vmap(hvp)(tangents)

    def _batch_hvp_autograd(
        self, x: Tensor, y: Tensor, tangents: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        m = tangents[0].shape[0]
        with torch.enable_grad():
            loss = self._loss_sum(self.model(x), y)
            grads = torch.autograd.grad(loss, self._params, create_graph=True, allow_unused=True)
            outputs: list[list[Tensor]] = []
            for j in range(m):
                dot = sum(
                    (
                        (g * t[j]).sum()
                        for g, t in zip(grads, tangents, strict=True)
                        if g is not None
                    ),
                    start=loss.new_zeros(()),
                )
                if not dot.requires_grad:  # the gradient does not depend on these parameters
                    outputs.append([torch.zeros_like(p) for p in self._params])
                    continue
                second = torch.autograd.grad(
                    dot, self._params, retain_graph=j < m - 1, allow_unused=True
                )
                outputs.append(
                    [
                        torch.zeros_like(p) if h is None else h
                        for h, p in zip(second, self._params, strict=True)
                    ]
                )
        if m == 1:  # a view, not a copy (stacking copies the whole product)
            return tuple(h.unsqueeze(0) for h in outputs[0])
        return tuple(torch.stack([row[i] for row in outputs]) for i in range(len(self._params)))

    @contextmanager
    def _prepared_model(self) -> Iterator[None]:
        """Put the model in the requested mode (TF32 as allowed, attention through the
        differentiable-twice math kernel); restore its modes, buffers and the flags afterwards."""
        flags = [(module, module.training) for module in self.model.modules()]
        saved = [(buffer, buffer.detach().clone()) for buffer in self.model.buffers()]
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        try:
            self.model.train(self.mode == "train")
            torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
            torch.backends.cudnn.allow_tf32 = self.allow_tf32
            # fused attention kernels have no second derivative: use the composite one
            with sdpa_kernel([SDPBackend.MATH]):
                yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            for module, flag in flags:
                module.training = flag
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)
