"""Hessian products of a Llama-style sequence classifier on the CPU: the model's dtype, and the
model replicated or sharded over gloo ranks.

The model is transformers' ``LlamaForSequenceClassification`` built from a config with random
weights (default: hidden 512, 4 layers, feed-forward 1024, 8 heads of which 4 key/value, vocabulary
8000, 4 classes; P = 13.5 M, the token embedding included) on random token sequences (default 8 of
64 tokens, no padding), wrapped as curvcal's loader wraps a transformers folder (the forward
returns the logits). Every parameter is in the Hessian. The score head is drawn with standard
deviation 3/√hidden so that the logits spread over a few units and the loss has real curvature.

``dtypes`` (one process, one thread): for the model in float64, float32 and bfloat16 (the same
weights, rounded), interleaved, the minimum over ``--repeats`` of the seconds per gradient pass
and per Hessian product (double backward, graphs rebuilt for every product: what a model too
large to keep its graphs pays), their ratio k; then λmax by curvcal's Lanczos (the default
operator, tol ``--tol``) with its relative error against the float64 λmax and the precision
floor curvcal states for the dtype (``EigenSpectrum.precision_floor``)::

    python benchmarks/bench_llama.py dtypes [--repeats 3] [--tol 1e-4] [--json OUT]

``ranks``: for each world size W of ``--worlds`` and each of ``none`` (the model replicated on
every rank, double backward with graphs rebuilt, products all-reduced) and ``blocks`` (FSDP2 per decoder layer,
central differences: 5 points in float32, 4–6 gradient passes), three fresh launches of
``python -m torch.distributed.run --standalone --nproc-per-node W benchmarks/bench_llama.py rank
MODE STEP`` (STEP ``idle``: the model and operator built, nothing run; ``gradient``: gradient
passes; ``product``: Hessian products), each rank on one thread with its shard of the samples.
Each rank measures its seconds per pass (minimum of ``--repeats`` after one warm-up) and its
peak resident set (``ru_maxrss``, the process's maximum: hence a fresh launch per step); rank 0
prints every rank's, and the table gives the largest over the ranks::

    python benchmarks/bench_llama.py ranks [--worlds 1,2,4] [--repeats 2] [--json OUT]

The shape options (``--hidden``, ``--layers``, ``--intermediate``, ``--heads``, ``--kv-heads``,
``--vocab``, ``--tokens``, ``--samples``, ``--batch``) apply to every subcommand.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from curvcal.curvature import HessianOperator, eigenvalues
from curvcal.load.models.hf import LogitsModule
from curvcal.losses import loss_from_name

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("none", "blocks")
STEPS = ("idle", "gradient", "product")
Batches = list[tuple[dict[str, Tensor], Tensor]]


@dataclass(frozen=True)
class Shape:
    """The classifier and its data."""

    hidden: int = 512
    layers: int = 4
    intermediate: int = 1024
    heads: int = 8
    kv_heads: int = 4
    vocab: int = 8000
    labels: int = 4
    tokens: int = 64
    samples: int = 8
    batch: int = 8


def build_model(shape: Shape, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A random ``LlamaForSequenceClassification`` in ``dtype`` (the same weights for every
    dtype: drawn in float32 from seed 0, then cast), eval mode, wrapped to return logits."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(shape.tokens, 16),
        num_labels=shape.labels,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 3.0 / shape.hidden**0.5)
    return LogitsModule(model.to(dtype).eval(), "text").eval()


def token_data(shape: Shape) -> tuple[Tensor, Tensor]:
    """``samples`` random sequences of ``tokens`` ids in [1, vocab) (0 is the pad id, never
    drawn: every sequence is read at its last token) and random labels; fixed seed."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, shape.vocab, (shape.samples, shape.tokens), generator=generator)
    labels = torch.randint(0, shape.labels, (shape.samples,), generator=generator)
    return ids, labels


def batches_of(ids: Tensor, labels: Tensor, rows: Sequence[int], batch: int) -> Batches:
    """The ``rows`` of the data in batches of ``batch``, as the loader's text batches."""
    index = torch.as_tensor(list(rows), dtype=torch.long)
    ids, labels = ids[index], labels[index]
    return [
        (
            {
                "input_ids": ids[i : i + batch],
                "attention_mask": torch.ones_like(ids[i : i + batch]),
            },
            labels[i : i + batch],
        )
        for i in range(0, len(index), batch)
    ]


