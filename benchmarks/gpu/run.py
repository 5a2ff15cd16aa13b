"""The one-shot GPU run: the CUDA tests, then the GPU table, each part within a time budget.

Parts, in order (each in its own process group, killed when its budget is spent):

* ``cuda-tests``: ``pytest -m cuda tests/cuda`` (every command on ``--device cuda`` against the
  CPU, the forced out-of-memory halving, ``torchrun --nproc-per-node 1`` on NCCL);
* ``resnet18``: torchvision ResNet-18 (random weights, 10 classes) on 10,000 CIFAR-size
  synthetic images, ``curvcal hessian --no-trace --tol 1e-4`` (λmax by Lanczos);
* ``vit_b_16``: timm's ``vit_base_patch16_224`` (ViT-B/16, 1000 classes) on 1,000 ImageNet-size
  images, a few Lanczos steps;
* ``bert_base``: a transformers ``BertForSequenceClassification`` of BERT-base size (random
  weights, a locally written WordPiece vocabulary) on 1,000 texts of 128 tokens, a few steps;
* ``llama_1b``: the scale guide's 1B Llama classifier on 64 sequences of 512 tokens, bfloat16
  replicated (double backward) and float32 sharded with FSDP2 over one rank (central
  differences), each against the plan's seconds and gigabytes (``llama_part.py``);
* ``calibration``: temperature scaling, focal temperature scaling (its defaults) and all
  metrics on 100,000 × 1,000 and then 1,000,000 × 1,000 synthetic logits (the fits run on the
  CPU; the logits are drawn on the device);
* ``maps-device``: the same 1,000,000 × 1,000 logits (the same draw): all metrics, then
  temperature scaling and focal temperature scaling fitted and applied on the device
  (``--device cuda``: the torch kernels of :mod:`curvcal.calibration.device`, float64), their
  ECE, T and γ beside the CPU part's;
* ``vit_warm_start``: the same ViT-B/16 and images, λmax to tol 1e-4 started from the top
  eigenvector of the Hessian over 1/16 of the images (``--warm-start``), then from a random
  vector: full-data products, the warm stage's, and both in full-product units;
* ``vit_block_lanczos``: the same ViT-B/16 and images: the seconds of one product of b = 1, 2,
  4, 8 vectors (``matmat``) against b single products (``matvec``) over the first 200 images
  (c_b, the cost of a vector in a block), then λmax to tol 1e-4 by block Lanczos with blocks of
  2 (``bench_block_lanczos.py``'s) and by curvcal's Lanczos, each within a product budget:
  products, and products × c_b in full-product units.

Every model part runs the real command line in-process (``curvcal.cli.main``, so the CUDA path
of the product is what is timed) after a plain gradient pass over the same batches (the floor)
and, last (a record of its own, so that a part whose budget runs out there keeps its row), one
product of a fixed vector by the default operator (the kernel, after a warm-up product that
builds the kept graphs where the plan keeps them): wall time, products, seconds per product
over the gradient pass and over the kernel (``run_per_kernel``: what the algorithm adds), the
memory plan the command made (``memory_plan``: its budget and where it came from, rows per
chunk, kept graphs and why), and on CUDA the peak of ``torch.cuda.max_memory_allocated`` over
the gradient pass's peak (both include the model and the batches kept on the device).

Whatever happens, ``gpu-run.json`` (every record, the device, torch and CUDA versions, notes) and
``gpu-run.md`` (the table) are written after each part to ``--results-dir`` (default
``benchmarks/results``) and to ``--out`` (or ``$CURVCAL_GPU_OUT``), with ``gpu-run.log`` (each
part's output, cut to its last lines). A part whose budget is spent is killed and noted, and the
next one runs; a part that cannot start within the total budget is skipped with a note.

Usage (from the repository root; nothing needs installing)::

    PYTHONPATH=$PWD python3 benchmarks/gpu/run.py --out "$OUT"          # on a GPU machine
    PYTHONPATH=$PWD python3 benchmarks/gpu/run.py --smoke --device cpu  # tiny sizes, CI
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the parts' modules beside this script
from meter import Meter  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("cuda-tests", "resnet18", "vit_b_16", "bert_base", "llama_1b", "calibration",
         "maps-device", "vit_warm_start", "vit_block_lanczos")  # fmt: skip
# seconds each part may take at most (the total budget may leave it less)
BUDGETS = {"cuda-tests": 240, "resnet18": 100, "vit_b_16": 90, "bert_base": 70, "llama_1b": 200,
           "calibration": 90, "maps-device": 60, "vit_warm_start": 300,
           "vit_block_lanczos": 420}  # fmt: skip
SMOKE_BUDGETS = {part: 60 for part in PARTS}
MIN_START = 15.0  # a part is not started with less than this left of the total budget
LOG_TAIL = 200_000  # characters of each part's output kept in gpu-run.log


@dataclass(frozen=True)
class Size:
    """One model part's sizes: samples, batch, and Lanczos' tolerance and step limit."""

    samples: int
    batch: int
    tol: float
    max_iter: int


FULL = {
    "resnet18": Size(10_000, 500, 1e-4, 40),
    "vit_b_16": Size(1_000, 50, 1e-3, 6),
    "bert_base": Size(1_000, 50, 1e-3, 6),
}
SMOKE = {
    "resnet18": Size(16, 8, 1e-2, 2),
    "vit_b_16": Size(8, 4, 1e-2, 2),
    "bert_base": Size(8, 4, 1e-2, 2),
}
#: ``vit_warm_start``: ViT-B/16 to tol 1e-4, started from the top eigenvector of the Hessian
#: over this fraction of the data (``--warm-start``), then from a random vector as before
WARM_START = {"full": (Size(1_000, 50, 1e-4, 40), 1 / 16), "smoke": (Size(8, 4, 1e-3, 6), 0.25)}
#: ``vit_block_lanczos``: the run's size, the images the per-vector costs are timed on, the
#: block size and the block run's product budget (its float64 basis: 48 columns of ViT-B/16's
#: 86.6 M parameters, 33 GB). b = 2: on the CPU it needs the fewest products of the block sizes
#: (bench_block_lanczos.py: 1.6× the single-vector run's, so c_2 < 0.6 would make it cheaper)
BLOCK_LANCZOS = {
    "full": (Size(1_000, 50, 1e-4, 40), 200, 2, 48),
    "smoke": (Size(8, 4, 1e-3, 6), 4, 2, 8),
}
CALIBRATION_SIZES = {"full": ((100_000, 1_000), (1_000_000, 1_000)), "smoke": ((500, 5),)}
#: the maps on the device: the CPU part's largest size
DEVICE_MAP_SIZES = {"full": ((1_000_000, 1_000),), "smoke": ((500, 5),)}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the orchestrator


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; no CUDA tests")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--out", default=os.environ.get("CURVCAL_GPU_OUT"), help="also write here")
    parser.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--total-budget", type=float, default=420.0, help="seconds in all")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument(
        "--part-budget",
        type=float,
        default=None,
        help="each part's budget (s), instead of its default",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--record", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(
            f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}"
        )
    return args


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": device,
        "cpu_count": os.cpu_count(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info["device_name"] = properties.name
        info["device_memory_bytes"] = properties.total_memory
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["device_name"] = platform.processor() or platform.machine()
    for name in ("torchvision", "transformers", "timm"):
        try:
            info[name] = __import__(name).__version__
        except Exception as error:  # a missing package is a note, not a failure
            info[name] = f"unavailable ({type(error).__name__})"
    return info


def run_part(part: str, seconds: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``part`` in a child process group, killed after ``seconds``; its records and output."""
    record = work / f"{part}.jsonl"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", part,
               "--record", str(record), "--device", args.device]  # fmt: skip
    if args.smoke:
        command.append("--smoke")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    start = time.perf_counter()
    status, note = "ok", ""
    with open(work / f"{part}.log", "w+") as log:
        child = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = child.wait(timeout=seconds)
            if code != 0:
                status, note = "error", f"exit code {code}"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            status, note = "budget spent", f"killed after its budget of {seconds:.0f} s"
        log.seek(0)
        output = log.read()
    records = []
    if record.exists():
        for line in record.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    errors = [r["error"] for r in records if "error" in r]
    if errors and status == "ok":
        status, note = "error", errors[0]
    return {
        "part": part,
        "status": status,
        "note": note,
        "seconds": round(time.perf_counter() - start, 2),
        "budget_s": round(seconds, 1),
        "records": records,
        "output_tail": output[-LOG_TAIL:],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.worker:
        worker(args)
        return {}
    started = time.perf_counter()
    budgets = SMOKE_BUDGETS if args.smoke else BUDGETS
    report: dict[str, Any] = {
        "schema": "curvcal-gpu-run/1",
        "mode": "smoke" if args.smoke else "full",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "total_budget_s": args.total_budget,
        "environment": environment(args.device),
        "parts": [],
    }
    targets = [Path(args.results_dir)] + ([Path(args.out)] if args.out else [])
    say(f"gpu run: {report['mode']} on {report['environment']['device_name']}, "
        f"torch {report['environment']['torch']}, CUDA {report['environment']['cuda']}")  # fmt: skip
    chosen = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="curvcal-gpu-") as scratch:
        work = Path(scratch)
        for part in PARTS:
            if part not in chosen:
                continue
            left = args.total_budget - (time.perf_counter() - started)
            if part == "cuda-tests" and (args.smoke or not args.device.startswith("cuda")):
                result = {"part": part, "status": "skipped", "records": [],
                          "note": "not on a CUDA device (--smoke or --device cpu)"}  # fmt: skip
            elif left < MIN_START:
                result = {"part": part, "status": "skipped", "records": [],
                          "note": f"total budget spent ({left:.0f} s left)"}  # fmt: skip
            else:
                seconds = min(args.part_budget or budgets[part], left)
                say(f"== {part} (budget {seconds:.0f} s)")
                result = run_part(part, seconds, args, work)
            say(f"== {part}: {result['status']} {result.get('note', '')}".rstrip())
            report["parts"].append(result)
            report["wall_s"] = round(time.perf_counter() - started, 2)
            write(report, targets)
    return report


