"""Peak memory of ``curvcal hessian`` against a plain gradient pass at the same batch size.

For torchvision's ResNet-18 (random weights, 10 classes) on CIFAR-size synthetic images
(3×32×32), for each dataset size N (one batch of N images, or batches of ``--batch``), in one
run:

* ``idle``: a child process that loads the model and the data and does nothing else — the
  resident set every run starts from;
* ``gradient``: a child that computes ∇θ Σ_i ℓ_i once, batch by batch (``backward``);
* ``hessian``: ``python -m curvcal hessian`` on the same checkpoint and data (top-k 1 by Lanczos
  with at most ``--max-iter`` steps and a trace by each of ``--trace-methods`` with ``--probes``
  probes — one run per method; ``none`` runs without a trace). Hutchinson's peak does not depend
  on how many products are made; the sketching estimators (``hutchpp``, ``xtrace``) hold a sketch
  of P × s values, s = ⌊probes/3⌋ or ⌊probes/2⌋, so theirs grows with ``--probes``.
  ``--params`` restricts the Hessian to matching parameters (a smaller P). ``--density-steps S``
  adds one SLQ density run of S steps (its basis kept only if the budget, or ``--max-basis``,
  holds S vectors).
  ``--dtype bfloat16|float16`` runs the model (gradient child and ``curvcal hessian --dtype``) in
  half precision, its vectors in float32: the ratio hessian/gradient of that path.

Each measurement runs in a fresh process started by a fresh wrapper, whose
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the child's peak resident set (Linux: KiB).
The table gives the peaks, their growth over ``idle``, and the ratios hessian/gradient of both.
One torch thread.

Usage::

    python benchmarks/bench_memory.py [--sizes 128,512] [--max-iter 2] [--probes 2] [--json OUT]
    python benchmarks/bench_memory.py --sizes 32 --max-iter 1     # a quick look
    python benchmarks/bench_memory.py --sizes 1024 --batch 64 --trace-methods none
    python benchmarks/bench_memory.py --sizes 16 --max-iter 1 --probes 100 \
        --trace-methods none,hutchinson,hutchpp,xtrace            # the trace sketches
    python benchmarks/bench_memory.py --sizes 128 --max-iter 1 --trace-methods none \
        --density-steps 40 [--max-basis 40]                       # the density's basis
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)\n"
)


def _child_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return environment


def peak_kib(command: list[str]) -> tuple[int, float]:
    """Peak resident set (KiB) of ``command`` run in a fresh process, and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *command],
        capture_output=True,
        text=True,
        env=_child_environment(),
        check=False,
    )
    seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"no measurement from {command}: {done.stderr[-2000:]}")
    peak, code = lines[-1].split()
    if code != "0":
        raise RuntimeError(f"{command} exited {code}: {done.stderr[-2000:]}")
    return int(peak), seconds


def child(
    kind: str, checkpoint: Path, data: Path, batch_size: int | None = None, dtype: str = "float32"
) -> None:
    """Load the model and the data (cast to ``dtype``); for ``gradient`` also compute one
    gradient of the summed loss (over batches of ``batch_size``, accumulated, when given), the
    logits widened to float32 as curvcal does."""
    import torchvision
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    model = torchvision.models.resnet18(num_classes=10)
    model.load_state_dict(load_file(str(checkpoint)))
    model.to(getattr(torch, dtype)).eval()
    batch = torch.load(data)
    x, y = batch["x"].to(getattr(torch, dtype)), batch["y"]
    if kind == "gradient":
        size = batch_size or x.shape[0]
        for xs, ys in zip(x.split(size), y.split(size), strict=True):
            logits = model(xs).float()
            torch.nn.functional.cross_entropy(logits, ys, reduction="sum").backward()


def write_inputs(folder: Path, samples: int) -> tuple[Path, Path]:
    import torchvision
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    checkpoint = folder / "resnet18.safetensors"
    if not checkpoint.exists():
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    generator = torch.Generator().manual_seed(samples)
    x = (torch.rand(samples, 3, 32, 32, generator=generator) - 0.5) / 0.25
    y = torch.randint(0, 10, (samples,), generator=generator)
    data = folder / f"cifar-like-{samples}.pt"
    torch.save({"x": x, "y": y}, data)
    return checkpoint, data


