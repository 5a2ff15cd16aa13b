"""Speed and memory of curvcal's Hessian products against the gradient floor and PyHessian.

For torchvision's ResNet-18 and a small VisionTransformer on CIFAR-size random data
(FakeData-like: 3×32×32 inputs, 10 classes), in one run:

* one gradient of the summed loss over the dataset (the floor), one hand-written double-backward
  Hessian-vector product, and one curvcal product per engine (min of repeats);
* wall time of λmax (power iteration to a relative tolerance of 1e-4) and of a Hutchinson trace
  with a fixed number of probes, for curvcal and for PyHessian when it is installed;
* on CUDA, the peak allocated memory of each measurement (``torch.cuda.max_memory_allocated``),
  with ``torch.cuda.synchronize`` around every timing. On the CPU peak memory is not measured
  per step (the process's resident size only grows), so the table leaves it empty.

With ``--products`` (CPU, one thread) it measures instead, per model: HVP / gradient and HVP /
double backward (interleaved, min of repeats), the first product against a second, and the peak
resident-set growth of a product against a gradient pass (fresh child processes).

Usage::

    python benchmarks/bench_scale.py [--quick] [--device cpu|cuda] [--samples N] [--json OUT]
    python benchmarks/bench_scale.py --products --samples 128 --batch 64 --repeats 3

PyHessian is imported lazily; when missing its rows say "not installed".
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision
from scale_models import MODELS, Batches, fake_data
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import curvcal
from curvcal.curvature import eigenvalues, hutchinson_trace
from curvcal.curvature.operator import HessianOperator


class Clock:
    """Wall time (min of repeats) and, on CUDA, the peak allocated memory of a callable."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def measure(self, run: Callable[[], Any], repeats: int) -> tuple[float, int | None, Any]:
        best, peak, value = float("inf"), None, None
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            self.sync()
            start = time.perf_counter()
            value = run()
            self.sync()
            best = min(best, time.perf_counter() - start)
            if self.cuda:
                peak = max(peak or 0, torch.cuda.max_memory_allocated())
        return best, peak, value


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def gradient(model: nn.Module, batches: Batches) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
        torch.autograd.grad(loss, params)


def double_backward(model: nn.Module, batches: Batches, vectors: list[Tensor]) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    # fused attention kernels cannot be differentiated twice (the gradient floor keeps them)
    with sdpa_kernel([SDPBackend.MATH]):
        for x, y in batches:
            _one_double_backward(model, params, x, y, vectors)


def _one_double_backward(
    model: nn.Module, params: list[Tensor], x: Tensor, y: Tensor, vectors: list[Tensor]
) -> None:
    loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
    grads = torch.autograd.grad(loss, params, create_graph=True)
    dot = sum((g * v).sum() for g, v in zip(grads, vectors, strict=True))
    torch.autograd.grad(dot, params)


def pyhessian_rows(
    model: nn.Module,
    batches: Batches,
    device: torch.device,
    clock: Clock,
    args: argparse.Namespace,
) -> dict[str, Any]:
    try:
        from pyhessian import hessian  # type: ignore[import-not-found]
    except ImportError:
        return {"status": "not installed"}
    # PyHessian leaves the model in eval mode and writes .grad: give it its own copy
    import copy

    own = copy.deepcopy(model)
    engine = hessian(own, nn.CrossEntropyLoss(), dataloader=batches, cuda=device.type == "cuda")
    # PyHessian double-differentiates attention like any op: fused kernels fail (no second
    # derivative), so it gets the same composite kernel curvcal uses
    with sdpa_kernel([SDPBackend.MATH]):
        torch.manual_seed(0)
        seconds, peak, (values, _vectors) = clock.measure(
            lambda: engine.eigenvalues(maxIter=args.max_iter, tol=args.tol), 1
        )
        torch.manual_seed(0)
        t_seconds, t_peak, traces = clock.measure(
            lambda: engine.trace(maxIter=args.probes, tol=0.0), 1
        )
    return {
        "status": "ok",
        "lambda_max": float(values[0]),
        "lambda_max_s": seconds,
        "lambda_max_peak_bytes": peak,
        "trace": float(sum(traces) / len(traces)),
        "trace_probes": len(traces),
        "trace_s": t_seconds,
        "trace_peak_bytes": t_peak,
    }


