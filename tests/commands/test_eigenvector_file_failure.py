"""`curvcal hessian --save-eigenvectors`: the file is streamed when the eigenvalue stage ends.
A run that fails in a later stage (here the trace: a product that turned NaN) leaves the named
file as it was — a file `--force` replaced is put back — and no temporary file beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from curvcal.assets import demo_checkpoint
from curvcal.cli import main
from curvcal.errors import NumericalError

ARGS = ["--data", "curvcal:digits", "--max-samples", "60", "--top-k", "2", "--probes", "8"]


def _run(*extra: str) -> tuple[int, str]:
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main(["hessian", str(demo_checkpoint()), *ARGS, *extra])
    return code, streams[1].getvalue().decode()


def _failing_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    import curvcal.curvature.analysis as analysis

    def trace_estimate(*_args: Any, **_kwargs: Any) -> Any:
        raise NumericalError("hessian", "a Hessian-vector product is NaN", "check the model")

    monkeypatch.setattr(analysis, "trace_estimate", trace_estimate)


def test_a_run_that_fails_after_the_eigenvalues_leaves_the_file_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = tmp_path / "old.safetensors"
    old.write_bytes(b"the user's own file")
    new = tmp_path / "new.safetensors"
    with monkeypatch.context() as patched:
        _failing_trace(patched)
        code, text = _run("--force", "--save-eigenvectors", str(old))
        assert code == 3 and "NaN" in text
        code, text = _run("--save-eigenvectors", str(new))
        assert code == 3 and "NaN" in text
    assert old.read_bytes() == b"the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.safetensors"]  # no temporary
    # the same run without the failure replaces the file (--force) with the eigenvectors
    code, text = _run("--force", "--save-eigenvectors", str(old))
    assert code == 0, text
    with safe_open(str(old), "pt") as stored:
        names = stored.keys()  # safetensors' handle is not iterable itself
        assert {name.split("/")[0] for name in names} == {"v0", "v1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.safetensors"]
