"""`curvcal hessian` makes the top eigenvectors (k × P values at the end of the eigenvalue
stage) only when they are used: for `--save-eigenvectors`, or on a model sharded with
`--shard-model` (the products' error along the top eigenvector), never on a plain run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from curvcal.assets import demo_checkpoint
from curvcal.cli import main

ARGS = ["--data", "curvcal:digits", "--max-samples", "60", "--no-trace", "--top-k", "2"]


def _made(monkeypatch: pytest.MonkeyPatch, *extra: str) -> list[int]:
    """Run `curvcal hessian` in this process; the widths of the eigenvector blocks the
    analysis handed on."""
    import curvcal.curvature.analysis as analysis

    made: list[int] = []
    real = analysis.TopEigenvectors

    def recorded(*args: Any) -> Any:
        top = real(*args)
        made.append(int(top.block.shape[1]))
        return top

    monkeypatch.setattr(analysis, "TopEigenvectors", recorded)
    with CliRunner().isolation():
        code = main(["hessian", str(demo_checkpoint()), *ARGS, *extra])
    assert code == 0
    return made


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_a_plain_run_makes_no_eigenvector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, method: str
) -> None:
    assert _made(monkeypatch, "--method", method) == []
    # asked for, they are made once, all k of them
    out = tmp_path / "v.safetensors"
    assert _made(monkeypatch, "--method", method, "--save-eigenvectors", str(out)) == [2]
    assert out.is_file()
