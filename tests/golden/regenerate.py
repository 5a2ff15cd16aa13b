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
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent
MASK = "<masked>"
#: Keys whose values vary between runs, machines or temporary folders.
MASKED_KEYS = frozenset({"timings", "environment", "path", "size_bytes", "sha256"})

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

        return ["hessian", str(demo_checkpoint()), *_HESSIAN, "--dtype", dtype, *extra]

    return args


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
    metadata; the weights are a seeded initialisation, the FLSD-53 one with its classifier
    scaled so that p_y falls on both sides of 0.2) and two seeded tensor datasets."""
    import torch
    from safetensors.torch import save_file

    from curvcal.models import DigitsCNN

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 8, 8, generator=generator)
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
        torch.manual_seed(seed)
        model = DigitsCNN(width=2)
        with torch.no_grad():  # sharper outputs: FLSD-53's samples fall on both sides of 0.2
            for layer in (model.classifier[1], model.classifier[3]):
                layer.weight.mul_(scale)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        metadata = {
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"width": 2}),
            **loss,
        }
        save_file(state, str(folder / f"{name}.safetensors"), metadata=metadata)


def masked(value: Any, workspace: str) -> Any:
    """``value`` with the entries of :data:`MASKED_KEYS` replaced by a marker and the temporary
    folder ``workspace`` in strings by ``<workspace>``, at any depth."""
    if isinstance(value, dict):
        return {k: MASK if k in MASKED_KEYS else masked(v, workspace) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, workspace) for v in value]
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