def bench_model(
    name: str, model: nn.Module, batches: Batches, device: torch.device, args: argparse.Namespace
) -> dict[str, Any]:
    clock = Clock(device)
    model = model.to(device).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1)
    vectors = [torch.randn(p.shape, generator=generator).to(device) for p in params]
    flat = torch.cat([v.reshape(-1) for v in vectors])
    row: dict[str, Any] = {"model": name, "n_params": int(flat.numel())}
    repeats = args.repeats
    say(f"{name}: gradient, double backward, products")
    grad_s, grad_peak, _ = clock.measure(lambda: gradient(model, batches), repeats)
    dbl_s, dbl_peak, _ = clock.measure(lambda: double_backward(model, batches, vectors), repeats)
    row.update(gradient_s=grad_s, gradient_peak_bytes=grad_peak, double_backward_s=dbl_s)
    row["double_backward_peak_bytes"] = dbl_peak
    for engine in ("autograd", "func"):
        operator = HessianOperator(model, batches, hvp=engine)
        try:
            seconds, peak, _ = clock.measure(lambda op=operator: op.matvec(flat), repeats)
        except (RuntimeError, NotImplementedError) as error:
            row[f"hvp_{engine}"] = {"status": f"unsupported: {str(error).splitlines()[0][:90]}"}
            continue
        row[f"hvp_{engine}"] = {
            "status": "ok",
            "seconds": seconds,
            "peak_bytes": peak,
            "per_gradient": seconds / grad_s,
            "per_double_backward": seconds / dbl_s,
        }
    say(f"{name}: curvcal λmax and trace")
    operator = HessianOperator(model, batches)
    row["engine_auto"] = operator.engine
    seconds, peak, spectrum = clock.measure(
        lambda: eigenvalues(operator, 1, tol=args.tol, max_iter=args.max_iter, seed=0), 1
    )
    row["curvcal"] = {
        "lambda_max": spectrum.eigenvalues[0],
        "lambda_max_iterations": spectrum.values[0].iterations,
        "lambda_max_converged": spectrum.values[0].converged,
        "lambda_max_s": seconds,
        "lambda_max_peak_bytes": peak,
    }
    seconds, peak, spectrum = clock.measure(
        lambda: eigenvalues(
            operator, 1, method="lanczos", tol=args.tol, max_iter=args.max_iter, seed=0
        ),
        1,
    )
    row["curvcal"].update(
        lambda_max_lanczos=spectrum.eigenvalues[0],
        lambda_max_lanczos_steps=spectrum.values[0].matvecs,
        lambda_max_lanczos_converged=spectrum.values[0].converged,
        lambda_max_lanczos_s=seconds,
        lambda_max_lanczos_peak_bytes=peak,
    )
    seconds, peak, trace = clock.measure(lambda: hutchinson_trace(operator, args.probes, seed=0), 1)
    row["curvcal"].update(
        trace=trace.estimate, trace_probes=trace.n_probes, trace_s=seconds, trace_peak_bytes=peak
    )
    say(f"{name}: PyHessian")
    row["pyhessian"] = pyhessian_rows(model, batches, device, clock, args)
    if row["pyhessian"]["status"] == "ok":
        row["ratio_lambda_max_s"] = (
            row["curvcal"]["lambda_max_s"] / row["pyhessian"]["lambda_max_s"]
        )
        row["ratio_trace_s"] = row["curvcal"]["trace_s"] / row["pyhessian"]["trace_s"]
    return row


