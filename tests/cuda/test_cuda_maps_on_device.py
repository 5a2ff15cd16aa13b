"""``curvcal metrics --device cuda``: temperature scaling and focal TS fitted and applied on the
device give the CPU's numbers, and the run records and says where each map ran.

Both paths are float64 torch code that differs only in the order of its sums (and the device's
larger row chunks), so T, γ and every metric are held to :data:`CALIBRATION_ATOL` (1e-9): the
NLL fit stops at |dN/d ln T| < 1e-10, which fixes T to about that. The float32 searches of the
ECE objectives are float32 on both and every reported number comes from a float64 pass.

Skipped without a CUDA device; ``conftest.py`` runs it with the CPU standing in (CPU against CPU,
at fewer rows and classes), where the note about the maps that stay on the CPU is not said.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.console_text import times_said
from tests.cuda.sizes import DEVICE_SIZES, sizes_for
from tests.cuda.test_cuda_matches_cpu import CALIBRATION_ATOL, CALIBRATION_KEYS, numbers

pytestmark = pytest.mark.cuda

#: (rows, classes) of the logits the device maps are compared on: on CUDA, or standing in
DEVICE_SHAPE = (20_000, 1_000)
STAND_IN_SHAPE = (2_000, 20)
#: every map, ranked: at a size whose matrix and Dirichlet fits stay short on the CPU
ALL_SHAPE = (1_000, 5)


def _logits(folder: Path, shape: tuple[int, int], name: str) -> Path:
    """float32 logits 2.5·z with labels drawn from softmax(z) (over-confident, T near 2.5)."""
    rng = np.random.default_rng(0)
    n, k = shape
    z = rng.standard_normal((n, k)) * (1.0 + 0.5 * np.log(k))
    labels = np.argmax(z + rng.gumbel(size=(n, k)), axis=1)
    path = folder / name
    np.savez(path, logits=(2.5 * z).astype(np.float32), labels=labels)
    return path


def _run(run_cli: Callable[..., Any], *args: str) -> tuple[dict[str, Any], str]:
    import json

    result = run_cli(*args, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize(
    "options",
    [
        pytest.param((), id="ts-nll-focal-ece"),
        pytest.param(("--objective", "ece", "--focal-objective", "nll"), id="ts-ece-focal-nll"),
    ],
)
def test_ts_and_focal_ts_on_the_device_give_the_cpus_numbers(
    run_cli: Callable[..., Any], device: str, tmp_path: Path, options: tuple[str, ...]
) -> None:
    shape = DEVICE_SHAPE if sizes_for(device) == DEVICE_SIZES else STAND_IN_SHAPE
    path = _logits(tmp_path, shape, "z.npz")
    args = ["metrics", str(path), "--val-split", "0.5", "--method", "both", *options]
    got, stderr = _run(run_cli, *args, "--device", device)
    expected, _ = _run(run_cli, *args, "--device", "cpu")
    ran_on = got["settings"]["calibration"]["device"]
    assert ran_on.startswith(device) and expected["settings"]["calibration"]["device"] == "cpu"
    assert got["environment"]["map_devices"] == {
        "ts": ran_on,
        "focal_ts": ran_on,
        "metrics": ran_on,
    }
    assert (
        got["results"]["fits"]["focal_ts"]["gamma"]
        == expected["results"]["fits"]["focal_ts"]["gamma"]
    )
    found, wanted = (
        numbers(got["results"], CALIBRATION_KEYS),
        numbers(expected["results"], CALIBRATION_KEYS),
    )
    assert found.keys() == wanted.keys() and len(found) > 20
    wrong = {
        where: (found[where], value)
        for where, value in wanted.items()
        if found[where] != pytest.approx(value, rel=0, abs=CALIBRATION_ATOL)
    }
    assert not wrong, f"device and CPU differ (device, CPU): {wrong}"
    assert times_said("run on the CPU", stderr) == 0  # every map of both runs on the device


def test_every_map_says_where_it_ran(
    run_cli: Callable[..., Any], device: str, tmp_path: Path
) -> None:
    path = _logits(tmp_path, ALL_SHAPE, "all.npz")
    got, stderr = _run(run_cli, "metrics", str(path), "--val-split", "0.5", "--method", "all",
                       "--device", device)  # fmt: skip
    ran_on = got["settings"]["calibration"]["device"]
    placed = got["environment"]["map_devices"]
    assert set(placed) == {*got["results"]["fits"], "metrics"}
    on_device = {"ts", "focal_ts", "ets", "metrics"}
    assert {stage for stage, where in placed.items() if where == ran_on} >= on_device
    assert placed["histogram"] == placed["isotonic"] == "cpu"
    if torch.device(device).type != "cpu":
        assert times_said("these maps run on the CPU", stderr) == 1