def gradient_pass(model: nn.Module, batches: Batches) -> None:
    """One gradient of the summed cross-entropy over ``batches`` (accumulated in ``.grad``, as
    a sharded model's backward must), then the gradients dropped."""
    loss = loss_from_name("ce", 0.0)
    for x, y in batches:
        loss.sum(model(x), y).backward()
    model.zero_grad(set_to_none=True)


def fastest(steps: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Minimum wall time of each step over ``repeats`` rounds, the steps interleaved within a
    round, after one untimed round."""
    for step in steps.values():
        step()
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(repeats):
        for name, step in steps.items():
            began = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def dtype_rows(shape: Shape, repeats: int, tol: float) -> list[dict[str, Any]]:
    """Per dtype of :data:`DTYPES`: seconds per gradient pass and per product, their ratio, and
    λmax with its error against float64 and the stated precision floor."""
    torch.set_num_threads(1)
    ids, labels = token_data(shape)
    batches = batches_of(ids, labels, range(shape.samples), shape.batch)
    models = {name: build_model(shape, dtype) for name, dtype in DTYPES.items()}
    steps: dict[str, Callable[[], Any]] = {}
    for name, model in models.items():
        rebuilt = HessianOperator(model, batches, keep_graphs="never")
        vector = torch.randn(
            rebuilt.shape[0], generator=torch.Generator().manual_seed(2), dtype=rebuilt.dtype
        )
        steps[f"{name} gradient"] = lambda model=model: gradient_pass(model, batches)
        steps[f"{name} product"] = lambda op=rebuilt, v=vector: op.matvec(v)
    seconds = fastest(steps, repeats)
    rows = []
    for name, model in models.items():
        began = time.perf_counter()
        spectrum = eigenvalues(HessianOperator(model, batches), 1, tol=tol, seed=0)
        rows.append(
            {
                "dtype": name,
                "n_params": sum(p.numel() for p in model.parameters()),
                "gradient_s": seconds[f"{name} gradient"],
                "product_s": seconds[f"{name} product"],
                "product_per_gradient": seconds[f"{name} product"] / seconds[f"{name} gradient"],
                "lambda_max": spectrum.eigenvalues[0],
                "lambda_products": spectrum.values[0].matvecs,
                "lambda_s": time.perf_counter() - began,
                "converged": spectrum.values[0].converged,
                "precision_floor": spectrum.precision_floor,
            }
        )
    reference = rows[0]["lambda_max"]
    for row in rows:
        row["lambda_relative_error"] = abs(row["lambda_max"] - reference) / abs(reference)
    return rows


def dtype_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| dtype | gradient s | product s | product / gradient | λmax | products | "
        "error vs float64 | precision floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        floor = f"{row['precision_floor']:.1e}" if row["precision_floor"] else "— (none stated)"
        lines.append(
            f"| {row['dtype']} | {row['gradient_s']:.3f} | {row['product_s']:.3f} | "
            f"{row['product_per_gradient']:.2f} | {row['lambda_max']:.6g} | "
            f"{row['lambda_products']} | {row['lambda_relative_error']:.1e} | {floor} |"
        )
    return "\n".join(lines)


def rank_main(mode: str, step: str, shape: Shape, repeats: int) -> dict[str, Any]:
    """One rank of a ``torch.distributed.run`` launch: the model replicated (``none``) or sharded
    per decoder layer (``blocks``), this rank's samples, then ``step``; on rank 0 every rank's
    seconds per pass and peak resident set (``{"records": [...]}``), on the others nothing."""
    import torch.distributed as dist

    from curvcal.distributed import leave

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    # the model, its hooks and every gloo work object they hold are unreachable once the
    # record is taken: ``leave`` collects them while the group is alive (freed at interpreter
    # exit instead, a work object's destructor may abort the rank after its record is out)
    record = rank_record(mode, step, shape, repeats)
    records: list[Any] = [None] * world
    dist.all_gather_object(records, record)  # rank 0 prints them all: one line, never interleaved
    leave()
    return {"records": records} if record["rank"] == 0 else {}


def rank_record(mode: str, step: str, shape: Shape, repeats: int) -> dict[str, Any]:
    """This rank's seconds per ``step`` and peak resident set (see :func:`rank_main`)."""
    import torch.distributed as dist

    from curvcal.curvature import build_operator
    from curvcal.curvature.vectors import space_of
    from curvcal.distributed import all_reduce_sum, shard_indices
    from curvcal.settings.hessian import HessianSettings
    from curvcal.sharding import shard_model

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(shape)
    ids, labels = token_data(shape)
    batches = batches_of(ids, labels, shard_indices(shape.samples, rank, world), shape.batch)
    if mode == "blocks":
        shard_model(model, "blocks", torch.device("cpu"))
    # graphs rebuilt for every replicated product, as in the dtype rows (a sharded product
    # keeps none: it is gradient passes)
    settings = HessianSettings(keep_graphs="never")
    operator = build_operator(
        model, loss_from_name("ce", 0.0), batches, settings, all_reduce=all_reduce_sum
    )
    # this rank's slice of v on the sharded model (whole on the replicated one), drawn only for
    # products, so that idle and gradient peaks hold no vector
    vector = (
        space_of(operator).normal(torch.Generator().manual_seed(2), operator.dtype)
        if step == "product"
        else None
    )
    run: Callable[[], Any] = {
        "idle": lambda: None,
        "gradient": lambda: gradient_pass(model, batches),
        "product": lambda: operator.matvec(vector),
    }[step]
    seconds = 0.0 if step == "idle" else fastest({step: run}, repeats)[step]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "world": world,
        "rank": rank,
        "mode": mode,
        "step": step,
        "n_params": operator.shape[0],
        "seconds": seconds,
        "peak_rss_mib": peak,
    }


