"""Smoke test of benchmarks/bench_llama.py on a tiny Llama classifier: the dtype rows against a
dense float64 Hessian built here, and one launch of each sharding under torchrun."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.func import functional_call, hessian
from torch.nn.attention import SDPBackend, sdpa_kernel

TINY = [
    "--hidden=16", "--layers=2", "--intermediate=32", "--heads=2", "--kv-heads=1",
    "--vocab=20", "--tokens=6", "--samples=5", "--batch=3",
]  # fmt: skip


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_llama")


def dense_lambda_max(bench: ModuleType, shape: object) -> float:
    """The largest eigenvalue of the float64 Hessian of the mean cross-entropy over every
    parameter, by torch.func.hessian on the flattened parameters (no curvcal code; attention by
    its composite kernel, which forward-mode differentiation runs through)."""
    model = bench.build_model(shape, torch.float64)
    ids, labels = bench.token_data(shape)
    names = [name for name, _ in model.named_parameters()]
    params = [p.detach() for _, p in model.named_parameters()]
    sizes = [p.numel() for p in params]
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def loss(flat: torch.Tensor) -> torch.Tensor:
        pieces = [
            piece.reshape(p.shape) for piece, p in zip(flat.split(sizes), params, strict=True)
        ]
        logits = functional_call(model, dict(zip(names, pieces, strict=True)), (x,))
        return torch.nn.functional.cross_entropy(logits, labels)

    with sdpa_kernel(SDPBackend.MATH):
        matrix = hessian(loss)(torch.cat([p.reshape(-1) for p in params]))
    return float(torch.linalg.eigvalsh(matrix).max())


@pytest.mark.slow  # three models, three Lanczos runs and a dense Hessian: about 25 s of CPU
def test_dtype_rows_against_a_dense_hessian(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dtypes.json"
    report = bench.main(["dtypes", "--repeats=1", "--tol=1e-6", f"--json={out}", *TINY])
    rows = {row["dtype"]: row for row in report["rows"]}
    assert list(rows) == ["float64", "float32", "bfloat16"]
    truth = dense_lambda_max(bench, bench.Shape(**report["shape"]))
    assert rows["float64"]["lambda_max"] == pytest.approx(truth, rel=1e-6)
    assert rows["float32"]["lambda_relative_error"] < 1e-4
    assert rows["bfloat16"]["precision_floor"] == pytest.approx(8 * 2**-8)
    assert rows["float32"]["precision_floor"] == rows["float64"]["precision_floor"] == 0.0
    assert rows["bfloat16"]["lambda_relative_error"] < rows["bfloat16"]["precision_floor"]
    for row in rows.values():
        assert row["n_params"] == rows["float64"]["n_params"]
        assert row["gradient_s"] > 0.0 and row["product_s"] > 0.0
    assert json.loads(out.read_text())["rows"][0]["dtype"] == "float64"
    assert "| bfloat16 |" in capsys.readouterr().out


@pytest.mark.slow  # six torchrun launches
def test_rank_rows_replicated_and_sharded(bench: ModuleType) -> None:
    report = bench.main(["ranks", "--worlds=1", "--repeats=1", *TINY])
    rows = report["rows"]
    assert [row["mode"] for row in rows] == ["none", "blocks"]
    n_params = sum(
        p.numel() for p in bench.build_model(bench.Shape(**report["shape"])).parameters()
    )
    assert rows[0]["n_params"] == rows[1]["n_params"] == n_params
    for row in rows:
        assert row["gradient_s"] > 0.0 and row["product_s"] > 0.0 and row["idle_s"] == 0.0
        assert row["product_peak_mib"] >= row["idle_peak_mib"]
        assert row["gradient_peak_mib"] >= row["idle_peak_mib"]
    assert "| 1 | sharded (blocks) |" in bench.rank_table(rows)


def test_plan_counts_parameters_and_flops_as_the_libraries_do(
    bench: ModuleType, load_bench: Callable[[str], ModuleType]
) -> None:
    """P against the published sizes (Llama-2-7B: 6,738,415,616 with its untied LM head of
    32000 × 4096; Llama-3.2-1B: 1,235,814,400 with the head tied to the embedding), the LM head
    swapped for a two-class score head; the forward's FLOPs per token against FlopCounterMode
    on a tiny Llama of the same formula (bench_flops' count), and a gradient at 3 forwards."""
    one, seven = bench.ARCHITECTURES
    assert seven.n_params == 6_738_415_616 - 32000 * 4096 + 2 * 4096
    assert one.n_params == 1_235_814_400 + 2 * 2048
    shape = bench.Shape(hidden=32, layers=2, intermediate=48, heads=4, kv_heads=2, vocab=50,
                        tokens=10, samples=3, batch=3)  # fmt: skip
    tiny = bench.Architecture("tiny", 32, 2, 48, 4, 2, 50, labels=4)
    model = bench.build_model(shape)
    assert tiny.n_params == sum(p.numel() for p in model.parameters())
    ids, labels = bench.token_data(shape)
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    count = load_bench("bench_flops").count

    def loss() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(x), labels, reduction="sum")

    forward = count(loss)
    gradient = count(lambda: torch.autograd.grad(loss(), list(model.parameters())))
    assert forward == tiny.forward_flops(10) * 3 * 10
    assert gradient == 3 * forward


