"""Every command on ``--device cuda`` gives the CPU's numbers (float64, the bundled DigitsCNN).

λmax and trace agree to 1e-5 relative, calibration to 1e-9; the device cache, pinned-memory
streaming, a memory budget read from the device, a forced out-of-memory error recovered by
halving the batches, and ``torchrun --nproc-per-node 1`` (NCCL) all give the same numbers.
Skipped without a CUDA device; ``conftest.py`` runs them with the CPU standing in, at the
smaller sizes of :data:`~tests.cuda.sizes.STAND_IN_SIZES` (fewer digits, smaller batches).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from curvcal import assets
from curvcal.curvature import eigenvalues
from curvcal.curvature.operator import HessianOperator
from curvcal.models import DigitsCNN
from tests.cuda.sizes import Sizes

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = str(assets.demo_checkpoint())
POLICY = str(assets.demo_policy())
DATA = "curvcal:digits"
CURVATURE_RTOL = 1e-5
CALIBRATION_ATOL = 1e-9
# calibration numbers compared between devices (the model's float64 logits differ by rounding)
CALIBRATION_KEYS = {
    "accuracy", "mean_confidence", "ece", "mce", "rms_ce", "rms_ce_debiased", "adaece",
    "classwise_ece", "nll", "brier", "smooth_ece", "temperature", "gamma",
}  # fmt: skip


def numbers(tree: Any, keys: set[str], path: str = "") -> dict[str, float]:
    """Every number in ``tree`` (nested dicts and lists) under one of ``keys``, by its path."""
    found: dict[str, float] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            where = f"{path}.{key}"
            if key in keys and isinstance(value, int | float) and not isinstance(value, bool):
                found[where] = float(value)
            else:
                found.update(numbers(value, keys, where))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found.update(numbers(value, keys, f"{path}[{index}]"))
    return found


def assert_same_numbers(
    got: dict[str, float], expected: dict[str, float], rel: float = 0.0, abs: float = 0.0
) -> None:
    assert expected, "nothing to compare"
    assert got.keys() == expected.keys()
    wrong = {
        path: (got[path], value)
        for path, value in expected.items()
        if got[path] != pytest.approx(value, rel=rel, abs=abs)
    }
    assert not wrong, f"device and CPU differ (device, CPU): {wrong}"


def run_json(run_cli: Callable[..., Any], *args: str, code: int = 0) -> dict[str, Any]:
    result = run_cli(*args, "--json")
    assert result.code == code, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def cpu_hessian(sizes: Sizes) -> dict[str, Any]:
    from click.testing import CliRunner

    from curvcal.cli import main

    runner = CliRunner()
    with runner.isolation() as streams:
        code = main([*_hessian_args("cpu", sizes), "--json"])
    assert code == 0, streams[1].getvalue().decode()
    return json.loads(streams[0].getvalue().decode())


def _hessian_args(device: str, sizes: Sizes, *extra: str) -> list[str]:
    return ["hessian", CHECKPOINT, "--data", DATA, *sizes.subset(), "--device", device,
            "--dtype", "float64", "--batch-size", str(sizes.batch_size), "--tol", "1e-8",
            *extra]  # fmt: skip


def _curvature(result: dict[str, Any]) -> dict[str, float]:
    results = result["results"]
    return {"lambda_max": results["lambda_max"], "trace": results["trace"]["estimate"]}


@pytest.mark.parametrize(
    ("extra", "cache_mode"),
    [
        pytest.param((), "device", id="device-cache"),
        pytest.param(("--cache", "none"), "none", id="pinned-streaming"),
        pytest.param(("--cache", "host"), "host", id="pinned-host-cache"),
        pytest.param(
            ("--memory-budget", "50%", "--keep-graphs", "never"), "device", id="budget-from-device"
        ),
    ],
)
def test_hessian_matches_cpu(
    run_cli: Callable[..., Any],
    device: str,
    sizes: Sizes,
    cpu_hessian: dict[str, Any],
    extra: tuple[str, ...],
    cache_mode: str,
) -> None:
    result = run_json(run_cli, *_hessian_args(device, sizes, *extra))
    assert result["environment"]["device"].startswith(device)
    assert result["results"]["operator"]["cache_mode"] == cache_mode
    assert result["results"]["converged"]
    assert_same_numbers(_curvature(result), _curvature(cpu_hessian), rel=CURVATURE_RTOL)


def test_hutchinson_probes_match_cpu(
    run_cli: Callable[..., Any], device: str, sizes: Sizes
) -> None:
    """Probes are drawn on the CPU and moved, so a Hutchinson estimate is the CPU's."""
    extra = ("--trace-method", "hutchinson", "--probes", "12", "--top-k", "2")
    got = run_json(run_cli, *_hessian_args(device, sizes, *extra))["results"]
    expected = run_json(run_cli, *_hessian_args("cpu", sizes, *extra))["results"]
    keys = {"estimate", "standard_error"}
    assert_same_numbers(
        {**numbers(got["trace"], keys), "top2": got["eigenvalues"][1]},
        {**numbers(expected["trace"], keys), "top2": expected["eigenvalues"][1]},
        rel=CURVATURE_RTOL,
    )


