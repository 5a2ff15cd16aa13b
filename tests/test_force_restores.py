"""``--force`` replaces a file only once the run has ended with a result: a run that fails
after writing an output puts back the file that output replaced (``curvcal.interrupt.discard``
with the hard link ``curvcal.atomic`` keeps), so nothing the user had is lost whatever the
flags; a run that ends with a result leaves no link behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curvcal import interrupt
from curvcal.assets import demo_checkpoint
from curvcal.atomic import atomic_output
from curvcal.errors import InputError


def _write(path: Path, text: str) -> None:
    with atomic_output(path) as out:
        out.write(text.encode())


def test_a_failed_run_puts_the_replaced_file_back(tmp_path: Path) -> None:
    old, fresh = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text("the user's")
    with interrupt.run_scope():
        _write(old, "this run's")
        _write(fresh, "this run's")
        _write(old, "this run's, again")  # a second write: the user's file still returns
        assert old.read_text() == "this run's, again"
        interrupt.discard()
    assert old.read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no link, no new file


def test_a_run_that_keeps_its_outputs_leaves_no_link(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text("the user's")
    old.chmod(0o640)
    with interrupt.run_scope():
        _write(old, "this run's")
    assert old.read_text() == "this run's" and (old.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]


def test_outside_a_run_nothing_is_kept(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text("the user's")
    _write(old, "the library's")  # the library used directly: a plain replace
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]


def test_a_forced_cli_run_failing_after_its_report_keeps_the_old_report(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hessian -o report.json --force --plot p.png` whose plot cannot be written (a disk that
    filled after the report was out): exit 2, and report.json is the user's file again."""
    import curvcal.commands.hessian as command

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise InputError(str(tmp_path / "p.png"), "cannot be written: No space left on device")

    monkeypatch.setattr(command, "write_plots", full_disk)
    report = tmp_path / "report.json"
    report.write_text('{"old": true}')
    result = run_cli(
        "hessian", demo_checkpoint(), "--data", "curvcal:digits", "--max-samples", "40",
        "--device", "cpu", "--no-trace", "-o", report, "--force", "--plot", tmp_path / "p.png",
    )  # fmt: skip
    assert result.code == 2, result.output
    assert "No space left on device" in result.stderr
    assert json.loads(report.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
