"""Hessian benchmark: curvcal against PyHessian, hessian-eigenthings and curvlinops.

Runs every library on the same model and the same batches in one process, on the CPU with one
thread, and prints for each run the error against an exact float64 reference, the number of
Hessian-vector products (HVPs), the wall time and the peak memory, then checks curvcal's targets:

* λ1 by float32 Lanczos to a relative residual ≤ 1e-6 (and ≤ 1e-6 relative error) in ≤ 0.5×
  the wall time of PyHessian at its tol 1e-4;
* trace by the default (``--trace-method auto --probes 100``: the exact Gauss–Newton trace where
  the logits are linear in each parameter tensor, as in the DigitsCNN and ResNet-18, else the
  Gauss–Newton part exact and Hutch++ on the rest with the products left, as in the tanh MLP)
  to ≤ 1% error, in ≤ 0.5× PyHessian's 100-probe time;
* peak memory of a λ1 or trace run ≤ 2× the peak of one HVP;
* one HVP ≤ 1.1× one double backward (the plain ``autograd.grad(create_graph=True)`` recipe).

Cases (the loss is the mean cross-entropy over the whole dataset, model in eval mode):

* ``mlp`` — a 64-32-10 tanh MLP trained here (seeded) on the bundled digits data; its Hessian is
  small enough to build densely in float64, so λ1 and the trace have exact references
  (``torch.linalg.eigvalsh``, ``torch.trace``).
* ``digits-cnn`` — the bundled ``DigitsCNN`` (9,802 parameters) on the bundled 797 samples; λ1
  reference by ARPACK (``scipy.sparse.linalg.eigsh``, tol 1e-13) on curvcal's float64 operator.
  An exact trace needs one HVP per parameter (about 40 minutes here); ``--exact-trace`` computes
  it, and ``--dense-cache FILE`` reads it from the dense Hessian ``bench_trace.py --cache FILE``
  keeps; otherwise trace rows of this case show no error.
* ``resnet18``, ``vit`` — torchvision's ResNet-18 (11.2 M parameters) and a tiny
  VisionTransformer (75 k), random weights, 10 classes, on 64 CIFAR-size random images in batches
  of 32 (``scale_models.py``, shared with ``bench_scale.py``). No dense truth at this size: the λ1
  reference is curvcal's Lanczos on the float64 operator at tol 1e-8, and the trace reference,
  when ``--trace-reference M`` asks for one, a float64 Hutch++ of M products, quoted with its
  interval. Only the runs of the summary are made: curvcal's Lanczos, PyHessian at tol 1e-4,
  curvlinops' eigsh, the two 100-product traces and the one-product rows.
* ``tiny`` — a 6-5-3 MLP on 60 synthetic samples (used by the smoke test).

Batches of 100 over N = 797 (last batch 97; ``--quick``: 197 samples, same last batch) expose
estimators that average batch means without weighting them by size; hessian-eigenthings is also
run on batches of 132 (last batch 5) to show that bias plainly.

Every library runs in float32 (how they are used); curvcal also runs in float64 for comparison
(its Lanczos keeps the Krylov basis and the Rayleigh–Ritz step in float64 even with float32
products, which is what lets float32 reach a 1e-6 residual). Timings are the minimum over
``--repeats`` rounds; within a round curvcal and the peers are interleaved. Peak memory is the
growth of the resident set (VmHWM − VmRSS before the run, reset through
``/proc/self/clear_refs``) in a fresh subprocess per run, after the same run on the tiny case has
loaded the code it needs: it counts everything the run allocates (tensors, NumPy/ARPACK work
arrays, allocator overhead), not the libraries' code.

Usage::

    python benchmarks/bench_hessian.py [--quick] [--repeats N] [--json OUT]
                                       [--cases mlp,digits-cnn] [--no-peers] [--no-memory]
                                       [--tasks lambda_max,trace,hvp] [--trace-reference M]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import curvcal
from curvcal.curvature import HessianOperator, eigenvalues, exact_trace, trace_estimate
from curvcal.curvature.analysis import choose_trace_method
from curvcal.curvature.gauss_newton import gauss_newton_trace
from curvcal.curvature.residual import METHODS as SPLIT_METHODS
from curvcal.curvature.residual import split_trace
from curvcal.losses import CrossEntropy, Loss
from curvcal.settings.hessian import HessianSettings

Batch = tuple[Tensor, Tensor]

PEERS = {
    "pyhessian": ("pyhessian", "PyHessian"),
    "eigenthings": ("hessian_eigenthings", "hessian-eigenthings"),
    "curvlinops": ("curvlinops", "curvlinops-for-pytorch"),
}
DIST_NAMES = {
    "pyhessian": "PyHessian",
    "eigenthings": "hessian-eigenthings",
    "curvlinops": "curvlinops-for-pytorch",
}


def peer_available(module: str) -> bool:
    """True when ``module`` can be imported (peers are imported lazily, only when run)."""
    return importlib.util.find_spec(module) is not None


def peer_version(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST_NAMES[library])
    except PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    """A model, its batches and the exact references for its Hessian."""

    name: str
    description: str
    model: nn.Module  # float32, eval mode; every run gets a deep copy
    batches: list[Batch]
    short_batches: list[Batch]  # the same data with one very short last batch
    n_params: int
    n_samples: int
    lambda_max: float = math.nan
    lambda_2: float = math.nan
    trace: float = math.nan
    reference: str = ""
    math_attention: bool = False  # peers need the composite attention kernel (double backward)
    trace_half_width: float = math.nan  # of an estimated trace reference (95%)

    def fresh(self, dtype: torch.dtype = torch.float32) -> nn.Module:
        return copy.deepcopy(self.model).to(dtype).eval()

    def batches_as(self, dtype: torch.dtype) -> list[Batch]:
        return [(x.to(dtype), y) for x, y in self.batches]


def _split(x: Tensor, y: Tensor, size: int) -> list[Batch]:
    return list(zip(x.split(size), y.split(size), strict=True))


def _short_size(n_samples: int) -> int:
    """A batch size that leaves a last batch of 5 samples (797 = 6 × 132 + 5, 197 = 3 × 64 + 5)."""
    return 132 if n_samples == 797 else 64


def _digits(n_samples: int | None) -> tuple[Tensor, Tensor]:
    from curvcal.load.data import load_dataset
    from curvcal.settings.data import DataSettings

    data = load_dataset(DataSettings(data="curvcal:digits"))
    x, y = data.dataset.x.float(), data.dataset.y.long()  # type: ignore[attr-defined]
    if n_samples is not None:
        x, y = x[:n_samples], y[:n_samples]
    return x, y


def _train(model: nn.Module, x: Tensor, y: Tensor, steps: int, seed: int) -> nn.Module:
    """Full-batch Adam on the mean cross-entropy, seeded: the same weights on every run."""
    torch.manual_seed(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    for p in model.parameters():
        p.grad = None
    return model.eval()


def dense_reference(model: nn.Module, batches: Sequence[Batch]) -> tuple[Tensor, float]:
    """(eigenvalues, trace) of :func:`dense_hessian`."""
    hessian = dense_hessian(model, batches)
    return torch.linalg.eigvalsh(hessian), float(torch.trace(hessian))


def dense_hessian(
    model: nn.Module, batches: Sequence[Batch], loss_sum: Loss | None = None
) -> Tensor:
    """The float64 Hessian of the mean loss (``loss_sum``: cross-entropy), assembled row block
    by row block with plain double backward (``autograd.grad`` of the gradient against unit
    vectors)."""
    model64 = copy.deepcopy(model).double()
    params = list(model64.parameters())
    n_params = sum(p.numel() for p in params)
    n_samples = sum(int(y.shape[0]) for _, y in batches)
    hessian = torch.zeros(n_params, n_params, dtype=torch.float64)
    chunk = 256
    for x, y in batches:
        loss = (loss_sum or CrossEntropy()).sum(model64(x.double()), y)
        gradient = torch.cat(
            [
                g.reshape(-1)
                for g in torch.autograd.grad(
                    loss, params, create_graph=True, materialize_grads=True
                )
            ]
        )
        for start in range(0, n_params, chunk):
            stop = min(start + chunk, n_params)
            units = torch.zeros(stop - start, n_params, dtype=torch.float64)
            units[torch.arange(stop - start), torch.arange(start, stop)] = 1.0
            rows = torch.autograd.grad(
                gradient,
                params,
                grad_outputs=units,
                is_grads_batched=True,
                retain_graph=True,
                materialize_grads=True,
            )
            # an unused tensor's materialised zeros come unbatched
            hessian[start:stop] += torch.cat(
                [
                    r.reshape(stop - start, -1)
                    if r.shape != p.shape
                    else r.new_zeros(stop - start, p.numel())
                    for r, p in zip(rows, params, strict=True)
                ],
                dim=1,
            )
    return (hessian + hessian.t()) / (2 * n_samples)


def arpack_reference(model: nn.Module, batches: Sequence[Batch]) -> tuple[float, float, int]:
    """λ1, λ2 of the float64 Hessian by ARPACK (eigsh, which='LA', tol 1e-13) on curvcal's operator."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    operator = HessianOperator(copy.deepcopy(model).double(), list(batches))
    n = operator.shape[0]

    def matvec(v: np.ndarray) -> np.ndarray:
        return operator.matvec(torch.from_numpy(np.ascontiguousarray(v).reshape(-1))).numpy()

    values = eigsh(
        LinearOperator((n, n), matvec=matvec, dtype=np.float64),
        k=2,
        which="LA",
        tol=1e-13,
        return_eigenvectors=False,
        v0=np.ones(n) / math.sqrt(n),
    )
    top = sorted(values.tolist(), reverse=True)
    return top[0], top[1], operator.n_matvecs


