"""Golden JSON results of ``curvcal hessian`` and ``curvcal study``, and how to rewrite them.

The files beside this script hold what the commands printed with ``--json`` for fixed seeds,
with everything that varies between runs or machines masked (timings, environment, file paths,
sizes and digests). ``tests/test_golden_json.py`` runs the same commands and compares. After a
deliberate change of the numbers, rewrite them with::

    python tests/golden/regenerate.py

and review the diff. Every command pins what a default could change under it (the trace
estimator, the batch size, the seeds, the dtype).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent
MASK = "<masked>"
#: Keys whose values vary between runs, machines or temporary folders.
MASKED_KEYS = frozenset({"timings", "environment", "path", "size_bytes", "sha256"})
#: Keys of ``results`` that follow the memory plan (free memory, the budget, the cache), not the
#: arithmetic: masked like timings. The same names under ``settings`` are the user's options and
#: stay.
PLAN_KEYS = frozenset(
    {
        "probe_batch",
        "micro_batch",
        "cache_mode",
        "graphs_kept",
        "kept_rows",
        "graphs_dropped",
        "memory_plan",
        "lanczos_basis",
        "n_data_passes",
        "sketch_bytes",
    }
)

_HESSIAN = (
    "--data",
    "curvcal:digits",
    "--max-samples",
    "90",
    "--batch-size",
    "40",
    "--seed",
    "3",
    "--top-k",
    "3",
    "--trace-method",
    "hutchinson",
    "--probes",
    "6",
    "--tol",
    "1e-6",
)
_STUDY = (
    "--loss",
    "own",
    "--probes",
    "4",
    "--tol",
    "1e-6",
    "--gammas",
    "0,1,2",
    "--batch-size",
    "16",
    "--seed",
    "1",
)

Args = Callable[[Path], list[str]]


def _hessian(dtype: str, *extra: str) -> Args:
    def args(workspace: Path) -> list[str]:
        from curvcal.assets import demo_checkpoint

        base = _without(_HESSIAN, extra)
        return ["hessian", str(demo_checkpoint()), *base, "--dtype", dtype, *extra]

    return args


def _without(base: tuple[str, ...], extra: tuple[str, ...]) -> list[str]:
    """``base`` (option, value pairs) less the options ``extra`` gives again: an option given
    twice with two values is refused."""
    pairs = zip(base[::2], base[1::2], strict=True)
    return [word for option, value in pairs if option not in extra for word in (option, value)]


def _study(dtype: str) -> Args:
    def args(workspace: Path) -> list[str]:
        return [
            "study",
            str(workspace / "a_ce.safetensors"),
            str(workspace / "b_flsd.safetensors"),
            str(workspace / "c_focal.safetensors"),
            "--data",
            str(workspace / "data.safetensors"),
            "--curvature-data",
            str(workspace / "train.safetensors"),
            *_STUDY,
            "--dtype",
            dtype,
        ]

    return args


#: name -> (command line given the workspace folder, relative float tolerance).
CASES: dict[str, tuple[Args, float]] = {
    "hessian_float64": (
        _hessian(
            "float64", "--per-layer", "--density", "--density-runs", "2", "--density-steps", "6"
        ),
        1e-9,
    ),
    "hessian_float32": (
        _hessian(
            "float32", "--per-layer", "--density", "--density-runs", "2", "--density-steps", "6"
        ),
        1e-5,
    ),
    "hessian_hutchpp_float64": (
        _hessian("float64", "--trace-method", "hutchpp", "--probes", "8", "--smallest"),
        1e-9,
    ),
    "study_float64": (_study("float64"), 1e-9),
    "study_float32": (_study("float32"), 1e-5),
}


def build_workspace(folder: Path) -> None:
    """Tiny ``DigitsCNN`` checkpoints trained with ce, FLSD-53 and focal γ=2 (by their
    metadata; the weights a seeded initialisation, the FLSD-53 one with its classifier scaled so
    that p_y falls on both sides of 0.2) and two seeded tensor datasets.

    Every number is drawn by NumPy's PCG64 generator in float64 and rounded once to float32:
    torch's ``randn``/``uniform_`` take a different vector path per CPU capability (AVX-512,
    AVX2, scalar) and differ in the last bits, which the float64 goldens would see."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from curvcal.models import DigitsCNN

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((40, 1, 8, 8)).astype(np.float32))
    y = torch.arange(40) % 10
    save_file({"x": x, "y": y}, str(folder / "data.safetensors"))
    save_file(
        {"x": x[:21].contiguous(), "y": y[:21].contiguous()}, str(folder / "train.safetensors")
    )
    for name, seed, scale, loss in (
        ("a_ce", 1, 1.0, {"curvcal.loss": "ce", "curvcal.gamma": "0"}),
        ("b_flsd", 2, 6.0, {"curvcal.loss": "flsd53"}),
        ("c_focal", 3, 1.0, {"curvcal.loss": "focal", "curvcal.gamma": "2"}),
    ):
        draw = np.random.default_rng(seed)
        model = DigitsCNN(width=2)
        with torch.no_grad():
            for module in model.modules():  # PyTorch's default bound 1/sqrt(fan_in), by NumPy
                weight = getattr(module, "weight", None)
                if isinstance(module, torch.nn.Conv2d | torch.nn.Linear) and weight is not None:
                    bound = 1.0 / math.sqrt(weight[0].numel())
                    for tensor in (weight, module.bias):
                        if tensor is not None:
                            values = draw.uniform(-bound, bound, tuple(tensor.shape))
                            tensor.copy_(torch.from_numpy(values.astype(np.float32)))
            # sharper outputs: FLSD-53's samples fall on both sides of 0.2
            for layer in (model.classifier[1], model.classifier[3]):
                layer.weight.mul_(scale)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        metadata = {
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"width": 2}),
            **loss,
        }
        save_file(state, str(folder / f"{name}.safetensors"), metadata=metadata)


def masked(value: Any, workspace: str, in_results: bool = False) -> Any:
    """``value`` with the entries of :data:`MASKED_KEYS` (and under ``results`` those of
    :data:`PLAN_KEYS`) replaced by a marker and the temporary folder ``workspace`` in strings by
    ``<workspace>``, at any depth."""
    if isinstance(value, dict):
        hidden = MASKED_KEYS | PLAN_KEYS if in_results else MASKED_KEYS
        return {
            k: MASK if k in hidden else masked(v, workspace, in_results or k == "results")
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v, workspace, in_results) for v in value]
    if isinstance(value, str):
        return value.replace(workspace, "<workspace>")
    return value


def run(args: list[str]) -> dict[str, Any]:
    """The JSON document ``curvcal ARGS --json`` prints, run in this process."""
    import torch
    from click.testing import CliRunner

    from curvcal.cli import main

    torch.set_num_threads(1)
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main([*args, "--json"])
    stdout, stderr = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    if code != 0:
        raise RuntimeError(f"curvcal {' '.join(args)} exited {code}: {stderr}")
    document: dict[str, Any] = json.loads(stdout)
    return document


def produce(name: str, workspace: Path) -> dict[str, Any]:
    """The masked document of case ``name``."""
    args, _rtol = CASES[name]
    return masked(run(args(workspace)), str(workspace))


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        workspace = Path(folder)
        build_workspace(workspace)
        for name in CASES:
            document = produce(name, workspace)
            target = GOLDEN / f"{name}.json"
            target.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
            print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