def write(report: dict[str, Any], targets: list[Path]) -> None:
    """gpu-run.json, gpu-run.md and gpu-run.log in every target folder (each file whole)."""
    stem = "gpu-run-smoke" if report["mode"] == "smoke" else "gpu-run"
    slim = {**report, "parts": [{k: v for k, v in p.items() if k != "output_tail"}
                                for p in report["parts"]]}  # fmt: skip
    logs = "".join(
        f"===== {p['part']} ({p['status']}) =====\n{p.get('output_tail', '')}\n"
        for p in report["parts"]
    )
    for folder in targets:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in ((f"{stem}.json", json.dumps(slim, indent=2, default=str) + "\n"),
                           (f"{stem}.md", markdown(report)), (f"{stem}.log", logs)):  # fmt: skip
            partial = folder / f".{name}.partial"
            partial.write_text(text)
            partial.replace(folder / name)


def _fmt(value: Any, spec: str = ".3g", unit: str = "") -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:{spec}}{unit}"
    return str(value)


def _graphs(plan: dict[str, Any] | None) -> str:
    return "—" if not plan else str(plan.get("graphs", "—"))


def _plan_cell(plan: dict[str, Any] | None) -> str:
    """The memory plan's budget (GB) and rows per chunk, "whole" when batches are not split."""
    if not plan:
        return "—"
    rows = f"{plan['pass_rows']} rows" if plan.get("micro_batched") else "whole batches"
    return f"{plan['budget_bytes'] / 1e9:.1f} GB, {rows}"


