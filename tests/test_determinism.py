"""Same seed, same numbers: two runs of `hessian` and `calibrate` give identical JSON apart from
timings (and the command line), on the CPU in float64 and in float32."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("determinism")
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=3, width=1)
    meta = {
        "curvcal.arch": "curvcal:DigitsCNN",
        "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
    }
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(root / "m.safetensors"),
        meta,
    )
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(60, 1, 8, 8, generator=generator)
    torch.save({"x": x, "y": torch.randint(0, 3, (60,), generator=generator)}, root / "d.pt")
    return root / "m.safetensors", root / "d.pt"


def _comparable(stdout: str) -> dict[str, Any]:
    document = json.loads(stdout)
    document.pop("timings")
    document["environment"].pop("command_line", None)
    document["results"].pop("timings", None)
    plan = document["results"].get("operator", {}).get("memory_plan")
    if plan is not None:  # the device's free memory at the moment, and the default budget (half
        # of it), are the machine's state like timings; the plan's choices must still agree
        plan.pop("free_bytes")
        plan.pop("budget_bytes")
        plan["budget_source"] = re.sub(r"[\d.,]+ ([KMGT]i?B)\b", r"N \1", plan["budget_source"])
    return _budget_masked(document)


def _budget_masked(value: Any) -> Any:
    """``value`` with every "budget of <size>" (a reason quoting the default budget) masked."""
    if isinstance(value, dict):
        return {k: _budget_masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_budget_masked(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"budget of [\d.,]+ ([KMGT]i?B)\b", r"budget of N \1", value)
    return value


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("command", ["hessian", "calibrate"])
def test_same_seed_same_json(command: str, dtype: str, files: tuple[Path, Path], run_cli) -> None:
    checkpoint, data = files
    common = [command, checkpoint, "--data", data, "--device", "cpu", "--dtype", dtype,
              "--batch-size", "16", "--json"]  # fmt: skip
    if command == "hessian":
        extra = ["--top-k", "2", "--probes", "6", "--smallest", "--seed", "3", "--max-iter", "30"]
    else:
        extra = ["--val-split", "0.5", "--seed", "3", "--bootstrap", "10", "--gammas", "0,1,2"]
    first, second = run_cli(*common, *extra), run_cli(*common, *extra)
    assert first.code == 0 and second.code == 0, first.stderr + second.stderr
    one, two = _comparable(first.stdout), _comparable(second.stdout)
    assert one == two
    assert one["settings"]["hessian" if command == "hessian" else "calibration"]["seed"] == 3
    other = run_cli(*common, *[a if a != "3" else "4" for a in extra])  # the seed matters
    assert other.code == 0, other.stderr
    assert _comparable(other.stdout)["results"] != one["results"]