def _peak_reset() -> int:
    """Reset the resident-set peak (Linux ``clear_refs`` 5) and return the resident set, bytes."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def product_child(kind: str, model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this (fresh) process: ``gradient`` (a gradient pass), ``product``
    (a curvcal product, engine auto, graphs rebuilt), ``block`` (8 vectors), ``kept`` (one
    vector through kept graphs) or ``default`` (one vector, every setting at its default, as
    ``curvcal hessian`` builds the operator in a fresh process): the peak resident-set growth of the step in steady state
    (after one of the same), and for the products the time of the operator's construction
    (batch count, memory measurement), of its first product and of a second one; for ``kept``
    also the growth of the first product, which builds and holds the graphs."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MODELS[model_name]().eval()
    batches = fake_data(args.samples, args.batch, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    width = 8 if kind == "block" else 1
    keep = {"kept": "always", "default": "auto"}.get(kind, "never")
    gradient(model, batches[:1])  # torch's own first-call costs are not curvcal's
    if kind == "gradient":
        gradient(model, batches)
        before = _peak_reset()
        gradient(model, batches)
        return {"peak_growth": _status_bytes("VmHWM") - before}
    n_params = sum(p.numel() for p in params)
    vectors = torch.randn(n_params, width, generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    operator = (
        HessianOperator(model, batches, memory_budget=args.memory_budget)
        if kind == "default"
        else HessianOperator(model, batches, probe_batch=width, keep_graphs=keep)
    )
    setup = time.perf_counter() - start
    held = _peak_reset()
    start = time.perf_counter()
    operator.matmat(vectors)
    first = time.perf_counter() - start
    first_growth = _status_bytes("VmHWM") - held
    # steady state, as for the gradient: the peak of a product after the first
    before = _peak_reset()
    start = time.perf_counter()
    operator.matmat(vectors)
    second = time.perf_counter() - start
    return {
        "peak_growth": _status_bytes("VmHWM") - before,
        "first_peak_growth": first_growth,
        "graphs_kept": operator.graphs_kept,
        "kept_rows": operator.kept_rows,
        "kept_estimate": operator.kept_estimate,
        "setup_s": setup,
        "first_s": first,
        "second_s": second,
        "engine": operator.engine,
        "probe_batch": operator.probe_batch,
        "micro_batch": operator.micro_batch,
        "budget": None if operator.memory_plan is None else operator.memory_plan.budget,
    }


def product_rows(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """HVP / gradient and peak memory / gradient for one model, all in one run: timings in this
    process (one thread, the steps interleaved, minimum of ``--repeats``), peak memory and the
    first-product cost in fresh child processes."""
    import subprocess

    torch.manual_seed(0)
    model = MODELS[model_name]().eval()
    batches = fake_data(args.samples, args.batch, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1)
    vectors = [torch.randn(p.shape, generator=generator) for p in params]
    flat = torch.cat([v.reshape(-1) for v in vectors])
    block = torch.randn(flat.numel(), 8, generator=generator)
    # first, while the process holds no more than a fresh one would (the default budget reads
    # the resident set): the operator as `curvcal hessian` builds it
    default = HessianOperator(model, batches, memory_budget=args.memory_budget)
    operator = HessianOperator(model, batches, keep_graphs="never")
    blocked = HessianOperator(
        model, batches, probe_batch=8, memory_budget="100%", keep_graphs="never"
    )
    kept = HessianOperator(model, batches, keep_graphs="always")
    steps: dict[str, Callable[[], Any]] = {
        "gradient": lambda: gradient(model, batches),
        "double backward": lambda: double_backward(model, batches, vectors),
        "curvcal HVP": lambda: operator.matvec(flat),
        "curvcal block of 8": lambda: blocked.matmat(block),
        "curvcal HVP, kept graphs": lambda: kept.matvec(flat),
        "curvcal HVP, default operator": lambda: default.matvec(flat),
    }
    if args.no_block:
        del steps["curvcal block of 8"]
    for step in steps.values():  # warm-up, not timed
        step()
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - start)
    best["curvcal block of 8"] = best.get("curvcal block of 8", math.nan) / 8  # per vector
    row: dict[str, Any] = {
        "model": model_name,
        "n_params": int(flat.numel()),
        "n_samples": args.samples,
        "seconds": best,
    }
    row["hvp_per_gradient"] = best["curvcal HVP"] / best["gradient"]
    row["hvp_per_double_backward"] = best["curvcal HVP"] / best["double backward"]
    row["double_backward_per_gradient"] = best["double backward"] / best["gradient"]
    row["block_vector_per_gradient"] = best["curvcal block of 8"] / best["gradient"]
    row["kept_per_gradient"] = best["curvcal HVP, kept graphs"] / best["gradient"]
    children = {}
    kinds = ("gradient", "product", "kept", "default") if args.no_block else (
        "gradient", "product", "block", "kept", "default"
    )  # fmt: skip
    for kind in kinds:
        command = [sys.executable, __file__, "--child", kind, "--models", model_name,
                   "--samples", str(args.samples), "--batch", str(args.batch),
                   *(["--memory-budget", args.memory_budget] if args.memory_budget else [])]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        children[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    row["memory"] = children
    grad_growth = children["gradient"]["peak_growth"]
    row["product_peak_per_gradient"] = children["product"]["peak_growth"] / grad_growth
    row["block_peak_per_gradient"] = (
        children["block"]["peak_growth"] / grad_growth if "block" in children else math.nan
    )
    row["kept_first_peak_per_gradient"] = children["kept"]["first_peak_growth"] / grad_growth
    # whether the default operator keeps the graphs depends on the memory the process holds
    # (the budget's R), so it is read from a fresh process, as the command would build it
    row["kept_by_default"] = children["default"]["graphs_kept"]
    row["kept_rows_by_default"] = children["default"]["kept_rows"]
    row["default_per_gradient"] = best["curvcal HVP, default operator"] / best["gradient"]
    row["default_in_process"] = {
        "kept_rows": default.kept_rows,
        "budget": default.memory_plan.budget if default.memory_plan else None,
    }
    row["default_peak_per_gradient"] = children["default"]["peak_growth"] / grad_growth
    row["first_per_second_product"] = (
        children["product"]["first_s"] / children["product"]["second_s"]
    )
    return row


def products_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | P | gradient s | double backward s | curvcal HVP s | HVP / gradient | "
        "HVP / double backward | double backward / gradient | block of 8, per vector / gradient | "
        "first / second product | peak growth: HVP / gradient | block of 8 / gradient | "
        "kept graphs: HVP / gradient | kept graphs: first product's peak growth / gradient | "
        "kept by default (samples) | default product: HVP / gradient |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        seconds = row["seconds"]
        lines.append(
            f"| {row['model']} | {row['n_params']:,} | {seconds['gradient']:.3f} | "
            f"{seconds['double backward']:.3f} | {seconds['curvcal HVP']:.3f} | "
            f"{row['hvp_per_gradient']:.2f} | {row['hvp_per_double_backward']:.2f} | "
            f"{row['double_backward_per_gradient']:.2f} | {row['block_vector_per_gradient']:.2f} | "
            f"{row['first_per_second_product']:.2f} | {row['product_peak_per_gradient']:.2f} | "
            f"{row['block_peak_per_gradient']:.2f} | {row['kept_per_gradient']:.2f} | "
            f"{row['kept_first_peak_per_gradient']:.2f} | "
            f"{row['kept_rows_by_default'] or 0} of {row['n_samples']} | "
            f"{row['default_per_gradient']:.2f} |"
        )
    return "\n".join(lines)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 samples, 4 probes, 2 repeats")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--samples", type=int, default=None, help="default 256 (64 with --quick)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--probes", type=int, default=None, help="trace probes (default 16)")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=100, help="power iterations at most")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument(
        "--models", default="vit_tiny,resnet18", help="comma-separated: vit_tiny, resnet18"
    )
    parser.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    parser.add_argument(
        "--products",
        action="store_true",
        help="CPU only: HVP / gradient, first product, peak memory / gradient (no λmax, no peer)",
    )
    parser.add_argument(
        "--memory-budget",
        default=None,
        help="with --products: the budget of the 'default operator' rows (as --memory-budget)",
    )
    parser.add_argument(
        "--no-block",
        action="store_true",
        help="with --products: leave out the block of 8 vectors (the slow step on large data)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.samples = args.samples or (64 if args.quick else 256)
    args.probes = args.probes or (4 if args.quick else 16)
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.child:
        print(json.dumps(product_child(args.child, args.models, args)))
        return 0
    if args.products:
        torch.set_num_threads(1)
        wanted = [name.strip() for name in args.models.split(",") if name.strip()]
        product_table_rows = []
        for name in wanted:
            say(f"{name}: products")
            product_table_rows.append(product_rows(name, args))
            say(json.dumps(product_table_rows[-1], indent=1))
        if args.json_out:
            with open(args.json_out, "w") as handle:
                handle.write(json.dumps(product_table_rows, indent=2) + "\n")
        print(products_table(product_table_rows))
        return 0
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    batches = fake_data(args.samples, args.batch, device)
    torch.manual_seed(0)
    builders = MODELS
    wanted = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in builders]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(builders)}")
    models = {name: builders[name]() for name in wanted}
    rows = []
    for name, model in models.items():
        print(f"{name} …", file=sys.stderr, flush=True)
        rows.append(bench_model(name, model, batches, device, args))
        print(json.dumps(rows[-1], indent=1), file=sys.stderr, flush=True)
    try:
        import pyhessian  # type: ignore[import-not-found]  # noqa: F401

        peer = "pyhessian (installed)"
    except ImportError:
        peer = "pyhessian not installed"
    record = {
        "device": str(device),
        "device_name": device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "samples": args.samples,
        "batch": args.batch,
        "probes": args.probes,
        "tol": args.tol,
        "versions": {
            "curvcal": curvcal.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "python": platform.python_version(),
            "peer": peer,
        },
        "rows": rows,
    }
    text = json.dumps(record, indent=2)
    if args.json_out:
        with open(args.json_out, "w") as handle:
            handle.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
