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

``engine="auto"`` uses ``autograd`` for TorchScript modules and ``func`` otherwise, falling back
to ``autograd`` (and recording why in :attr:`HessianOperator.engine_fallback`) when ``func``
fails on the model.

The caller's model is never altered: the training flags of its modules and the values of its
buffers are restored after every product, and no ``.grad`` is written.
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

from curvcal.curvature.losses import cross_entropy_sum, focal_loss_sum
from curvcal.errors import CurvcalError, InputError, NumericalError

CRITERIA = ("ce", "focal")
ENGINES = ("auto", "func", "autograd")
MODES = ("eval", "train")
CACHES = ("auto", "device", "host", "none")

Batch = tuple[Tensor, Tensor]
BatchSource = Iterable[Batch] | Callable[[], Iterator[Batch]]
AllReduce = Callable[[Tensor], Tensor]

# Share of free accelerator memory that cache="auto" may fill with batches.
_AUTO_CACHE_FRACTION = 0.25


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
        for x, y in self._fresh():
            self._check(x, y, n_batches)
            n_local += int(y.shape[0])
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

    def __iter__(self) -> Iterator[Batch]:
        if self.mode == "device":
            assert self._stored is not None
            yield from self._stored
        elif self.mode == "host":
            assert self._stored is not None
            for x, y in self._stored:
                yield self._move(x, y)
        else:
            pin = self.device.type == "cuda"
            for index, (x, y) in enumerate(self._fresh()):
                self._check(x, y, index)
                if pin:
                    x, y = x.pin_memory(), y.pin_memory()
                yield self._move(x, y)


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
        how many vectors share one pass over the data (vectorised); bounds memory.
    all_reduce:
        a sum across processes (for a dataset sharded over ranks), applied to the sample count
        at construction and to every product's batch sum; ``None`` in one process.

    Floating-point inputs are cast to the parameters' dtype. ``n_matvecs`` counts vectors
    multiplied, ``n_data_passes`` passes over the data (products and :meth:`mean_loss`);
    ``total_matvecs`` and ``total_data_passes`` add those of the blocks made by :meth:`restrict`.
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
        probe_batch: int = 8,
        all_reduce: AllReduce | None = None,
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
        if isinstance(probe_batch, bool) or not isinstance(probe_batch, int) or probe_batch < 1:
            raise InputError("probe_batch", f"must be a positive integer, got {probe_batch!r}")
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
        self.probe_batch = probe_batch
        self.requested_engine = engine
        self.engine = "autograd" if (scripted or engine == "autograd") else "func"
        self.engine_fallback: str | None = None
        self._engine_settled = engine != "auto" or scripted
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
        return torch.cat(columns, dim=1) if columns else vectors.new_zeros((n_params, 0))

    # -- the products --------------------------------------------------------------------------
    def _product(self, block: Tensor) -> Tensor:
        if not self._engine_settled:
            try:
                result = self._product_with(self.engine, block)
            except CurvcalError:
                raise
            except Exception as error:  # torch.func cannot handle this model: double backward
                self.engine_fallback = f"{type(error).__name__}: {error}".splitlines()[0]
                self.engine = "autograd"
                result = self._product_with(self.engine, block)
            self._engine_settled = True
            return result
        return self._product_with(self.engine, block)

    def _product_with(self, engine: str, block: Tensor) -> Tensor:
        m = block.shape[1]
        tangents = tuple(
            piece.reshape(m, *p.shape)
            for piece, p in zip(block.t().split(self._numels, dim=1), self._params, strict=True)
        )
        total = block.new_zeros((m, self.shape[0]))
        batch_hvp = self._batch_hvp_func if engine == "func" else self._batch_hvp_autograd
        with self._prepared_model():
            for x, y in self._batches:
                pieces = batch_hvp(x, y, tangents)
                total += torch.cat([piece.reshape(m, -1) for piece in pieces], dim=1)
        if self._all_reduce is not None:
            total = self._all_reduce(total)
        self._count(m)
        result = (total / self.n_samples).t()
        if not bool(torch.isfinite(result).all()):
            raise NumericalError(
                "hessian",
                "a Hessian-vector product is not finite (NaN or Inf)",
                "check the model and data for NaN, or use float64",
            )
        return result

    def _count(self, matvecs: int) -> None:
        self.n_matvecs += matvecs
        self.n_data_passes += 1
        self._totals.matvecs += matvecs
        self._totals.data_passes += 1

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
        self._count(0)
        value = float(total) / self.n_samples
        if not math.isfinite(value):
            raise NumericalError(
                "loss",
                f"the mean {self.criterion} loss over the {self.n_samples} samples is {value}",
                "check the model's weights and the data for NaN or Inf, or use float64",
            )
        return value

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
        return tuple(torch.stack([row[i] for row in outputs]) for i in range(len(self._params)))

    @contextmanager
    def _prepared_model(self) -> Iterator[None]:
        """Put the model in the requested mode; restore its modes and buffers afterwards."""
        flags = [(module, module.training) for module in self.model.modules()]
        saved = [(buffer, buffer.detach().clone()) for buffer in self.model.buffers()]
        try:
            self.model.train(self.mode == "train")
            yield
        finally:
            for module, flag in flags:
                module.training = flag
            with torch.no_grad():
                for buffer, value in saved:
                    buffer.copy_(value)