def shape_arguments(shape: Shape) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in asdict(shape).items()]


def launch(world: int, mode: str, step: str, shape: Shape, repeats: int) -> list[dict[str, Any]]:
    """One fresh ``torch.distributed.run`` launch of :func:`rank_main`: every rank's record."""
    here = Path(__file__).resolve()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(here.parents[1]), os.environ.get("PYTHONPATH")])
        ),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={world}", str(here), "rank", mode, step,
        f"--repeats={repeats}", *shape_arguments(shape),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])} failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"records"')]
    records = json.loads(lines[-1])["records"] if lines else []
    if len(records) != world:
        raise RuntimeError(f"expected {world} rank lines, got:\n{done.stdout}")
    return records


def rank_rows(shape: Shape, worlds: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Per world size and mode: seconds per gradient pass and per product and the idle, gradient
    and product peaks (largest over the ranks)."""
    rows = []
    for world in worlds:
        for mode in MODES:
            row: dict[str, Any] = {"world": world, "mode": mode}
            for step in STEPS:
                records = launch(world, mode, step, shape, repeats)
                row["n_params"] = records[0]["n_params"]
                row[f"{step}_s"] = max(record["seconds"] for record in records)
                row[f"{step}_peak_mib"] = max(record["peak_rss_mib"] for record in records)
                print(f"W={world} {mode} {step}: {records}", file=sys.stderr, flush=True)
            row["product_per_gradient"] = row["product_s"] / row["gradient_s"]
            row["peak_ratio"] = row["product_peak_mib"] / row["gradient_peak_mib"]
            rows.append(row)
    return rows


def rank_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ranks | model | gradient s | product s | product / gradient | idle MiB | "
        "gradient peak MiB | product peak MiB | product / gradient peak |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        mode = "replicated" if row["mode"] == "none" else "sharded (blocks)"
        lines.append(
            f"| {row['world']} | {mode} | {row['gradient_s']:.2f} | {row['product_s']:.2f} | "
            f"{row['product_per_gradient']:.2f} | {row['idle_peak_mib']:.0f} | "
            f"{row['gradient_peak_mib']:.0f} | {row['product_peak_mib']:.0f} | "
            f"{row['peak_ratio']:.2f} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Architecture:
    """A Llama-style classifier at scale: the decoder's shape and the classes of its head."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    labels: int = 2

    @property
    def n_params(self) -> int:
        """Every parameter: token embedding, per layer q, k, v, o, gate, up, down and two RMSNorm
        weights, the final norm and the score head (no LM head)."""
        d, kv = self.hidden, self.kv_heads * self.hidden // self.heads
        layer = 2 * d * d + 2 * d * kv + 3 * d * self.intermediate + 2 * d
        return self.vocab * d + self.layers * layer + d + d * self.labels

    @property
    def layer_params(self) -> int:
        return (
            self.n_params - self.vocab * self.hidden - self.hidden * (1 + self.labels)
        ) // self.layers

    def forward_flops(self, tokens: int) -> int:
        """Matrix-product FLOPs of a forward per token of a sequence of ``tokens`` (2mnk for an
        m×k by k×n product, as ``FlopCounterMode`` counts; attention's two T×T products in
        full, as the composite kernel a second derivative runs through computes them)."""
        d, kv = self.hidden, self.kv_heads * self.hidden // self.heads
        linear = 2 * (2 * d * d + 2 * d * kv + 3 * d * self.intermediate)
        return self.layers * (linear + 4 * tokens * d) + 2 * d * self.labels

    def activation_bytes(self, tokens: int, value_bytes: int) -> float:
        """Bytes a gradient pass saves per token: (34·d + 5·a·T)·(value_bytes/2) per layer, the
        estimate of Korthikanti et al. (2022) for a transformer block in 16-bit with the T×T
        attention scores materialised, scaled to the value size."""
        per_layer = 34 * self.hidden + 5 * self.heads * tokens
        return self.layers * per_layer * value_bytes / 2


#: Llama-3.2-1B and Llama-2-7B shapes with a two-class score head in place of the LM head
ARCHITECTURES = (
    Architecture("1B", 2048, 16, 8192, 32, 8, 128256),
    Architecture("7B", 4096, 32, 11008, 32, 32, 32000),
)


@dataclass(frozen=True)
class Device:
    """One accelerator and the share of its peak a product's passes are assumed to reach."""

    memory_gb: float = 80.0
    bf16_tflops: float = 989.0  # dense tensor-core peak
    fp32_tflops: float = 67.0  # without tensor cores: curvcal turns TF32 off during products
    link_gb_s: float = 450.0  # NVLink, one direction, per GPU
    bf16_share: float = 0.4
    fp32_share: float = 0.5


def plan_rows(
    device: Device,
    k_bf16: float,
    passes: tuple[float, float],
    sequences: int,
    tokens: int,
    micro_sequences: int,
    worlds: Sequence[int] = (1, 8),
) -> list[dict[str, Any]]:
    """Per architecture, path and world size: seconds per product and gigabytes per GPU.

    * ``bf16 replicated``: the whole model on every GPU, double backward with graphs rebuilt; a
      product is ``k_bf16`` gradient passes (in time), the ranks' data split W ways and the
      float32 product all-reduced (2(W−1)/W · 4P bytes). Memory per GPU: weights 2P, the first
      backward's gradient (kept in the graph) 2P, the second backward's output 2P, v and the
      float32 sum 4P each and v's bfloat16 copy 2P (16P), plus twice a bf16 gradient pass's
      activations for one micro-batch.
    * ``fp32 sharded``: FSDP2 per decoder layer, central differences (five points: ``passes``
      gradient passes, the second on a direction of large curvature). Memory per GPU: 4P/W each
      for the parameter shard, its saved copy and the gradient shard, two gathered layers in
      float32, the activations of one float32 gradient pass, and the P-long vectors: about 5
      whole float32 vectors (20P) today, or their 1/W slices (20P/W). Communication per pass:
      two all-gathers of the parameters and a reduce-scatter, 3(W−1)/W · 4P bytes.
    """
    total_tokens = sequences * tokens
    micro_tokens = micro_sequences * tokens
    rows = []
    for arch in ARCHITECTURES:
        p = arch.n_params
        gradient_flops = 3 * arch.forward_flops(tokens) * total_tokens
        for world in worlds:
            share = 2 * (world - 1) / world
            bf16_s = gradient_flops / (device.bf16_tflops * 1e12 * device.bf16_share)
            replicated = {
                "model": arch.name,
                "n_params": p,
                "path": "bf16 replicated",
                "world": world,
                "gradient_tflop": gradient_flops / 1e12,
                "seconds": (k_bf16 * bf16_s / world + share * 4 * p / (device.link_gb_s * 1e9),),
                "state_gb": 6 * p / 1e9,
                "vectors_whole_gb": 10 * p / 1e9,
                "vectors_sliced_gb": None,
                "activations_gb": 2 * arch.activation_bytes(tokens, 2) * micro_tokens / 1e9,
            }
            fp32_s = gradient_flops / (device.fp32_tflops * 1e12 * device.fp32_share)
            comm = 1.5 * share * 4 * p / (device.link_gb_s * 1e9)
            sharded = {
                "model": arch.name,
                "n_params": p,
                "path": "fp32 sharded",
                "world": world,
                "gradient_tflop": gradient_flops / 1e12,
                "seconds": tuple(n * (fp32_s / world + comm) for n in passes),
                "state_gb": (12 * p / world + 2 * 4 * arch.layer_params) / 1e9,
                "vectors_whole_gb": 20 * p / 1e9,
                "vectors_sliced_gb": 20 * p / world / 1e9,
                "activations_gb": arch.activation_bytes(tokens, 4) * micro_tokens / 1e9,
            }
            for row in (replicated, sharded):
                base = row["state_gb"] + row["activations_gb"]
                row["total_whole_gb"] = base + row["vectors_whole_gb"]
                sliced = row["vectors_sliced_gb"]
                row["total_sliced_gb"] = None if sliced is None else base + sliced
                row["lanczos_basis_whole_gb"] = 8 * 4 * p / 1e9
                rows.append(row)
    return rows


def plan_table(rows: list[dict[str, Any]], memory_gb: float) -> str:
    def fits(total: float | None) -> str:
        if total is None:
            return "—"
        return f"{total:.0f} {'fits' if total <= memory_gb else '**does not fit**'}"

    lines = [
        "| model | P | path | GPUs | s per product | state GB | activations GB | vectors GB, "
        "whole / sliced | per GPU GB, whole vectors | per GPU GB, sliced vectors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        seconds = "–".join(f"{v:.0f}" if v >= 10 else f"{v:.2g}" for v in row["seconds"])
        sliced = row["vectors_sliced_gb"]
        vectors = f"{row['vectors_whole_gb']:.1f}" + ("" if sliced is None else f" / {sliced:.1f}")
        lines.append(
            f"| {row['model']} | {row['n_params'] / 1e9:.2f} B | {row['path']} | {row['world']} | "
            f"{seconds} | {row['state_gb']:.1f} | {row['activations_gb']:.1f} | {vectors} | "
            f"{fits(row['total_whole_gb'])} | {fits(row['total_sliced_gb'])} |"
        )
    return "\n".join(lines)


def parser_for() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("what", choices=("dtypes", "ranks", "rank", "plan"))
    parser.add_argument("mode", nargs="?", choices=MODES, help="rank: the model's sharding")
    parser.add_argument("step", nargs="?", choices=STEPS, help="rank: what to run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tol", type=float, default=1e-4, help="dtypes: Lanczos tolerance")
    parser.add_argument("--worlds", default="1,2,4", help="ranks: world sizes, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--k-bf16", type=float, default=3.0, help="plan: a bf16 product in gradient passes"
    )
    parser.add_argument(
        "--passes", default="4,6", help="plan: gradient passes of a central-difference product"
    )
    parser.add_argument("--plan-sequences", type=int, default=64, help="plan: data per product")
    parser.add_argument("--plan-tokens", type=int, default=512, help="plan: sequence length")
    parser.add_argument(
        "--plan-micro", type=int, default=4, help="plan: sequences per micro-batch and GPU"
    )
    for name, value in asdict(Shape()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    return parser


def main(argv: list[str] | None = None) -> Any:
    args = parser_for().parse_args(argv)
    shape = Shape(**{name: getattr(args, name) for name in asdict(Shape())})
    if args.what == "rank":
        if args.mode is None or args.step is None:
            raise SystemExit("bench_llama.py rank: give MODE (none|blocks) and STEP")
        result = rank_main(args.mode, args.step, shape, args.repeats)
        if result:
            print(json.dumps(result), flush=True)
        return None
    if args.what == "plan":
        low, high = (float(n) for n in args.passes.split(","))
        device = Device()
        rows = plan_rows(
            device, args.k_bf16, (low, high), args.plan_sequences, args.plan_tokens, args.plan_micro
        )
        table = plan_table(rows, device.memory_gb)
    elif args.what == "dtypes":
        rows = dtype_rows(shape, args.repeats, args.tol)
        table = dtype_table(rows)
    else:
        worlds = [int(world) for world in args.worlds.split(",") if world]
        rows = rank_rows(shape, worlds, args.repeats)
        table = rank_table(rows)
    report = {"torch": torch.__version__, "shape": asdict(shape), "rows": rows}
    print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