def hessian_command(
    checkpoint: Path, data: Path, samples: int, method: str, output: Path, args: argparse.Namespace
) -> list[str]:
    """``curvcal hessian`` with the trace by ``method`` (``none``: no trace)."""
    # --probes is refused without a trace
    trace = (
        ["--no-trace"]
        if method == "none"
        else ["--trace-method", method, "--probes", str(args.probes)]
    )
    return [
        sys.executable, "-m", "curvcal", "hessian", str(checkpoint),
        "--arch", "tv:resnet18", "--num-classes", "10", "--data", str(data),
        "--batch-size", str(args.batch or samples), "--top-k", "1", "--max-iter", str(args.max_iter),
        *trace, "--device", "cpu", "--quiet", "--json",
        "-o", str(output), "--dtype", args.dtype,
        *(["--memory-budget", args.memory_budget] if args.memory_budget else []),
        *(["--params", args.params] if args.params else []),
        *(["--max-basis", str(args.max_basis)] if args.max_basis else []),
        *(
            ["--density", "--density-runs", "1", "--density-steps", str(args.density_steps)]
            if args.density_steps
            else []
        ),
    ]  # fmt: skip


def measure(samples: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    checkpoint, data = write_inputs(folder, samples)
    this = [sys.executable, str(Path(__file__).resolve())]
    methods = args.trace_methods.split(",")
    output = {method: folder / f"hessian-{samples}-{method}.json" for method in methods}
    runs = [
        ("idle", [*this, "--child", "idle", str(checkpoint), str(data), "--dtype", args.dtype]),
        (
            "gradient",
            [
                *this,
                "--child",
                "gradient",
                str(checkpoint),
                str(data),
                *(["--batch", str(args.batch)] if args.batch else []),
                "--dtype",
                args.dtype,
            ],
        ),
    ] + [
        (f"hessian_{method}", hessian_command(checkpoint, data, samples, method, path, args))
        for method, path in output.items()
    ]
    row: dict[str, Any] = {"samples": samples, "methods": methods}
    for name, command in runs:
        kib, seconds = peak_kib(command)
        row[f"{name}_mib"] = kib / 1024
        row[f"{name}_s"] = seconds
        print(
            f"  N={samples} {name}: peak {kib / 1024:.0f} MiB in {seconds:.1f} s", file=sys.stderr
        )
    idle = row["idle_mib"]
    for method, path in output.items():
        result = json.loads(path.read_text())["results"]
        row[f"operator_{method}"] = {
            k: result["operator"].get(k)
            for k in (
                "engine",
                "probe_batch",
                "micro_batch",
                "n_matvecs",
                "n_params",
                "kept_rows",
            )
        }
        if result.get("density"):
            row[f"operator_{method}"]["density_reorthogonalised"] = result["density"][
                "reorthogonalised"
            ]
        peak = row[f"hessian_{method}_mib"]
        row[f"ratio_peak_{method}"] = peak / row["gradient_mib"]
        row[f"ratio_growth_{method}"] = (peak - idle) / max(row["gradient_mib"] - idle, 1e-9)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,512", help="dataset sizes, comma-separated")
    parser.add_argument("--max-iter", type=int, default=2, help="Lanczos steps (few: memory only)")
    parser.add_argument("--probes", type=int, default=4, help="trace probes (products)")
    parser.add_argument(
        "--trace-methods",
        default="hutchinson",
        help="comma-separated: hutchinson, hutchpp, xtrace, none (no trace); one run each",
    )
    parser.add_argument("--params", default=None, help="passed to curvcal hessian")
    parser.add_argument("--memory-budget", default=None, help="passed to curvcal hessian")
    parser.add_argument("--max-basis", type=int, default=None, help="passed to curvcal hessian")
    parser.add_argument(
        "--density-steps",
        type=int,
        default=0,
        help="add one SLQ density run of this many steps (0: no density)",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="batch size (default: all N images in one batch)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64", "bfloat16", "float16"),
        help="the model's dtype (passed to curvcal hessian --dtype)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument(
        "--child", nargs=3, metavar=("KIND", "CKPT", "DATA"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.batch, args.dtype)
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for samples in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(samples, Path(folder), args))
    print(
        f"\nResNet-18 (11.2 M parameters, random weights), CIFAR-size synthetic images, "
        f"{f'batches of {args.batch}' if args.batch else 'one batch'}, "
        f"CPU, 1 thread; {platform.processor() or platform.machine()}, torch {torch.__version__}; "
        f"--probes {args.probes}, --params {args.params or 'all'}, --dtype {args.dtype}\n"
    )
    print("| N | trace | P | idle MiB | gradient peak MiB | hessian peak MiB | peak ratio | "
          "growth ratio | vectors/pass, micro-batch | kept graphs (samples) |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        for method in row["methods"]:
            operator = row[f"operator_{method}"]
            print(
                f"| {row['samples']} | {method} | {operator['n_params']:,} | "
                f"{row['idle_mib']:.0f} | {row['gradient_mib']:.0f} | "
                f"{row[f'hessian_{method}_mib']:.0f} | {row[f'ratio_peak_{method}']:.2f} | "
                f"{row[f'ratio_growth_{method}']:.2f} | "
                f"{operator['probe_batch']}, {operator['micro_batch'] or 'none'} | "
                f"{operator['kept_rows'] or 0} |"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