def test_plan_memory_and_time_worked_by_hand(bench: ModuleType) -> None:
    """The 7B row sharded over 8 GPUs: 20·P bytes of whole vectors against 20·P/8 sliced, the
    state 12·P/8 plus two gathered float32 layers; time = passes × (gradient FLOPs / W at half
    of 67 TFLOP/s + 1.5 · 2·7/8 · 4P bytes at 450 GB/s)."""
    rows = bench.plan_rows(bench.Device(), 3.0, (4.0, 6.0), 64, 512, 4)
    row = next(
        r for r in rows if r["model"] == "7B" and r["path"] == "fp32 sharded" and r["world"] == 8
    )
    p = 6_607_351_808
    layer = 2 * 4096**2 + 2 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert row["vectors_whole_gb"] == pytest.approx(20 * p / 1e9)
    assert row["vectors_sliced_gb"] == pytest.approx(20 * p / 8 / 1e9)
    assert row["state_gb"] == pytest.approx((12 * p / 8 + 8 * layer) / 1e9)
    per_token = 32 * (2 * (4 * 4096**2 + 3 * 4096 * 11008) + 4 * 512 * 4096) + 2 * 4096 * 2
    gradient = 3 * per_token * 64 * 512
    per_pass = gradient / (67e12 * 0.5) / 8 + 1.5 * 2 * 7 / 8 * 4 * p / 450e9
    assert row["seconds"] == pytest.approx((4 * per_pass, 6 * per_pass))
    # activations: (34·d + 5·a·T) bytes per layer and token in 16-bit, doubled in float32
    assert row["activations_gb"] == pytest.approx(32 * (34 * 4096 + 5 * 32 * 512) * 2 * 2048 / 1e9)
    assert row["total_whole_gb"] > 80 > row["total_sliced_gb"]


def test_plan_command_of_the_scale_guide(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command the scale guide shows prints the rows it quotes."""
    bench.main(["plan", "--k-bf16", "3.76", "--passes", "4,6"])
    out = capsys.readouterr().out
    assert "| 1B | 1.24 B | bf16 replicated | 1 | 1.9 | 7.4 | 9.9 | 12.4 | 30 fits | — |" in out
    assert "| 7B | 6.61 B | bf16 replicated | 8 | 1.6 |" in out
    assert "| 135 **does not fit** | — |" in out
    assert (
        "| 7B | 6.61 B | fp32 sharded | 8 | 20–30 | 11.5 | 29.0 | 132.1 / 16.5 "
        "| 173 **does not fit** | 57 fits |"
    ) in out
