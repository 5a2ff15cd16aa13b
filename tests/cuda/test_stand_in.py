"""The CUDA tests' stand-in run: ``make test`` runs it, the device keeps its sizes, and the
stand-in's smaller sizes still take every path the device's do (several batches, two halvings).

Not marked ``cuda``: these run in the plain suite, without a device or a stand-in.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from curvcal import assets
from tests.cuda.sizes import DEVICE_SIZES, STAND_IN, STAND_IN_SIZES, Sizes, sizes_for

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_runs_the_cuda_tests_with_the_cpu_standing_in() -> None:
    lines = (ROOT / "Makefile").read_text().splitlines()
    test_line = next(line for line in lines if line.startswith("test:"))
    assert "test-cuda-standin" in test_line.split()
    target = next(i for i, line in enumerate(lines) if line.startswith("test-cuda-standin:"))
    recipe = lines[target + 1].split()
    assert f"{STAND_IN}=cpu" in recipe and "tests/cuda" in recipe


def test_the_device_keeps_its_sizes() -> None:
    assert sizes_for("cuda") == sizes_for("cuda:0") == DEVICE_SIZES
    assert sizes_for("cpu") == STAND_IN_SIZES
    assert DEVICE_SIZES.subset() == DEVICE_SIZES.subset(policy=True) == ()
    assert STAND_IN_SIZES.subset() == ("--max-samples", "100")
    assert STAND_IN_SIZES.subset(policy=True) == ("--max-samples", "400")


def _takes_every_path(sizes: Sizes, n_digits: int) -> None:
    samples = n_digits if sizes.samples is None else sizes.samples
    # the cache modes and pinned streaming go through more than two batches
    assert samples > 2 * sizes.batch_size
    # out of memory: batches of more than a third are refused, so halving twice is needed
    limit = sizes.oom_batch // 3
    assert sizes.oom_batch // 2 > limit >= sizes.oom_batch // 4 >= 1
    assert samples >= sizes.oom_batch


def test_both_sizes_take_every_path() -> None:
    n_digits = len(load_file(str(assets.demo_data()))["y"])
    assert n_digits == 797
    _takes_every_path(DEVICE_SIZES, n_digits)
    _takes_every_path(STAND_IN_SIZES, n_digits)