def test_float32_products_leave_tf32_off(device: str) -> None:
    """float32 products on the device against float64 ones: TF32 (10-bit mantissa) would miss
    1e-4 on a wide linear layer; the caller's TF32 flags are restored afterwards."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))
    x = torch.randn(256, 512, generator=generator)
    y = torch.randint(0, 10, (256,), generator=generator)
    vector = torch.randn(sum(p.numel() for p in model.parameters()), 1, generator=generator)

    def product(dtype: torch.dtype, on: str) -> torch.Tensor:
        same = copy.deepcopy(model).to(device=on, dtype=dtype)  # the same weights
        op = HessianOperator(same, [(x.to(dtype), y)], device=on, allow_tf32=False)
        return (op @ vector.to(dtype).to(on)).double().cpu()

    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        single = product(torch.float32, device)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    reference = product(torch.float64, "cpu")
    error = float((single - reference).norm() / reference.norm())
    assert error < 1e-4, f"float32 product off by {error:.2e} (TF32 on?)"


class _RefuseLargeBatches(nn.Module):
    """The digits model, but a batch of more than ``limit`` rows runs out of device memory: on
    CUDA by really asking the allocator for a petabyte, elsewhere by raising the same error."""

    def __init__(self, model: nn.Module, limit: int) -> None:
        super().__init__()
        self.model = model
        self.limit = limit
        self.refused = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            self.refused += 1
            if x.is_cuda:
                torch.empty(2**50, dtype=torch.uint8, device=x.device)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 PiB")
        return self.model(x)


def _digits_batches(size: int, samples: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``samples`` digits (all when ``None``) in batches of ``size``."""
    tensors = load_file(str(assets.demo_data()))
    x, y = tensors["x"][:samples].double(), tensors["y"][:samples]
    return list(zip(x.split(size), y.split(size), strict=True))


@pytest.mark.parametrize("keep_graphs", ["auto", "never"])
def test_out_of_memory_halves_the_batches_with_the_same_numbers(
    device: str, sizes: Sizes, keep_graphs: str
) -> None:
    model = _digits_model().to(device)  # the operator runs where the parameters are
    batches = _digits_batches(sizes.oom_batch, sizes.samples)
    plain = HessianOperator(model, batches, device=device, keep_graphs=keep_graphs)
    expected = [e.value for e in eigenvalues(plain, 2, tol=1e-10).values]
    limit = sizes.oom_batch // 3
    refusing = _RefuseLargeBatches(model, limit=limit)
    halved = HessianOperator(refusing, batches, device=device, keep_graphs=keep_graphs)
    got = [e.value for e in eigenvalues(halved, 2, tol=1e-10).values]
    assert refusing.refused >= 1
    assert halved.oom_retries >= 2  # 300 -> 150 -> 75 rows per chunk (48 -> 24 -> 12)
    assert halved._batches.batch_size <= limit
    assert got == pytest.approx(expected, rel=1e-9)


def _digits_model() -> nn.Module:
    model = DigitsCNN()
    model.load_state_dict(load_file(CHECKPOINT))
    return model.double()