LARGE = {"resnet18": "resnet18", "vit": "vit_tiny"}  # case -> scale_models.MODELS key


def _shared(name: str) -> ModuleType:
    """A sibling module of this script (``benchmarks/`` is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def lanczos_reference(model: nn.Module, batches: Sequence[Batch]) -> tuple[float, float, int]:
    """λ1, λ2 of the float64 Hessian by curvcal's Lanczos at tol 1e-8 (no dense truth at scale)."""
    operator = HessianOperator(copy.deepcopy(model).double(), list(batches))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spectrum = eigenvalues(operator, 2, method="lanczos", tol=1e-8, max_iter=300, seed=10_000)
    values = sorted((v.value for v in spectrum.values), reverse=True)
    return values[0], values[1], operator.n_matvecs


def build_case(
    name: str,
    quick: bool,
    exact_trace_cnn: bool = False,
    truth: bool = True,
    dense_cache: str | None = None,
    trace_reference: int = 0,
) -> Case:
    if name == "tiny":
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(60, 6, generator=generator)
        y = torch.randint(0, 3, (60,), generator=generator)
        torch.manual_seed(0)
        model = _train(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), x, y, 50, 0)
        batches, short = _split(x, y, 16), _split(x, y, 11)
        description = "6-5-3 tanh MLP, 60 synthetic samples, batches of 16 (last 12)"
    elif name == "mlp":
        x, y = _digits(197 if quick else None)
        x = x.reshape(x.shape[0], -1)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
        model = _train(model, x, y, 200, 0)
        batches, short = _split(x, y, 100), _split(x, y, _short_size(x.shape[0]))
        description = f"64-32-10 tanh MLP on {x.shape[0]} digits, batches of 100 (last {y.shape[0] % 100 or 100}); short-batch split: batches of {_short_size(x.shape[0])} (last 5)"
    elif name == "digits-cnn":
        from curvcal.assets import demo_checkpoint
        from curvcal.load.checkpoint import load_model
        from curvcal.settings.checkpoint import CheckpointSettings

        x, y = _digits(197 if quick else None)
        model = load_model(demo_checkpoint(), CheckpointSettings(device="cpu")).module
        batches, short = _split(x, y, 100), _split(x, y, _short_size(x.shape[0]))
        description = f"bundled DigitsCNN on {x.shape[0]} bundled digits, batches of 100 (last {y.shape[0] % 100 or 100}); short-batch split: batches of {_short_size(x.shape[0])} (last 5)"
    elif name in LARGE:
        shared = _shared("scale_models")
        samples, batch = (8, 4) if quick else (64, 32)
        torch.manual_seed(0)  # random weights, the same on every run
        model = shared.MODELS[LARGE[name]]()
        batches = shared.fake_data(samples, batch, torch.device("cpu"))
        short = batches
        title = "torchvision ResNet-18" if name == "resnet18" else "tiny ViT (2 layers, width 64)"
        description = (
            f"{title}, random weights, {samples} random 3×32×32 images, batches of {batch}"
        )
    else:
        raise SystemExit(
            f"bench_hessian: unknown case {name!r} (mlp, digits-cnn, resnet18, vit, tiny)"
        )
    model = model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    case = Case(
        name, description, model, batches, short, n_params, int(sum(b[1].shape[0] for b in batches))
    )
    case.math_attention = name == "vit"
    if not truth:
        return case
    if name in LARGE:
        case.lambda_max, case.lambda_2, used = lanczos_reference(model, batches)
        case.reference = f"curvcal Lanczos on the float64 operator, tol 1e-8 ({used} HVPs)"
        if trace_reference:
            operator = HessianOperator(case.fresh(torch.float64), case.batches)
            result = trace_estimate(operator, trace_reference, seed=10_000)
            case.trace, case.trace_half_width = result.estimate, result.half_width
            case.reference += (
                f"; trace: float64 Hutch++ of {trace_reference} products, "
                f"{result.estimate:.6g} ± {result.half_width:.2g} (95%)"
            )
    elif name in ("tiny", "mlp"):
        values, trace = dense_reference(model, batches)
        case.lambda_max, case.lambda_2, case.trace = float(values[-1]), float(values[-2]), trace
        case.reference = (
            "dense float64 Hessian (double backward against unit vectors), eigvalsh and trace"
        )
    else:
        case.lambda_max, case.lambda_2, used = arpack_reference(model, batches)
        case.reference = f"ARPACK eigsh on curvcal's float64 operator, tol 1e-13 ({used} HVPs)"
        if dense_cache and not quick and os.path.exists(dense_cache):
            case.trace = float(torch.trace(torch.load(dense_cache)))
            case.reference += "; exact trace of the dense float64 Hessian (bench_trace.py)"
        elif exact_trace_cnn:
            operator = HessianOperator(case.fresh(torch.float64), case.batches)
            case.trace = exact_trace(operator, probe_batch=32).estimate
            case.reference += f"; exact trace by {case.n_params} unit-vector HVPs"
    return case