def _block_lanczos_lines(report: dict[str, Any]) -> list[str]:
    """The ``vit_block_lanczos`` tables: c_b per block size, then the two runs with c* = the
    single run's products over the block run's (block Lanczos is cheaper where c_b < c*)."""
    records = [r for p in report["parts"] for r in p["records"]]
    costs = [r for r in records if r.get("kind") == "block-cost"]
    runs = [r for r in records if r.get("kind") == "block-lanczos"]
    if not costs and not runs:
        return []
    lines = ["", "## Block Lanczos over probes (λmax)", ""]
    if costs:
        lines += ["| model | images | b | matmat s | b matvecs s | per-vector cost c_b | engine |",
                  "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        lines += [f"| {r['model']} | {r['samples']:,} | {r['width']} | {r['matmat_s']:.3f} | "
                  f"{r['matvecs_s']:.3f} | {r['per_vector']:.3f} | {r['engine']} |"
                  for r in costs]  # fmt: skip
    single = next((r["products"] for r in runs if r["block"] == 1), None)
    if runs:
        lines += ["", "| model | tol | strategy | products (steps) | c_b | full-product units "
                  "| break-even c* | s | λmax (converged, residual) |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for r in runs:
            even = "—" if single is None or r["block"] == 1 else f"{single / r['products']:.2f}"
            lines.append(
                f"| {r['model']} | {r['tol']:g} | {r['strategy']} | {r['products']} "
                f"({r['block_steps']}) | {r['per_vector']:.3f} | {r['units']:.2f} | {even} | "
                f"{r['seconds']:.1f} | {_fmt(r['lambda_max'], '.6g')} ({r['converged']}, "
                f"{_fmt(r['residual'], '.1e')}) |"
            )
        first = runs[0]
        timed_with = costs[0]["keep_graphs"] if costs else "—"
        lines.append(
            f"\nThe whole data's graphs kept for {first['kept_rows'] or 0:,} of "
            f"{first['n_samples']:,} images (c_b timed with keep_graphs={timed_with}); its first "
            f"product {first['first_product_s']:.2f} s."
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# curvcal GPU run ({report['mode']})",
        "",
        f"{env['device_name']} · torch {env['torch']} · CUDA {env['cuda']} · "
        f"Python {env['python']} · {report['started']} · {report.get('wall_s', 0):.0f} s "
        f"of a {report['total_budget_s']:.0f} s budget",
        "",
        "| part | status | seconds | note |",
        "|---|---|---:|---|",
    ]
    for part in report["parts"]:
        note = " ".join(str(part.get("note", "")).split())[:200]
        lines.append(
            f"| {part['part']} | {part['status']} | {_fmt(part.get('seconds'), '.1f')} | {note} |"
        )
    tests = [r for p in report["parts"] if p["part"] == "cuda-tests" for r in p["records"]]
    if tests:
        lines += ["", "## CUDA tests", "", "| test | outcome | seconds |", "|---|---|---:|"]
        lines += [f"| {r['test']} | {r['outcome']} | {_fmt(r['seconds'], '.1f')} |"
                  for r in tests if "test" in r]  # fmt: skip
    models = [r for p in report["parts"] for r in p["records"] if r.get("kind") == "hessian"]
    kernels = {
        r["model"]: r
        for p in report["parts"]
        for r in p["records"]
        if r.get("kind") == "hessian-kernel"
    }
    if models:
        lines += [
            "",
            "## Hessian products against a gradient pass",
            "",
            "| model | P | N (batch) | λmax (converged, residual) | products | λmax wall | "
            "s / product | product / gradient | peak / gradient | engine, cache | kernel s "
            "(graphs) | run / kernel | budget, rows per chunk |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
        ]
        for r in models:
            kernel = kernels.get(r["model"], {})
            peak = "—" if r.get("peak_ratio") is None else (
                f"{r['peak_ratio']:.2f} ({r['peak_bytes'] / 2**30:.1f} / "
                f"{r['gradient_peak_bytes'] / 2**30:.1f} GiB)")  # fmt: skip
            lines.append(
                f"| {r['model']} | {r['n_params']:,} | {r['n_samples']:,} ({r['batch']}) | "
                f"{_fmt(r['lambda_max'], '.6g')} ({r['converged']}, {_fmt(r['residual'], '.1e')}) | "
                f"{r['products']} | {_fmt(r['eigen_s'], '.1f', ' s')} | "
                f"{_fmt(r['seconds_per_product'], '.3f')} | {_fmt(r['product_ratio'], '.2f')} | "
                f"{peak} | {r['engine']}, {r['cache_mode']} | "
                f"{_fmt(kernel.get('kernel_s'), '.3f')} ({_graphs(r.get('memory_plan'))}) | "
                f"{_fmt(kernel.get('run_per_kernel'), '.2f')} | {_plan_cell(r.get('memory_plan'))} |"
            )
    warm = [r for p in report["parts"] for r in p["records"] if r.get("kind") == "warm-start"]
    if warm:
        lines += ["", "## Warm start (λmax)", "",
                  "| model | tol | start | full products | warm products (samples) | full-product units "
                  "| s (warm stage) | λmax (converged, residual) |",
                  "|---|---:|---|---:|---|---:|---|---|"]  # fmt: skip
        for r in warm:
            stage = "—" if r["start"] == "random" else (
                f"{r['warm_products']} ({r['warm_samples']:,} = {r['fraction']:g} of the data)")  # fmt: skip
            lines.append(
                f"| {r['model']} | {r['tol']:g} | {r['start']} | {r['products']} | {stage} | "
                f"{r['units']:.2f} | {r['eigen_s'] + r['warm_s']:.1f} ({r['warm_s']:.1f}) | "
                f"{_fmt(r['lambda_max'], '.6g')} ({r['converged']}, {_fmt(r['residual'], '.1e')}) |"
            )
    lines += _block_lanczos_lines(report)
    llama = [r for p in report["parts"] for r in p["records"] if r.get("kind") == "llama"]
    if llama:
        lines += ["", "## The plan's 1B classifier, measured", "",
                  "| path | P | tokens (micro-batch) | gradient s | product s | product / gradient "
                  "| data passes / product | rows per chunk | peak GB, gradient / product | plan: s, GB |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
        for r in llama:
            plan_s = "–".join(f"{v:.3g}" for v in r["plan_seconds"] or ())
            peaks = "—" if r["product_peak_bytes"] is None else (
                f"{r['gradient_peak_bytes'] / 1e9:.1f} / {r['product_peak_bytes'] / 1e9:.1f}")  # fmt: skip
            lines.append(
                f"| {r['path']} | {r['n_params']:,} | {r['sequences']} × {r['tokens']} "
                f"({r['micro_batch']}) | {r['gradient_s']:.2f} | {r['product_s']:.2f} | "
                f"{r['product_per_gradient']:.2f} | {_fmt(r['data_passes_per_product'])} | "
                f"{_fmt(r.get('plan_rows'))} | {peaks} | "
                f"{plan_s} s, {_fmt(r['plan_gb'], '.0f')} GB |"
            )
        for r in (r for p in report["parts"] for r in p["records"]):
            if r.get("kind") == "llama-lambda":
                lines.append(
                    f"\nλmax ({r['dtype']}): {r['lambda_max']:.6g} after {r['products']} products "
                    f"in {r['seconds']:.1f} s (converged: {r['converged']}, precision floor "
                    f"{_fmt(r['precision_floor'], '.2g')})"
                )
    calibration = latest_calibration([r for p in report["parts"] for r in p["records"]])
    if calibration:
        lines += ["", "## Calibration (CPU fits)", "",
                  "| N × K | all metrics | TS | focal TS (defaults) | T | γ, T (focal) |",
                  "|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for r in calibration:
            lines.append(
                f"| {r['n']:,} × {r['k']:,} | {_fmt(r.get('metrics_s'), '.2f', ' s')} | "
                f"{_fmt(r.get('ts_s'), '.2f', ' s')} | {_fmt(r.get('focal_s'), '.2f', ' s')} | "
                f"{_fmt(r.get('temperature'), '.4f')} | "
                f"{_fmt(r.get('focal_gamma'))}, {_fmt(r.get('focal_temperature'), '.4f')} |"
            )
    on_device = latest_calibration(
        [r for p in report["parts"] for r in p["records"]], kind="maps-device"
    )
    if on_device:
        lines += ["", "## Maps on the device (TS and focal TS, float64)", "",
                  "| N × K | device | all metrics | TS fit | TS apply | focal TS (defaults) | T "
                  "| γ, T (focal) | peak |",
                  "|---|---|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
        for r in on_device:
            lines.append(
                f"| {r['n']:,} × {r['k']:,} | {r['device']} | "
                f"{_fmt(r.get('metrics_s'), '.2f', ' s')} | {_fmt(r.get('ts_s'), '.2f', ' s')} | "
                f"{_fmt(r.get('apply_s'), '.2f', ' s')} | {_fmt(r.get('focal_s'), '.2f', ' s')} | "
                f"{_fmt(r.get('temperature'), '.4f')} | "
                f"{_fmt(r.get('focal_gamma'))}, {_fmt(r.get('focal_temperature'), '.4f')} | "
                f"{_fmt(r.get('peak_gib'), '.1f', ' GiB')} |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the workers (one per part, in their own process)


def worker(args: argparse.Namespace) -> None:
    assert args.record is not None

    def emit(record: dict[str, Any]) -> None:
        with open(args.record, "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()

    try:
        if args.worker == "cuda-tests":
            cuda_tests(emit)
        elif args.worker == "calibration":
            calibration(args, emit)
        elif args.worker == "maps-device":
            maps_on_device(args, emit)
        elif args.worker == "vit_warm_start":
            warm_start_part(args, emit)
        elif args.worker == "vit_block_lanczos":
            block_lanczos_part(args, emit)
        elif args.worker == "llama_1b":
            from llama_part import llama_part  # type: ignore[import-not-found]

            llama_part(args, emit)
        else:
            sizes = SMOKE if args.smoke else FULL
            hessian_part(args.worker, sizes[args.worker], args, emit)
    except Exception as error:  # recorded for the report; the next part still runs
        import traceback

        traceback.print_exc()
        emit({"error": f"{type(error).__name__}: {' '.join(str(error).split())[:1000]}"})
        sys.exit(1)


def cuda_tests(emit: Callable[[dict[str, Any]], None]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-m", "cuda", "tests/cuda", "-v", "-rfE",
                   "-p", "no:cacheprovider", f"--junitxml={junit}"]  # fmt: skip
        code = subprocess.call(command, cwd=ROOT)
        if not junit.exists():
            emit({"error": f"pytest wrote no results (exit code {code})"})
            return
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                found = case.find(tag)
                if found is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    message = (found.get("message") or "")[:500]
            emit({"test": case.get("name"), "outcome": outcome, "message": message,
                  "seconds": float(case.get("time") or 0.0)})  # fmt: skip
        if code != 0:
            emit({"error": f"pytest exit code {code}"})


def hessian_part(
    name: str, size: Size, args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]
) -> None:
    import torch

    from curvcal.cli import main as cli

    device = torch.device(args.device)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix=f"curvcal-{name}-") as scratch:
        folder = Path(scratch)
        say(f"{name}: building the model and {size.samples} samples")
        model, batches, forward, cli_args = BUILDERS[name](folder, size, args.smoke)
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        model = model.to(device).eval()
        moved = [(to_device(x, device), y.to(device)) for x, y in batches]
        params = [p for p in model.parameters() if p.requires_grad]
        # the same precision as curvcal's products: TF32 off (curvcal turns it off unless
        # --allow-tf32), so the ratio compares like with like
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        rounds = []
        for _ in range(2):  # the first pass warms the kernels up
            with Meter(device) as meter:
                for x, y in moved:
                    loss = torch.nn.functional.cross_entropy(forward(model, x), y, reduction="sum")
                    torch.autograd.grad(loss, params)
            rounds.append(meter)
        gradient = rounds[-1]
        say(f"{name}: gradient pass {gradient.seconds:.3f} s")
        del model, moved, params, rounds
        output = folder / "hessian.json"
        command = [*cli_args, "--device", args.device, "--batch-size", str(size.batch),
                   "--no-trace", "--tol", str(size.tol), "--max-iter", str(size.max_iter),
                   "-o", str(output), "--quiet"]  # fmt: skip
        say("curvcal " + " ".join(command))
        with Meter(device) as run, contextlib.redirect_stdout(io.StringIO()):
            code = cli(command)
        if code != 0 or not output.exists():
            raise RuntimeError(f"curvcal hessian exited with {code}")
        result = json.loads(output.read_text())
        results, timings = result["results"], result["timings"]
        operator = results["operator"]
        products = int(operator["n_matvecs"])
        eigen_s = float(timings["eigenvalues"])
        per_product = eigen_s / products if products else None
        spectrum = results["spectrum"]["values"][0]
        emit({
            "kind": "hessian", "model": name, "n_params": n_params,
            "n_samples": operator["n_samples"], "batch": size.batch, "tol": size.tol,
            "max_iter": size.max_iter, "lambda_max": results["lambda_max"],
            "converged": results["converged"], "residual": spectrum["residual"],
            "stopped_by": results["spectrum"]["stopped_by"], "products": products,
            "data_passes": operator["n_data_passes"], "eigen_s": eigen_s,
            "cli_wall_s": run.seconds, "timings": timings, "gradient_s": gradient.seconds,
            "seconds_per_product": per_product,
            "product_ratio": per_product / gradient.seconds if per_product else None,
            "peak_bytes": run.peak, "gradient_peak_bytes": gradient.peak,
            "peak_ratio": run.peak / gradient.peak if run.peak and gradient.peak else None,
            "engine": operator["engine"], "cache_mode": operator["cache_mode"],
            "graphs_kept": operator["graphs_kept"], "oom_retries": operator.get("oom_retries"),
            "device": result["environment"].get("device_name"),
            "memory_plan": operator.get("memory_plan"),
        })  # fmt: skip
        # the kernel last, on the model built again, so that a part whose budget runs out here
        # keeps its row above (the run's peak is measured without a second copy of the model)
        model, batches, forward, _cli_args = BUILDERS[name](folder, size, args.smoke)
        model = model.to(device).eval()
        moved = [(to_device(x, device), y.to(device)) for x, y in batches]
        kernel = product_kernel(model, forward, moved, device)
        say(f"{name}: one product {kernel.seconds:.3f} s (the kernel, the default plan)")
        emit({
            "kind": "hessian-kernel", "model": name, "kernel_s": kernel.seconds,
            "kernel_peak_bytes": kernel.peak,
            "run_per_kernel": per_product / kernel.seconds if per_product else None,
            "kernel_per_gradient": kernel.seconds / gradient.seconds,
        })  # fmt: skip


def warm_start_part(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """ViT-B/16 to tol 1e-4 (at most ``max_iter`` steps): ``--warm-start F`` first (a record of
    its own, so that it is kept if the budget runs out in the next run), then the plain run
    from a random start; each in full-product units, the warm stage's products counted at F."""
    import torch

    from curvcal.cli import main as cli

    size, fraction = WARM_START["smoke" if args.smoke else "full"]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="curvcal-warm-") as scratch:
        folder = Path(scratch)
        say(f"vit_warm_start: building the model and {size.samples} samples")
        model, _batches, _forward, cli_args = build_vit(folder, size, args.smoke)
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model, _batches
        for start, extra in (("warm", ["--warm-start", repr(fraction)]), ("random", [])):
            output = folder / f"{start}.json"
            command = [*cli_args, "--device", args.device, "--batch-size", str(size.batch),
                       "--no-trace", "--tol", str(size.tol), "--max-iter", str(size.max_iter),
                       *extra, "-o", str(output), "--quiet"]  # fmt: skip
            say("curvcal " + " ".join(command))
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli(command)
            if code != 0 or not output.exists():
                raise RuntimeError(f"curvcal hessian ({start} start) exited with {code}")
            result = json.loads(output.read_text())
            results, timings = result["results"], result["timings"]
            warm = results["operator"].get("warm_start") or {}
            products = int(results["operator"]["n_matvecs"])
            share = warm["n_samples"] / results["operator"]["n_samples"] if warm else 0.0
            emit({
                "kind": "warm-start", "model": "vit_b_16", "start": start, "n_params": n_params,
                "n_samples": results["operator"]["n_samples"], "tol": size.tol,
                "fraction": warm.get("fraction"), "warm_samples": warm.get("n_samples"),
                "warm_products": warm.get("n_matvecs", 0), "products": products,
                "units": products + share * warm.get("n_matvecs", 0),
                "eigen_s": float(timings["eigenvalues"]),
                "warm_s": float(timings.get("warm_start", 0.0)),
                "lambda_max": results["lambda_max"], "converged": results["converged"],
                "residual": results["spectrum"]["values"][0]["residual"],
            })  # fmt: skip


def block_lanczos_part(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """ViT-B/16: c_b = matmat(b) / (b matvecs) at b = 1, 2, 4, 8 over the first images (``func``
    for blocks on CUDA; graphs kept only where the whole data's operator keeps them for every
    image, its first product deciding), then λmax to tol 1e-4 over every image by block Lanczos
    and by curvcal's Lanczos (each a record of its own, so that a budget spent in the second
    keeps the first)."""
    import torch

    import curvcal
    from curvcal.curvature.eigen import eigenvalues

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_block_lanczos import (  # type: ignore[import-not-found]
        WIDTHS,
        block_lanczos,
        per_vector_costs,
    )

    size, cost_samples, block, budget = BLOCK_LANCZOS["smoke" if args.smoke else "full"]
    device = torch.device(args.device)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="curvcal-block-") as scratch:
        say(f"vit_block_lanczos: building the model and {size.samples} samples")
        model, batches, _forward, _cli_args = build_vit(Path(scratch), size, args.smoke)
    model = model.to(device).eval()
    moved = [(to_device(x, device), y.to(device)) for x, y in batches]
    # the whole data's operator first: its memory plan (graphs kept for every image, some or
    # none) decides how the costs are timed, so that c_b is the cost of the products its runs make
    operator = curvcal.hessian_operator(model, moved)
    start = torch.randn(operator.shape[0], generator=torch.Generator().manual_seed(0))
    with Meter(device) as first:
        operator.matvec(start.to(device))
    kept_rows = operator.kept_rows
    keep = "auto" if kept_rows == operator.n_samples else "never"
    few = moved[: max(1, cost_samples // size.batch)]
    timed = curvcal.hessian_operator(model, few, keep_graphs=keep)
    costs = per_vector_costs(timed, WIDTHS, repeats=1)
    for width, cells in costs.items():
        emit({"kind": "block-cost", "model": "vit_b_16", "samples": timed.n_samples,
              "width": width, **cells, "engine": timed.engine, "keep_graphs": keep,
              "graphs_kept": timed.graphs_kept})  # fmt: skip
        say(f"vit_block_lanczos: b = {width}: per-vector cost {cells['per_vector']:.3f}")
    del timed
    common = {"kind": "block-lanczos", "model": "vit_b_16", "n_params": operator.shape[0],
              "n_samples": operator.n_samples, "tol": size.tol, "kept_rows": kept_rows,
              "first_product_s": first.seconds}  # fmt: skip
    with Meter(device) as meter:
        found = block_lanczos(operator, block, tol=size.tol, seed=0, max_products=budget)
    per_vector = costs[block]["per_vector"]
    emit({**common, "strategy": f"block {block}", "block": block, "products": found.products,
          "block_steps": found.block_steps, "per_vector": per_vector,
          "units": found.products * per_vector, "lambda_max": found.value,
          "converged": found.converged, "residual": found.residual,
          "stopped_by": found.stopped_by, "seconds": meter.seconds})  # fmt: skip
    with Meter(device) as meter:
        spectrum = eigenvalues(operator, 1, tol=size.tol, seed=0, max_iter=size.max_iter)
    top = spectrum.values[0]
    emit({**common, "strategy": "single", "block": 1, "products": spectrum.matvecs,
          "block_steps": top.iterations, "per_vector": 1.0, "units": float(spectrum.matvecs),
          "lambda_max": top.value, "converged": spectrum.converged, "residual": top.residual,
          "stopped_by": spectrum.stopped_by, "seconds": meter.seconds})  # fmt: skip


def product_kernel(
    model: Any, forward: Callable[..., Any], batches: list[Any], device: Any
) -> Meter:
    """One Hessian-vector product of a fixed vector by the default operator (the memory plan
    ``curvcal hessian`` makes: kept graphs where they fit) of ``forward(model, x)``, after a
    warm-up product that builds them: the kernel a run's cost per product is compared with
    (bench_overhead.py on the CPU)."""
    import torch

    from curvcal.curvature.operator import HessianOperator

    class Logits(torch.nn.Module):
        """``model`` returning its logits from one argument, as curvcal's loader wraps it."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return forward(self.model, x)

    operator = HessianOperator(Logits().eval(), batches)
    vector = torch.randn(operator.shape[0], generator=torch.Generator().manual_seed(0))
    operator.matvec(vector)
    with Meter(device) as meter:
        operator.matvec(vector)
    del operator
    return meter


def to_device(x: Any, device: Any) -> Any:
    if isinstance(x, dict):
        return {key: value.to(device) for key, value in x.items()}
    return x.to(device)


def _image_data(folder: Path, size: Size, shape: tuple[int, ...], classes: int) -> Any:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(size.samples, *shape, generator=generator) - 0.5) / 0.25
    y = torch.randint(0, classes, (size.samples,), generator=generator)
    save_file({"x": x.contiguous(), "y": y}, str(folder / "data.safetensors"))
    return list(zip(x.split(size.batch), y.split(size.batch), strict=True))


def _plain(model: Any, x: Any) -> Any:
    return model(x)


def build_resnet18(folder: Path, size: Size, smoke: bool) -> tuple[Any, ...]:
    import torchvision
    from safetensors.torch import save_file

    model = torchvision.models.resnet18(num_classes=10)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "m.safetensors")
    )
    batches = _image_data(folder, size, (3, 32, 32), 10)
    args = ["hessian", str(folder / "m.safetensors"), "--arch", "tv:resnet18",
            "--num-classes", "10", "--data", str(folder / "data.safetensors")]  # fmt: skip
    return model, batches, _plain, args


def build_vit(folder: Path, size: Size, smoke: bool) -> tuple[Any, ...]:
    import timm
    from safetensors.torch import save_file

    # ViT-B/16 at 224 (86M parameters); the smoke run takes ViT-Ti/16 at 32 (4 patches)
    name, kwargs = ("vit_tiny_patch16_224", {"img_size": 32, "num_classes": 10}) if smoke else (
        "vit_base_patch16_224", {"num_classes": 1000})  # fmt: skip
    model = timm.create_model(name, pretrained=False, **kwargs)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "m.safetensors")
    )
    side = kwargs.get("img_size", 224)
    batches = _image_data(folder, size, (3, side, side), kwargs["num_classes"])
    args = ["hessian", str(folder / "m.safetensors"), "--arch", f"timm:{name}",
            "--arch-kwargs", json.dumps(kwargs), "--data", str(folder / "data.safetensors")]  # fmt: skip
    return model, batches, _plain, args


def _logits(model: Any, x: Any) -> Any:
    return model(**x).logits


def build_bert(folder: Path, size: Size, smoke: bool) -> tuple[Any, ...]:
    import torch
    import transformers

    # BERT-base (110M parameters, 30,522 tokens) at 128 tokens; the smoke run a 2-layer one at 16
    vocab_size, length = (200, 16) if smoke else (30_522, 128)
    config = transformers.BertConfig(vocab_size=vocab_size, num_labels=2)
    if smoke:
        config = transformers.BertConfig(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64, num_labels=2,
        )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    model_dir = folder / "model"
    model.save_pretrained(model_dir)
    words = [f"w{i}" for i in range(vocab_size - 5)]
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab))
    tokenizer.save_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(0, len(words), (size.samples, length), generator=generator)
    labels = torch.randint(0, 2, (size.samples,), generator=generator)
    texts = [" ".join(words[i] for i in row) for row in picks.tolist()]
    data = folder / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": int(label)}) + "\n"
                            for t, label in zip(texts, labels.tolist(), strict=True)))  # fmt: skip
    batches = []
    for start in range(0, size.samples, size.batch):
        encoded = tokenizer(texts[start : start + size.batch], padding=True, truncation=True,
                            max_length=length, return_tensors="pt")  # fmt: skip
        inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        batches.append((inputs, labels[start : start + size.batch]))
    args = ["hessian", str(model_dir), "--data", str(data), "--max-length", str(length)]
    return model, batches, _logits, args


BUILDERS: dict[str, Callable[[Path, Size, bool], tuple[Any, ...]]] = {
    "resnet18": build_resnet18,
    "vit_b_16": build_vit,
    "bert_base": build_bert,
}


def synthetic_logits(n: int, k: int, draw_on: Any) -> tuple[Any, Any]:
    """N×K float32 logits 2.5·z and labels ~ softmax(z) by Gumbel-max (over-confident: T near
    2.5), drawn on ``draw_on`` in slices from seed 0 and brought to the host."""
    import math

    import torch

    generator = torch.Generator(device=draw_on).manual_seed(0)
    sigma = 1.0 + 0.5 * math.log(k)
    logits = torch.empty(n, k, dtype=torch.float32)
    labels = torch.empty(n, dtype=torch.int64)
    step = max(1, (1 << 24) // k)
    for start in range(0, n, step):
        rows = min(step, n - start)
        z = torch.randn(rows, k, generator=generator, device=draw_on) * sigma
        uniform = torch.rand(rows, k, generator=generator, device=draw_on).clamp_(min=1e-12)
        labels[start : start + rows] = (z - torch.log(-torch.log(uniform))).argmax(1).cpu()
        logits[start : start + rows] = (2.5 * z).cpu()
    return logits, labels


def calibration(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    import torch

    from curvcal.calibration import calibration_metrics, fit_focal_temperature, fit_temperature

    torch.set_num_threads(os.cpu_count() or 1)
    draw_on = torch.device(args.device)
    for n, k in CALIBRATION_SIZES["smoke" if args.smoke else "full"]:
        # drawn on the device, fitted on the host
        logits, labels = synthetic_logits(n, k, draw_on)
        record: dict[str, Any] = {"kind": "calibration", "n": n, "k": k,
                                  "threads": torch.get_num_threads()}  # fmt: skip
        start_s = time.perf_counter()
        metrics = calibration_metrics(logits, labels)
        record.update(metrics_s=time.perf_counter() - start_s, ece=metrics.ece)
        emit({**record, "stage": "metrics"})
        start_s = time.perf_counter()
        fit = fit_temperature(logits, labels)
        record.update(ts_s=time.perf_counter() - start_s, temperature=fit.temperature)
        emit({**record, "stage": "ts"})
        start_s = time.perf_counter()
        focal = fit_focal_temperature(logits, labels)
        record.update(focal_s=time.perf_counter() - start_s, focal_gamma=focal.gamma,
                      focal_temperature=focal.temperature, focal_ece=focal.objective_after)  # fmt: skip
        emit(record)
        del logits, labels


def maps_on_device(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """All metrics, then TS and focal TS (its defaults) fitted on ``--device`` from host logits
    (the product's path: each chunk of rows moved there and made float64 log-probabilities
    there), and TS applied there: seconds, ECE, T and γ (compare with the ``calibration``
    part's CPU numbers of the same draw) and the device's peak memory."""
    import torch

    from curvcal.calibration import calibration_metrics, fit_focal_temperature, fit_temperature
    from curvcal.calibration.results import Calibrator

    device = torch.device(args.device)

    def synchronise() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for n, k in DEVICE_MAP_SIZES["smoke" if args.smoke else "full"]:
        logits, labels = synthetic_logits(n, k, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        record: dict[str, Any] = {"kind": "maps-device", "n": n, "k": k, "device": str(device)}
        began = time.perf_counter()
        metrics = calibration_metrics(logits, labels, device=device)
        synchronise()
        record.update(metrics_s=time.perf_counter() - began, ece=metrics.ece)
        emit({**record, "stage": "metrics"})
        began = time.perf_counter()
        fit = fit_temperature(logits, labels, device=device)
        synchronise()
        record.update(ts_s=time.perf_counter() - began, temperature=fit.temperature)
        emit({**record, "stage": "ts"})
        began = time.perf_counter()
        applied = Calibrator("temperature", fit.temperature).apply(logits, device=device)
        synchronise()
        record.update(apply_s=time.perf_counter() - began)
        del applied
        began = time.perf_counter()
        focal = fit_focal_temperature(logits, labels, device=device)
        synchronise()
        record.update(focal_s=time.perf_counter() - began, focal_gamma=focal.gamma,
                      focal_temperature=focal.temperature)  # fmt: skip
        if device.type == "cuda":
            record["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        emit(record)
        del logits, labels


def latest_calibration(
    records: list[dict[str, Any]], kind: str = "calibration"
) -> list[dict[str, Any]]:
    """The last record of ``kind`` of each size (the stages of one size are written as they
    finish)."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == kind:
            last[r["n"], r["k"]] = r
    return list(last.values())


if __name__ == "__main__":
    report = main()
    if report and any(p["status"] not in ("ok", "skipped") for p in report["parts"]):
        sys.exit(1)
