"""The GPU run's ``llama_1b`` part: the 1B row of the scale guide's plan, measured on one device.

The model is the plan's 1B classifier (``bench_llama.ARCHITECTURES[0]``: the Llama-3.2-1B shape,
P = 1.24 B, a two-class score head; random weights, eager attention as curvcal's loader builds
it) on the plan's data: 64 random sequences of 512 tokens in micro-batches of 4. Two paths, as
the plan's rows:

* ``bf16 replicated``: the model in bfloat16, products by double backward with the graphs
  rebuilt (``keep_graphs="never"``): seconds per gradient pass and per product, and the peak of
  ``torch.cuda.max_memory_allocated`` in each;
* ``fp32 sharded``: the model in float32, sharded per decoder layer with FSDP2 over a process
  group of one rank (NCCL on CUDA), products by central differences on sliced vectors.

Every record carries the plan's figures for the same row (seconds per product and gigabytes per
GPU, sliced vectors; ``bench_llama.plan_rows`` with the guide's assumptions) beside the measured
ones. Last, if the budget allows, λmax of the bfloat16 model by a few Lanczos steps. TF32 is off
throughout, as in curvcal's products. ``--smoke`` runs a tiny shape on the CPU (gloo).

``CURVCAL_LLAMA_STEPS`` (comma-separated, default ``bf16,bf16-auto,fp32,lambda``) picks the
steps; ``bf16`` runs the default memory plan (half the free memory, so a micro-batch that fits is
not cut into chunks) with the graphs rebuilt, ``bf16-auto`` the same with kept graphs where the
plan keeps them (the leading micro-batches that fit), ``bf16-half`` gives ``memory_budget="50%"``
explicitly (the default's share: the same plan; once the remedy for a default of twice a
gradient pass, which cut each micro-batch into chunks). Every record carries the plan in words
(``memory_plan``: budget and its source, rows per chunk, kept graphs and why). ``profile``
adds torch's profiler over one micro-batch's gradient pass and one micro-batch's bfloat16 product:
the operators with the most device (else CPU) time, each with its share, in the record and the log.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meter import Meter  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
#: the plan's data per product and micro-batch (docs/guide/scale.md)
SEQUENCES, TOKENS, MICRO = 64, 512, 4
SMOKE_DATA = (4, 8, 2)
#: the plan's assumptions (bench_llama's defaults, the scale guide's table)
K_BF16, FP32_PASSES = 3.76, (4.0, 6.0)
STEPS = "bf16,bf16-auto,fp32,lambda"
PROFILE_ROWS = 25


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def llama_part(args: Any, emit: Callable[[dict[str, Any]], None]) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_llama import ARCHITECTURES, Architecture, Device, plan_rows

    from curvcal.curvature import HessianOperator, build_operator, eigenvalues
    from curvcal.distributed import all_reduce_sum, leave
    from curvcal.losses import loss_from_name
    from curvcal.settings.hessian import HessianSettings
    from curvcal.sharding import shard_model

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    arch = ARCHITECTURES[0]
    sequences, tokens, micro = SEQUENCES, TOKENS, MICRO
    if args.smoke:
        arch = Architecture("tiny", 32, 2, 64, 4, 2, 300)
        sequences, tokens, micro = SMOKE_DATA
    plan = {
        row["path"]: row
        for row in plan_rows(Device(), K_BF16, FP32_PASSES, sequences, tokens, micro, (1,))
        if row["model"] == arch.name
    }
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, arch.vocab, (sequences, tokens), generator=generator)
    labels = torch.randint(0, arch.labels, (sequences,), generator=generator)
    batches = [
        (
            {
                "input_ids": ids[i : i + micro].to(device),
                "attention_mask": torch.ones_like(ids[i : i + micro]).to(device),
            },
            labels[i : i + micro].to(device),
        )
        for i in range(0, sequences, micro)
    ]
    loss = loss_from_name("ce", 0.0)
    steps = set(os.environ.get("CURVCAL_LLAMA_STEPS", STEPS).split(","))

    def gradient_pass(model: torch.nn.Module) -> None:
        for x, y in batches:
            loss.sum(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    def measure(step: Callable[[], Any], rounds: int = 2) -> Meter:
        meters = []
        for _ in range(rounds):  # the first warms the kernels up
            with Meter(device) as meter:
                step()
            meters.append(meter)
        return meters[-1]

    def record(path: str, operator: Any, gradient: Meter) -> None:
        vector = torch.randn(
            operator.shape[0] if path.startswith("bf16") else operator.vector_space.size,
            generator=torch.Generator(device).manual_seed(2),
            device=device,
            dtype=operator.dtype,
        )
        passes = operator.n_data_passes
        product = measure(lambda: operator.matvec(vector))
        passes = (operator.n_data_passes - passes) / 2
        expected = plan.get(path, {}) if path in plan else plan.get(path.split(",")[0], {})
        memory_plan = getattr(operator, "memory_plan", None)
        choice = getattr(operator, "memory_choice", None)
        emit({
            "kind": "llama", "path": path, "model": arch.name, "n_params": arch.n_params,
            "sequences": sequences, "tokens": tokens, "micro_batch": micro,
            "gradient_s": gradient.seconds, "gradient_peak_bytes": gradient.peak,
            "product_s": product.seconds, "product_peak_bytes": product.peak,
            "product_per_gradient": product.seconds / gradient.seconds,
            "data_passes_per_product": passes,
            "plan_rows": None if memory_plan is None else memory_plan.rows,
            "plan_budget_bytes": None if memory_plan is None else memory_plan.budget,
            "plan_estimate_bytes": None if memory_plan is None else memory_plan.estimate,
            "plan_seconds": expected.get("seconds"), "plan_gb": expected.get("total_sliced_gb")
            or expected.get("total_whole_gb"),
            "memory_plan": None if choice is None else choice.as_dict(),
        })  # fmt: skip
        _say(f"{path}: gradient {gradient.seconds:.2f} s, product {product.seconds:.2f} s, "
             f"peak {(product.peak or 0) / 1e9:.1f} GB (plan {expected.get('seconds')} s, "
             f"{expected.get('total_sliced_gb') or expected.get('total_whole_gb')} GB)")  # fmt: skip

    # bfloat16, replicated (one device: nothing to reduce)
    _say(f"{arch.name}: building the bfloat16 model (P = {arch.n_params:,})")
    bf16_model = build(arch, tokens, torch.bfloat16, device)
    if "bf16" in steps:
        operator = HessianOperator(bf16_model, batches, keep_graphs="never", device=device)
        record("bf16 replicated", operator, measure(lambda: gradient_pass(bf16_model)))
        del operator
    if "bf16-half" in steps:
        # the budget given as the default now takes it (half the free memory): the same plan
        operator = HessianOperator(
            bf16_model, batches, keep_graphs="never", device=device, memory_budget="50%"
        )
        record("bf16 replicated, budget 50%", operator, measure(lambda: gradient_pass(bf16_model)))
        del operator
    if "profile" in steps:
        profile(bf16_model, batches[:1], gradient_pass, device, emit)

    # float32, sharded per decoder layer over one rank, sliced vectors
    if "fp32" in steps:
        bf16_model.cpu()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _free_port_environment()
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        try:
            _say(f"{arch.name}: building the float32 model, sharded per decoder layer")
            sharded = build(arch, tokens, torch.float32, device)
            shard_model(sharded, "blocks", device)
            settings = HessianSettings(keep_graphs="never")
            central = build_operator(sharded, loss, batches, settings, all_reduce=all_reduce_sum)
            gradient = measure(lambda: gradient_pass(sharded))
            record("fp32 sharded", central, gradient)
            del central, sharded
        finally:
            leave()  # the sharded model's work objects freed while the group lives
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # the default plan in full, after the rows the guide's table checks (a part whose budget
    # runs out here keeps them): graphs kept for the leading micro-batches that fit
    if "bf16-auto" in steps:
        bf16_model.to(device)
        operator = HessianOperator(bf16_model, batches, device=device)
        record("bf16 replicated, kept graphs auto", operator,
               measure(lambda: gradient_pass(bf16_model)))  # fmt: skip
        del operator

    # λmax of the bfloat16 model by a few Lanczos steps
    if "lambda" in steps:
        model = bf16_model.to(device)
        operator = HessianOperator(model, batches, device=device, keep_graphs="never")
        began = time.perf_counter()
        spectrum = eigenvalues(operator, 1, tol=1e-2, max_iter=5, seed=0)
        value = spectrum.values[0]
        emit({
            "kind": "llama-lambda", "model": arch.name, "dtype": "bfloat16",
            "lambda_max": value.value, "converged": value.converged, "products": value.matvecs,
            "seconds": time.perf_counter() - began, "precision_floor": spectrum.precision_floor,
        })  # fmt: skip


def profile(
    model: Any,
    batches: list[Any],
    gradient_pass: Callable[[Any], None],
    device: Any,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """torch's profiler over one gradient pass and one product (graphs rebuilt) on ``batches``:
    the :data:`PROFILE_ROWS` operators with the most self time on the device (the CPU without
    one), each with its calls and milliseconds, and the total."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    from curvcal.curvature import HessianOperator

    operator = HessianOperator(model, batches, keep_graphs="never", device=device)
    vector = torch.randn(operator.shape[0], device=device, dtype=operator.dtype)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for name, step in (("gradient", lambda: gradient_pass(model)),
                       ("product", lambda: operator.matvec(vector))):  # fmt: skip
        step()  # warm-up
        with profiler(activities=activities) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
        averages = prof.key_averages()
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        total = sum(getattr(event, key) for event in averages) / 1e3
        rows = sorted(averages, key=lambda event: getattr(event, key), reverse=True)
        top = [{"op": event.key, "calls": event.count, "ms": getattr(event, key) / 1e3}
               for event in rows[:PROFILE_ROWS]]  # fmt: skip
        emit({"kind": "llama-profile", "step": name, "total_ms": total, "top": top})
        _say(f"profile of one micro-batch's {name}: {total:.1f} ms of {key}")
        for row in top:
            _say(f"  {row['ms']:9.2f} ms {row['calls']:6d} x {row['op']}")


def build(arch: Any, tokens: int, dtype: Any, device: Any) -> Any:
    """The plan's classifier in ``dtype`` on ``device``: the same weights for every dtype (drawn
    in float32 from seed 0, on the device, then cast), eval mode, returning the logits."""
    import torch
    import transformers

    from curvcal.load.models.hf import LogitsModule

    config = transformers.LlamaConfig(
        vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads, max_position_embeddings=max(tokens, 16),
        num_labels=arch.labels, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForSequenceClassification._from_config(
            config, attn_implementation="eager"
        )
    with torch.no_grad():
        model.score.weight.normal_(0.0, 3.0 / arch.hidden**0.5)
    return LogitsModule(model.to(device=device, dtype=dtype).eval(), "text").eval()


def _free_port_environment() -> None:
    """A one-rank process group's rendezvous: this host, a free port, rank 0 of 1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")  # fmt: skip