# ---------------------------------------------------------------------------------------------
# runs


@dataclass
class Outcome:
    value: float
    hvps: int
    note: str = ""
    seconds: float | None = None  # the time of the product alone, when the run measures it itself
    residual: float = math.nan  # the relative residual curvcal reports for λ1


@dataclass
class Run:
    """One (task, library, setting) measured on one case."""

    task: str  # "lambda_max", "trace" or "hvp"
    library: str
    setting: str
    fn: Callable[[Case, int], Outcome]
    target_role: str = ""  # which target this run feeds, if any
    memory: str = ""  # peak memory measured: "always", "full" (not with --quick) or ""


def _counted(
    calls: list[int], method: Callable[..., Any], width: Callable[..., int]
) -> Callable[..., Any]:
    """Wrap ``method`` so that each call adds ``width(*args)`` to ``calls[0]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += width(*args)
        return method(*args, **kwargs)

    return wrapper


# -- curvcal ---------------------------------------------------------------------------------


def curvcal_lambda(
    method: str, tol: float, dtype: torch.dtype, engine: str = "auto"
) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        operator = HessianOperator(case.fresh(dtype), case.batches, hvp=engine)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spectrum = eigenvalues(operator, 1, method=method, tol=tol, max_iter=1000, seed=seed)
        result = spectrum.values[0]
        note = f"residual {result.residual:.1e}, stopped by {spectrum.stopped_by}"
        return Outcome(result.value, operator.n_matvecs, note, residual=result.residual)

    return run


def curvcal_auto_trace(n: int) -> Callable[[Case, int], Outcome]:
    """The default trace of ``curvcal hessian`` (``--trace-method auto``, ``--probes n``): the
    exact Gauss–Newton trace where the logits are linear in each tensor, else its Gauss–Newton
    part exact and Hutch++ on the rest, else Hutch++."""

    def run(case: Case, seed: int) -> Outcome:
        model = case.fresh()
        operator = HessianOperator(model, case.batches)
        settings = HessianSettings(probes=n, seed=seed)
        method, _why = choose_trace_method(operator, settings)
        if method == "gauss-newton":
            result = gauss_newton_trace(operator, checked=True)
            note = f"Gauss–Newton: {result.n_probes} sample–eigenvector norms, ± {result.half_width:.1e}"
        elif method in SPLIT_METHODS:
            result = split_trace(operator, method, n, seed=seed)
            note = (
                f"Gauss–Newton part exact + Hutch++ on the rest ({result.matvecs} products), "
                f"95% interval ± {100 * result.half_width / abs(result.estimate):.2g}%"
            )
        else:
            result = trace_estimate(operator, n, seed=seed)
            note = f"Hutch++, 95% interval ± {100 * result.half_width / abs(result.estimate):.2g}%"
        return Outcome(result.estimate, operator.total_matvecs, note)

    return run


def curvcal_trace(method: str, n: int) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        operator = HessianOperator(case.fresh(), case.batches)
        result = trace_estimate(operator, n, trace_method=method, seed=seed)
        return Outcome(
            result.estimate,
            operator.n_matvecs,
            f"95% interval ± {100 * result.half_width / abs(result.estimate):.2g}%",
        )

    return run


def _timed_product(product: Callable[[], Any], vectors: int) -> Outcome:
    """One warm-up product (first-call set-up), then the time of one more, per vector."""
    product()
    start = time.perf_counter()
    product()
    return Outcome(math.nan, vectors, seconds=(time.perf_counter() - start) / vectors)


def curvcal_hvp(engine: str, block: int) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        operator = HessianOperator(case.fresh(), case.batches, hvp=engine, probe_batch=block)
        vectors = torch.randn(case.n_params, block, generator=torch.Generator().manual_seed(seed))
        return _timed_product(lambda: operator.matmat(vectors), block)

    return run


def double_backward(case: Case, seed: int) -> Outcome:
    """One HVP by the textbook recipe: grad with create_graph, then grad of ⟨g, v⟩, per batch."""
    model = case.fresh()
    params = list(model.parameters())
    vector = torch.randn(case.n_params, generator=torch.Generator().manual_seed(seed))
    pieces = [
        v.reshape(p.shape)
        for v, p in zip(vector.split([p.numel() for p in params]), params, strict=True)
    ]

    def product() -> list[Tensor]:
        total = [torch.zeros_like(p) for p in params]
        for x, y in case.batches:
            loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
            grads = torch.autograd.grad(loss, params, create_graph=True)
            for acc, h in zip(
                total, torch.autograd.grad(grads, params, grad_outputs=pieces), strict=True
            ):
                acc += h
        return total

    return _timed_product(product, 1)


def gradient_pass(case: Case, seed: int) -> Outcome:
    """The floor a product is compared with: one gradient of the summed loss, per batch."""
    model = case.fresh()
    params = list(model.parameters())

    def product() -> None:
        for x, y in case.batches:
            loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
            torch.autograd.grad(loss, params)

    outcome = _timed_product(product, 1)
    outcome.hvps = 0
    return outcome


# -- PyHessian -----------------------------------------------------------------------------------


def _pyhessian(case: Case, batches: list[Batch] | None = None) -> tuple[Any, list[int]]:
    from pyhessian import hessian

    engine = hessian(
        case.fresh(), nn.CrossEntropyLoss(), dataloader=batches or case.batches, cuda=False
    )
    calls = [0]
    engine.dataloader_hv_product = _counted(calls, engine.dataloader_hv_product, lambda *a: 1)
    return engine, calls


def pyhessian_lambda(max_iter: int, tol: float) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        engine, calls = _pyhessian(case)
        torch.manual_seed(seed)
        values, _ = engine.eigenvalues(maxIter=max_iter, tol=tol, top_n=1)
        note = "hit maxIter" if calls[0] >= max_iter else ""
        return Outcome(float(values[0]), calls[0], note)

    return run


def pyhessian_trace(max_iter: int, tol: float) -> Callable[[Case, int], Outcome]:
    """PyHessian stops when |mean − previous mean| / (previous mean + 1e-6) < tol, without an
    absolute value in the denominator: a negative running mean stops it even at tol 0, so the
    fixed-budget runs pass tol = −inf."""

    def run(case: Case, seed: int) -> Outcome:
        engine, calls = _pyhessian(case)
        torch.manual_seed(seed)
        samples = engine.trace(maxIter=max_iter, tol=tol)
        note = f"stopped after {len(samples)} probes" if len(samples) < max_iter else ""
        return Outcome(float(np.mean(samples)), calls[0], note)

    return run


def pyhessian_hvp(case: Case, seed: int) -> Outcome:
    engine, _calls = _pyhessian(case)
    generator = torch.Generator().manual_seed(seed)
    vector = [torch.randn(p.shape, generator=generator) for p in engine.params]
    return _timed_product(lambda: engine.dataloader_hv_product(vector), 1)


# -- hessian-eigenthings --------------------------------------------------------------------------


def _eigenthings(
    case: Case, weighted: bool, batches: list[Batch] | None = None
) -> tuple[Any, list[int]]:
    """Their operator averages the per-batch losses over batches; ``weighted`` passes a loss of
    sum × (number of batches)/N instead, which makes that average the true mean over samples."""
    from hessian_eigenthings import HessianOperator as EigenthingsHessian
    from hessian_eigenthings import supervised_loss

    data = batches or case.batches
    if weighted:
        scale = len(data) / case.n_samples

        def loss_fn(model: nn.Module, batch: Batch) -> Tensor:
            x, y = batch
            return nn.functional.cross_entropy(model(x), y, reduction="sum") * scale

    else:
        loss_fn = supervised_loss(nn.CrossEntropyLoss())
    operator = EigenthingsHessian(case.fresh(), data, loss_fn)
    calls = [0]
    operator.matvec = _counted(calls, operator.matvec, lambda *a: 1)
    return operator, calls


def eigenthings_lanczos(
    max_iter: int | None, weighted: bool, short: bool = False
) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        from hessian_eigenthings import lanczos

        operator, calls = _eigenthings(case, weighted, case.short_batches if short else None)
        if max_iter is None:
            result = lanczos(operator, k=1, seed=seed)
        else:
            result = lanczos(
                operator, k=1, max_iter=max_iter, reorthogonalize=True, which="LA", seed=seed
            )
        note = "" if bool(result.converged[0]) else "flagged not converged"
        return Outcome(float(result.eigenvalues[0]), calls[0], note)

    return run


def eigenthings_power(case: Case, seed: int) -> Outcome:
    from hessian_eigenthings import power_iteration_one

    operator, calls = _eigenthings(case, weighted=False)
    value, _v, _r, _it, converged = power_iteration_one(operator, seed=seed)
    return Outcome(float(value), calls[0], "" if converged else "hit max_iter")


def eigenthings_trace(method: str, weighted: bool) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        from hessian_eigenthings import trace

        operator, calls = _eigenthings(case, weighted)
        result = trace(operator, num_matvecs=100, method=method, seed=seed)
        return Outcome(float(result.estimate), calls[0], f"± {result.stderr:.3g} (s.e.)")

    return run


def eigenthings_hvp(case: Case, seed: int) -> Outcome:
    operator, _calls = _eigenthings(case, weighted=True)
    vector = torch.randn(case.n_params, generator=torch.Generator().manual_seed(seed))
    return _timed_product(lambda: operator.matvec(vector), 1)


# -- curvlinops -----------------------------------------------------------------------------------


def _curvlinops(case: Case, check: bool) -> tuple[Any, list[int]]:
    from curvlinops import HessianLinearOperator

    model = case.fresh()
    params = [p for p in model.parameters() if p.requires_grad]
    calls = [0]
    operator = HessianLinearOperator(
        model, nn.CrossEntropyLoss(), params, case.batches, check_deterministic=False
    )
    # count from here on: the deterministic check below multiplies too
    operator._matmat = _counted(calls, operator._matmat, lambda m: int(m[0].shape[-1]))
    if check:
        operator._check_deterministic()
    return operator, calls


def curvlinops_lambda(check: bool, tol: float) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        from scipy.sparse.linalg import eigsh

        operator, calls = _curvlinops(case, check)
        v0 = (
            torch.randn(case.n_params, generator=torch.Generator().manual_seed(seed))
            .double()
            .numpy()
        )
        values = eigsh(
            operator.to_scipy(), k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False
        )
        return Outcome(float(values[0]), calls[0])

    return run


def curvlinops_trace(method: str, check: bool) -> Callable[[Case, int], Outcome]:
    def run(case: Case, seed: int) -> Outcome:
        from curvlinops import hutchinson_trace, hutchpp_trace

        operator, calls = _curvlinops(case, check)
        torch.manual_seed(seed)
        if method == "hutchinson":
            estimate = hutchinson_trace(operator, 100)
        else:
            estimate = hutchpp_trace(operator, 99)
        return Outcome(float(estimate), calls[0])

    return run


def curvlinops_hvp(case: Case, seed: int) -> Outcome:
    operator, _calls = _curvlinops(case, check=False)
    vector = torch.randn(case.n_params, generator=torch.Generator().manual_seed(seed))
    return _timed_product(lambda: operator @ vector, 1)


# -- the plan ---------------------------------------------------------------------------------------


TASKS = ("lambda_max", "trace", "hvp")


def plan(case_name: str) -> list[Run]:
    """Every run of one case, in the order they are interleaved within a round."""
    f32, f64 = torch.float32, torch.float64
    lam, tr, hvp = TASKS
    if case_name in LARGE:
        # the summary's runs only: one product costs 0.5–1 s on ResNet-18, so PyHessian's power
        # iteration is capped there (its note says when the cap stopped it)
        cap = 300 if case_name == "resnet18" else 1000
        # fmt: off
        return [
            Run(lam, "curvcal", "Lanczos, tol 1e-4 (default)", curvcal_lambda("lanczos", 1e-4, f32)),
            Run(lam, "pyhessian", "tol 1e-4", pyhessian_lambda(cap, 1e-4), "lambda_peer"),
            Run(lam, "curvcal", "Lanczos, tol 1e-6", curvcal_lambda("lanczos", 1e-6, f32), "lambda_fast"),
            Run(lam, "curvlinops", "eigsh on to_scipy() (default tol 0)", curvlinops_lambda(True, 0.0)),
            Run(tr, "curvcal", "auto, --probes 100 (default)", curvcal_auto_trace(100), "trace_ours"),
            Run(tr, "curvcal", "Hutch++, 100 HVPs", curvcal_trace("hutchpp", 100)),
            Run(tr, "pyhessian", "100 probes (tol -inf)", pyhessian_trace(100, -math.inf), "trace_peer"),
            Run(hvp, "reference", "gradient (autograd.grad once)", gradient_pass, "gradient", "always"),
            Run(hvp, "reference", "double backward (autograd.grad twice)", double_backward, "hvp_reference", "always"),
            Run(hvp, "curvcal", "engine auto (default), 1 vector", curvcal_hvp("auto", 1), "hvp_ours", "always"),
        ]
        # fmt: on
    # fmt: off
    return [
        Run(lam, "curvcal", "power, tol 1e-4", curvcal_lambda("power", 1e-4, f32), memory="always"),
        Run(lam, "curvcal", "Lanczos, tol 1e-4 (default)", curvcal_lambda("lanczos", 1e-4, f32), memory="full"),
        Run(lam, "curvcal", "Lanczos, tol 1e-6", curvcal_lambda("lanczos", 1e-6, f32), "lambda_fast", "always"),
        Run(lam, "curvcal", "Lanczos, tol 1e-6, float64", curvcal_lambda("lanczos", 1e-6, f64), memory="full"),
        Run(lam, "pyhessian", "default (maxIter 100, tol 1e-3)", pyhessian_lambda(100, 1e-3), memory="full"),
        Run(lam, "pyhessian", "tol 1e-4", pyhessian_lambda(1000, 1e-4), "lambda_peer"),
        Run(lam, "pyhessian", "tol 1e-5", pyhessian_lambda(1000, 1e-5)),
        Run(lam, "pyhessian", "tol 1e-6", pyhessian_lambda(1000, 1e-6)),
        Run(lam, "eigenthings", "lanczos default (k=1: 2 steps)", eigenthings_lanczos(None, False), memory="full"),
        Run(lam, "eigenthings", "power_iteration_one default", eigenthings_power),
        Run(lam, "eigenthings", "lanczos 25 steps, reorth., size-weighted loss", eigenthings_lanczos(25, True)),
        Run(lam, "eigenthings", "lanczos 25 steps, reorth., short last batch (5)",
            eigenthings_lanczos(25, False, short=True)),
        Run(lam, "eigenthings", "same, short last batch, size-weighted loss",
            eigenthings_lanczos(25, True, short=True)),
        Run(lam, "curvlinops", "eigsh on to_scipy() (default tol 0)", curvlinops_lambda(True, 0.0), memory="full"),
        Run(lam, "curvlinops", "eigsh tol 1e-6, no determinism check", curvlinops_lambda(False, 1e-6)),
        Run(tr, "curvcal", "auto, --probes 100 (default)", curvcal_auto_trace(100), "trace_ours", "always"),
        Run(tr, "curvcal", "Hutch++, 100 HVPs", curvcal_trace("hutchpp", 100), memory="full"),
        Run(tr, "curvcal", "XTrace, 100 HVPs", curvcal_trace("xtrace", 100), memory="full"),
        Run(tr, "curvcal", "Hutchinson, 100 probes", curvcal_trace("hutchinson", 100), memory="full"),
        Run(tr, "pyhessian", "default (maxIter 100, tol 1e-3)", pyhessian_trace(100, 1e-3)),
        Run(tr, "pyhessian", "100 probes (tol -inf)", pyhessian_trace(100, -math.inf), "trace_peer", "full"),
        Run(tr, "eigenthings", "trace default (Hutch++, 99 HVPs)", eigenthings_trace("hutchpp", False), memory="full"),
        Run(tr, "eigenthings", "Hutch++ 99, size-weighted loss", eigenthings_trace("hutchpp", True)),
        Run(tr, "curvlinops", "hutchinson_trace, 100", curvlinops_trace("hutchinson", False), memory="always"),
        Run(tr, "curvlinops", "hutchpp_trace, 99", curvlinops_trace("hutchpp", False), memory="full"),
        Run(hvp, "reference", "gradient (autograd.grad once)", gradient_pass, "gradient", "always"),
        Run(hvp, "reference", "double backward (autograd.grad twice)", double_backward, "hvp_reference", "always"),
        Run(hvp, "curvcal", "engine auto (default), 1 vector", curvcal_hvp("auto", 1), "hvp_ours", "always"),
        Run(hvp, "curvcal", "engine func, 1 vector", curvcal_hvp("func", 1), memory="full"),
        Run(hvp, "curvcal", "engine auto (default), block of 8 (per vector)", curvcal_hvp("auto", 8), memory="full"),
        Run(hvp, "pyhessian", "dataloader_hv_product", pyhessian_hvp),
        Run(hvp, "eigenthings", "operator.matvec", eigenthings_hvp),
        Run(hvp, "curvlinops", "H @ v", curvlinops_hvp),
    ]
    # fmt: on


# ---------------------------------------------------------------------------------------------
# measuring


@dataclass
class Row:
    case: str
    task: str
    library: str
    setting: str
    value: float
    rel_error: float  # worst over rounds; NaN without a reference
    hvps: int
    seconds: float  # best over rounds
    seconds_all: list[float] = field(default_factory=list)
    peak_mib: float = math.nan
    note: str = ""
    target_role: str = ""
    residual: float = math.nan  # worst over rounds, for curvcal's λ1 rows


def _reference(case: Case, task: str) -> float:
    return case.lambda_max if task == "lambda_max" else case.trace if task == "trace" else math.nan


def _kernels(case: Case, run: Run) -> contextlib.AbstractContextManager[Any]:
    """The composite attention kernel for runs that differentiate attention twice by hand: the
    fused CPU kernel has no second derivative. curvcal selects it by itself, so it is left out."""
    if case.math_attention and run.library != "curvcal":
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def measure(
    case: Case, runs: Sequence[Run], repeats: int, peers: bool, log: Callable[[str], None]
) -> list[Row]:
    """Interleave the runs, ``repeats`` rounds (round r uses seed r); one Row per run."""
    rows: dict[int, Row] = {}
    for round_index in range(repeats):
        for index, run in enumerate(runs):
            module = PEERS.get(run.library, (None,))[0]
            if module is not None and (not peers or not peer_available(module)):
                status = "skipped (--no-peers)" if not peers else "not installed"
                rows[index] = Row(
                    case.name,
                    run.task,
                    run.library,
                    run.setting,
                    math.nan,
                    math.nan,
                    0,
                    math.nan,
                    note=status,
                )
                continue
            model_note = ""
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(), _kernels(case, run):
                    warnings.simplefilter("ignore")  # peers' deprecation and create_graph notices
                    outcome = run.fn(case, round_index)
            except Exception as error:  # a peer failing is a result, not a crash of the benchmark
                model_note = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
                outcome = Outcome(math.nan, 0)
            seconds = time.perf_counter() - start if outcome.seconds is None else outcome.seconds
            reference = _reference(case, run.task)
            error = (
                abs(outcome.value - reference) / abs(reference)
                if math.isfinite(reference)
                else math.nan
            )
            row = rows.get(index)
            if row is None:
                row = Row(
                    case.name,
                    run.task,
                    run.library,
                    run.setting,
                    outcome.value,
                    error,
                    outcome.hvps,
                    seconds,
                    note=model_note or outcome.note,
                    target_role=run.target_role,
                    residual=outcome.residual,
                )
                rows[index] = row
            else:
                if math.isfinite(error) and not (error <= row.rel_error):
                    row.rel_error = error
                row.seconds = min(row.seconds, seconds)
                row.hvps = max(row.hvps, outcome.hvps)
                if not (outcome.residual <= row.residual):
                    row.residual = outcome.residual
                    row.note = model_note or outcome.note
            row.seconds_all.append(seconds)
            log(
                f"  [{case.name} round {round_index + 1}/{repeats}] {run.library:<11} {run.setting:<50} {seconds:7.2f} s"
            )
    return [rows[i] for i in range(len(runs))]


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def child_memory(case_name: str, quick: bool, run_index: int) -> dict[str, float]:
    """In a fresh process: build the case, warm up, reset the peak RSS, do one run, report the growth.

    The warm-up is the same run on the ``tiny`` case: it loads the code the run needs (library
    pages count in the resident set the first time they are touched) while allocating almost
    nothing, so the growth measured afterwards is the run's own working memory.
    """
    torch.set_num_threads(1)
    case = build_case(case_name, quick, truth=False)
    run = plan(case_name)[run_index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a peer may refuse the tiny case (as many probes as parameters): the warm-up is best effort
        with contextlib.suppress(Exception):
            run.fn(build_case("tiny", quick, truth=False), 0)
        before = _rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # VmHWM := VmRSS
        with _kernels(case, run):
            run.fn(case, 0)
    peak = _rss_kib("VmHWM")
    return {"peak_mib": (peak - before) / 1024, "baseline_mib": before / 1024}


def measure_memory(
    case: Case,
    runs: Sequence[Run],
    quick: bool,
    peers: bool,
    rows: list[Row],
    log: Callable[[str], None],
) -> None:
    if not os.path.exists("/proc/self/clear_refs"):
        log("  peak memory: /proc/self/clear_refs is missing (not Linux); skipped")
        return
    full = [(r.task, r.library, r.setting) for r in plan(case.name)]
    for index, run in enumerate(runs):
        module = PEERS.get(run.library, (None,))[0]
        if (
            not run.memory
            or (quick and run.memory != "always")
            or (module is not None and (not peers or not peer_available(module)))
        ):
            continue
        position = full.index((run.task, run.library, run.setting))
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--_memory",
            f"{case.name}:{position}",
        ]
        if quick:
            command.append("--quick")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            rows[index].note += f" (memory run failed: {done.stderr.strip().splitlines()[-1][:60]})"
            continue
        rows[index].peak_mib = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
        log(
            f"  [{case.name} memory] {run.library:<11} {run.setting:<50} {rows[index].peak_mib:8.1f} MiB"
        )


# ---------------------------------------------------------------------------------------------
# targets and output


@dataclass
class Target:
    name: str
    met: bool | None  # None: could not be evaluated
    detail: str


def _best(rows: Sequence[Row], role: str, max_error: float | None = None) -> Row | None:
    chosen = [r for r in rows if r.target_role == role and math.isfinite(r.seconds)]
    if max_error is not None:
        chosen = [r for r in chosen if r.rel_error <= max_error]
    return min(chosen, key=lambda r: r.seconds) if chosen else None


def paired(ours: Row, theirs: Row) -> str:
    """The round-by-round ratios (round r: both from seed r, interleaved) and the ratio of the
    totals over the rounds. PyHessian's product count depends on its start vector, so the
    minimum over rounds is its luckiest seed as much as the machine's quietest moment: the
    totals over the same seeds estimate the ratio of expected times."""
    if len(ours.seconds_all) != len(theirs.seconds_all) or len(ours.seconds_all) < 2:
        return ""
    rounds = ", ".join(
        f"{a / b:.2f}" for a, b in zip(ours.seconds_all, theirs.seconds_all, strict=True)
    )
    total = sum(ours.seconds_all) / sum(theirs.seconds_all)
    return f"; by round {rounds}; totals over the rounds {total:.2f}"


def targets(case: Case, rows: Sequence[Row]) -> list[Target]:
    found = []
    name = "λ1: float32 Lanczos to residual ≤ 1e-6 in ≤ 0.5× PyHessian's time at tol 1e-4"
    ours = _best(rows, "lambda_fast")
    theirs = _best(rows, "lambda_peer")
    if ours is None:
        found.append(Target(name, False, "the curvcal run failed"))
    elif theirs is None:
        found.append(Target(name, None, "PyHessian not run"))
    else:
        ratio = ours.seconds / theirs.seconds
        accurate = ours.residual <= 1e-6 and ours.rel_error <= 1e-6
        found.append(
            Target(
                name,
                accurate and ratio <= 0.5,
                f"curvcal residual {ours.residual:.1e} (worst of rounds), error {ours.rel_error:.1e}, "
                f"{ours.hvps} HVPs in {ours.seconds:.2f} s; PyHessian tol 1e-4: error "
                f"{theirs.rel_error:.1e}, {theirs.hvps} HVPs in {theirs.seconds:.2f} s; ratio {ratio:.2f}"
                f"{paired(ours, theirs)}",
            )
        )
    trace_ours = _best(rows, "trace_ours")
    trace_peer = _best(rows, "trace_peer")
    if trace_ours is not None:
        accurate = trace_ours.rel_error <= 1e-2 if math.isfinite(trace_ours.rel_error) else None
        error_text = (
            f"error {100 * trace_ours.rel_error:.2f}% (worst of rounds)"
            if math.isfinite(trace_ours.rel_error)
            else "no exact trace"
        )
        if trace_peer is not None:
            ratio = trace_ours.seconds / trace_peer.seconds
            fast = ratio <= 0.5
            met = fast if accurate is None else (fast and accurate)
            found.append(
                Target(
                    "trace: default (auto, --probes 100) ≤ 1% error in ≤ 0.5× PyHessian 100 probes",
                    met,
                    f"{error_text}; {trace_ours.seconds:.2f} s vs {trace_peer.seconds:.2f} s, ratio {ratio:.2f}",
                )
            )
        else:
            found.append(
                Target(
                    "trace: default (auto, --probes 100) ≤ 1% error",
                    accurate,
                    f"{error_text}; PyHessian not run",
                )
            )
    one = next((r for r in rows if r.target_role == "hvp_ours"), None)
    reference = next((r for r in rows if r.target_role == "hvp_reference"), None)
    if one is not None and reference is not None and math.isfinite(one.seconds):
        ratio = one.seconds / reference.seconds
        found.append(
            Target(
                "one HVP ≤ 1.1× one double backward",
                ratio <= 1.1,
                f"{one.seconds:.3f} s vs {reference.seconds:.3f} s, ratio {ratio:.2f}",
            )
        )
    worst: Row | None = None
    if one is not None and math.isfinite(one.peak_mib):
        ours_runs = [
            r
            for r in rows
            if r.library == "curvcal"
            and r.task in ("lambda_max", "trace")
            and math.isfinite(r.peak_mib)
        ]
        worst = max(ours_runs, key=lambda r: r.peak_mib) if ours_runs else None
    if one is not None and worst is not None:
        ratio = worst.peak_mib / one.peak_mib
        found.append(
            Target(
                "peak memory ≤ 2× one HVP",
                ratio <= 2.0,
                f"worst curvcal run '{worst.setting}' {worst.peak_mib:.1f} MiB vs one HVP {one.peak_mib:.1f} MiB, ratio {ratio:.2f}",
            )
        )
    return found


def _fmt(value: float, spec: str) -> str:
    return "—" if not math.isfinite(value) else format(value, spec)


def markdown(case: Case, rows: Sequence[Row], found: Sequence[Target]) -> str:
    lines = [
        f"### {case.name}: {case.description}",
        "",
        f"P = {case.n_params} parameters, N = {case.n_samples} samples. Reference: {case.reference}: "
        f"λ1 = {case.lambda_max:.10g}, λ2 = {case.lambda_2:.6g}"
        + (f", tr(H) = {case.trace:.8g}." if math.isfinite(case.trace) else "; no exact trace."),
        "",
    ]
    titles = {
        "lambda_max": "λ1 (largest eigenvalue)",
        "trace": "trace",
        "hvp": "one HVP over the whole dataset (wall s per vector, after one warm-up product)",
    }
    for task in ("lambda_max", "trace", "hvp"):
        lines += [
            f"**{titles[task]}**",
            "",
            "| library | setting | estimate | rel. error (worst) | HVPs | wall s (min) | peak MiB | note |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r.task != task:
                continue
            value = _fmt(r.value, ".8g")
            lines.append(
                f"| {r.library} | {r.setting} | {value} | {_fmt(r.rel_error, '.1e')} | {r.hvps or '—'} | "
                f"{_fmt(r.seconds, '.3f')} | {_fmt(r.peak_mib, '.1f')} | {r.note} |"
            )
        lines.append("")
    lines += ["**targets**", ""]
    for t in found:
        verdict = "met" if t.met else "NOT met" if t.met is False else "not evaluated"
        lines.append(f"- {t.name}: **{verdict}** — {t.detail}")
    lines.append("")
    return "\n".join(lines)


SUMMARY_HEADER = [
    "| case | P | λ1 s: curvcal (Lanczos 1e-4) / PyHessian (1e-4) | ratio | curvlinops eigsh s "
    "| λ1 rel. error: curvcal / PyHessian / curvlinops | trace rel. error: curvcal default "
    "(auto, --probes 100) / PyHessian 100 probes | trace s: curvcal / PyHessian (ratio) | HVP / gradient "
    "| peak memory, HVP / gradient |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def summary_row(case: Case, rows: Sequence[Row]) -> str:
    """One row of the summary table: the default runs of each library, ratios of the same run."""

    def find(task: str, library: str, setting: str) -> Row | None:
        return next(
            (r for r in rows if (r.task, r.library, r.setting) == (task, library, setting)), None
        )

    def sec(row: Row | None) -> float:
        return row.seconds if row is not None else math.nan

    def err(row: Row | None) -> str:
        return _fmt(row.rel_error if row is not None else math.nan, ".1e")

    def ratio(a: float, b: float) -> str:
        return _fmt(a / b if b else math.nan, ".2f")

    ours = find("lambda_max", "curvcal", "Lanczos, tol 1e-4 (default)")
    theirs = find("lambda_max", "pyhessian", "tol 1e-4")
    arpack = find("lambda_max", "curvlinops", "eigsh on to_scipy() (default tol 0)")
    trace_ours = find("trace", "curvcal", "auto, --probes 100 (default)")
    trace_peer = find("trace", "pyhessian", "100 probes (tol -inf)")
    grad = next((r for r in rows if r.target_role == "gradient"), None)
    hvp = next((r for r in rows if r.target_role == "hvp_ours"), None)
    peak = hvp.peak_mib / grad.peak_mib if hvp is not None and grad is not None else math.nan
    return (
        f"| {case.name} | {case.n_params:,} | {_fmt(sec(ours), '.3g')} / {_fmt(sec(theirs), '.3g')} "
        f"| {ratio(sec(ours), sec(theirs))} | {_fmt(sec(arpack), '.3g')} "
        f"| {err(ours)} / {err(theirs)} / {err(arpack)} | {err(trace_ours)} / {err(trace_peer)} "
        f"| {_fmt(sec(trace_ours), '.3g')} / {_fmt(sec(trace_peer), '.3g')} "
        f"({ratio(sec(trace_ours), sec(trace_peer))}) | {ratio(sec(hvp), sec(grad))} "
        f"| {_fmt(peak, '.2f')} |"
    )


def _finite(value: Any) -> Any:
    """The report with NaN and infinities as null (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def environment() -> dict[str, str]:
    info = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "curvcal": curvcal.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": str(torch.get_num_threads()),
    }
    for library in PEERS:
        info[DIST_NAMES[library]] = peer_version(library)
    return info


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="197 samples, 1 round: about 3 minutes"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="rounds per run (default 3; --quick: 1)"
    )
    parser.add_argument(
        "--json", metavar="OUT", help="also write every row, target and the environment as JSON"
    )
    parser.add_argument(
        "--cases",
        default="mlp,digits-cnn",
        help="comma-separated: mlp, digits-cnn, resnet18, vit, tiny",
    )
    parser.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="comma-separated: lambda_max, trace, hvp (default: all)",
    )
    parser.add_argument(
        "--trace-reference",
        type=int,
        default=0,
        metavar="M",
        help="resnet18/vit: a float64 Hutch++ of M products as the trace reference",
    )
    parser.add_argument("--no-peers", action="store_true", help="run curvcal only")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory subprocesses"
    )
    parser.add_argument(
        "--exact-trace", action="store_true", help="exact DigitsCNN trace (P HVPs; ~40 min)"
    )
    parser.add_argument(
        "--dense-cache",
        metavar="FILE",
        help="the dense DigitsCNN Hessian kept by bench_trace.py --cache: its exact trace",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--_memory", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.repeats is None:
        options.repeats = 1 if options.quick else 3
    if options.repeats < 1:
        parser.error("--repeats must be ≥ 1")
    options.tasks = [t.strip() for t in options.tasks.split(",") if t.strip()]
    if not options.tasks or not set(options.tasks) <= set(TASKS):
        parser.error(f"--tasks: choose among {', '.join(TASKS)}")
    if options.trace_reference < 0:
        parser.error("--trace-reference must be ≥ 0")
    return options


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    options = parse(argv)
    torch.set_num_threads(options.threads)
    if options._memory:
        name, index = options._memory.split(":")
        print(json.dumps(child_memory(name, options.quick, int(index))))
        return {}

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report: dict[str, Any] = {"environment": environment(), "options": vars(options), "cases": []}
    output = [f"Environment: {', '.join(f'{k} {v}' for k, v in report['environment'].items())}", ""]
    summaries: list[str] = []
    for name in [n.strip() for n in options.cases.split(",") if n.strip()]:
        log(f"{name}: building the case and its reference")
        case = build_case(
            name,
            options.quick,
            options.exact_trace,
            truth=bool({"lambda_max", "trace"} & set(options.tasks)),
            dense_cache=options.dense_cache,
            trace_reference=options.trace_reference,
        )
        runs = [r for r in plan(name) if r.task in options.tasks]
        rows = measure(case, runs, options.repeats, not options.no_peers, log)
        if not options.no_memory and name != "tiny":
            measure_memory(case, runs, options.quick, not options.no_peers, rows, log)
        found = targets(case, rows)
        output.append(markdown(case, rows, found))
        summaries.append(summary_row(case, rows))
        report["cases"].append(
            {
                "case": name,
                "description": case.description,
                "n_params": case.n_params,
                "n_samples": case.n_samples,
                "reference": case.reference,
                "lambda_max": case.lambda_max,
                "lambda_2": case.lambda_2,
                "trace": case.trace,
                "rows": [dataclasses.asdict(r) for r in rows],
                "targets": [dataclasses.asdict(t) for t in found],
            }
        )
    output += ["### Summary", "", *SUMMARY_HEADER, *summaries, ""]
    report["summary"] = summaries
    print("\n".join(output))
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(_finite(report), handle, indent=2)
    return report


if __name__ == "__main__":
    main()