def test_torchrun_one_process_matches_plain_run(
    tmp_path: Path,
    device: str,
    sizes: Sizes,
    cpu_hessian: dict[str, Any],
    run_cli: Callable[..., Any],
) -> None:
    """``torchrun --nproc-per-node 1``: NCCL on CUDA (gloo on a stand-in CPU)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
    ]
    completed = subprocess.run(
        [*launcher, "-m", "curvcal", *_hessian_args(device, sizes), "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    distributed = json.loads(completed.stdout)
    assert distributed["results"]["operator"]["world_size"] == 1
    plain = run_json(run_cli, *_hessian_args(device, sizes))
    assert_same_numbers(_curvature(distributed), _curvature(plain), rel=1e-9)
    assert_same_numbers(_curvature(distributed), _curvature(cpu_hessian), rel=CURVATURE_RTOL)


def _calibrate_args(device: str, sizes: Sizes, logits: Path) -> list[str]:
    return ["calibrate", CHECKPOINT, "--data", DATA, *sizes.subset(), "--device", device,
            "--dtype", "float64", "--val-split", "0.5", "--method", "both", "--save-logits",
            str(logits)]  # fmt: skip


def test_calibrate_and_metrics_match_cpu(
    run_cli: Callable[..., Any], device: str, sizes: Sizes, tmp_path: Path
) -> None:
    on_device, on_cpu = tmp_path / "device.safetensors", tmp_path / "cpu.safetensors"
    got = run_json(run_cli, *_calibrate_args(device, sizes, on_device))["results"]
    expected = run_json(run_cli, *_calibrate_args("cpu", sizes, on_cpu))["results"]
    assert_same_numbers(
        numbers(got, CALIBRATION_KEYS), numbers(expected, CALIBRATION_KEYS), abs=CALIBRATION_ATOL
    )
    device_logits, cpu_logits = load_file(str(on_device)), load_file(str(on_cpu))
    assert torch.equal(device_logits["labels"], cpu_logits["labels"])
    assert torch.allclose(device_logits["logits"], cpu_logits["logits"], rtol=0, atol=1e-9)
    # metrics (and its own fits) on the logits each device wrote
    metrics = ["--val-split", "0.5", "--method", "both"]
    got = run_json(run_cli, "metrics", str(on_device), *metrics)["results"]
    expected = run_json(run_cli, "metrics", str(on_cpu), *metrics)["results"]
    assert_same_numbers(
        numbers(got, CALIBRATION_KEYS), numbers(expected, CALIBRATION_KEYS), abs=CALIBRATION_ATOL
    )


def _check_values(result: dict[str, Any]) -> Iterator[tuple[str, float]]:
    for metric, entry in result["results"]["values"].items():
        yield metric, entry["value"]


def test_check_matches_cpu(run_cli: Callable[..., Any], device: str, sizes: Sizes) -> None:
    args = ["check", CHECKPOINT, "--policy", POLICY, *sizes.subset(policy=True), "--dtype",
            "float64"]  # fmt: skip
    got = run_json(run_cli, *args, "--device", device)
    expected = run_json(run_cli, *args, "--device", "cpu")
    assert got["status"] == expected["status"] == "pass"
    got_values, expected_values = dict(_check_values(got)), dict(_check_values(expected))
    curvature = {"lambda_max", "trace"}
    assert_same_numbers(
        {k: v for k, v in got_values.items() if k in curvature},
        {k: v for k, v in expected_values.items() if k in curvature},
        rel=CURVATURE_RTOL,
    )
    assert_same_numbers(
        {k: v for k, v in got_values.items() if k not in curvature},
        {k: v for k, v in expected_values.items() if k not in curvature},
        abs=CALIBRATION_ATOL,
    )


def test_study_matches_cpu(run_cli: Callable[..., Any], device: str, sizes: Sizes) -> None:
    args = ["study", CHECKPOINT, "--data", DATA, *sizes.subset(), "--dtype", "float64",
            "--val-split", "0.5"]  # fmt: skip
    got = run_json(run_cli, *args, "--device", device)["results"]
    expected = run_json(run_cli, *args, "--device", "cpu")["results"]
    curvature = {"lambda_max", "estimate"}
    assert_same_numbers(numbers(got, curvature), numbers(expected, curvature), rel=CURVATURE_RTOL)
    assert_same_numbers(
        numbers(got, CALIBRATION_KEYS), numbers(expected, CALIBRATION_KEYS), abs=CALIBRATION_ATOL
    )
