"""Ctrl-C at any moment, hangs and absurd plans (the hardening catalogue, round three).

* Ctrl-C swept over a `calibrate -o` run from curvcal's first line (start-up and imports
  included): exit 130, no report, no temporary file, stderr the one line `curvcal: interrupted`.
* The register behind it (curvcal.interrupt): an output already moved into place is removed by
  an interrupt before the exit code is decided, kept after; a failed run removes its outputs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import curvcal
from curvcal.cli import main

ROOT = Path(curvcal.__file__).parent.parent
CHECKPOINT = ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}

# Starts `python -m curvcal` as the interpreter does (sys.argv[0] is "-m" while the package is
# located and imported, which is when curvcal takes over Ctrl-C) and says so once that import
# is done: the sweep's clock starts at curvcal's first line, not inside Python's own start-up
# (site and .pth imports run before any code of curvcal could take the signal).
LAUNCHER = (
    "import os, runpy, sys; ready = int(sys.argv[1]); sys.argv = ['-m', *sys.argv[2:]]; "
    "import curvcal; os.write(ready, b'.'); os.close(ready); "
    "runpy.run_module('curvcal', run_name='__main__', alter_sys=True)"
)
DELAYS = (0.0, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4, 0.6, 0.9, 1.3, 1.8, 2.4, 3.0)


def _as_a_shell_starts_it() -> None:
    """SIGINT unblocked and at its default in the child, as a terminal would start curvcal."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_run(folder: Path, delay: float, signals: int = 1) -> tuple[int, str]:
    """Start `curvcal calibrate -o report.json` in ``folder``, send SIGINT ``delay`` seconds
    after curvcal's first line (``signals`` times, 50 ms apart); the exit code and stderr."""
    read_end, write_end = os.pipe()
    command = [sys.executable, "-c", LAUNCHER, str(write_end), "calibrate", str(CHECKPOINT),
               "--data", "curvcal:digits", "--device", "cpu", "-o", "report.json"]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(write_end,),
        preexec_fn=_as_a_shell_starts_it,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"."
        os.close(read_end)
        time.sleep(delay)
        for count in range(signals):
            if count:
                time.sleep(0.05)
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, stderr


def _after(folder: Path, code: int, stderr: str, delay: float) -> None:
    """Either the interrupt ended the run (130, nothing written, one line) or it came after the
    exit code was decided (0, the whole report)."""
    left = sorted(path.name for path in folder.iterdir())
    where = f"SIGINT at {delay} s: exit {code}, files {left}, stderr {stderr!r}"
    if code == 0:  # a fast machine finished first: the report is whole and nothing else is there
        assert left == ["report.json"], where
        assert json.loads((folder / "report.json").read_text())["command"] == "calibrate", where
        return
    assert code == 130, where
    assert left == [], where
    assert stderr == "curvcal: interrupted\n", where


@pytest.mark.slow
def test_ctrl_c_swept_over_start_up_imports_and_the_run_gives_130_and_writes_nothing(
    tmp_path: Path,
) -> None:
    codes = []
    for number, delay in enumerate(DELAYS):
        folder = tmp_path / f"run{number}"
        folder.mkdir()
        code, stderr = _interrupted_run(folder, delay)
        _after(folder, code, stderr, delay)
        codes.append(code)
    assert codes.count(130) >= len(DELAYS) // 2, codes  # the sweep did interrupt runs


@pytest.mark.slow
def test_ctrl_c_twice_during_imports_still_gives_one_line_and_130(tmp_path: Path) -> None:
    code, stderr = _interrupted_run(tmp_path, 0.3, signals=2)
    _after(tmp_path, code, stderr, 0.3)


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter with curvcal's interrupt handler installed."""
    code = "import os, signal, time\nfrom pathlib import Path\n"
    code += "from curvcal import interrupt\nfrom curvcal.atomic import atomic_output\n"
    code += "interrupt.install()\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_as_a_shell_starts_it,
    )


def test_an_output_in_place_before_the_exit_is_decided_is_removed_by_ctrl_c(
    tmp_path: Path,
) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with atomic_output(Path("report.json")) as out:
                out.write(b"{}")
            with atomic_output(Path("plot.png")) as out:
                out.write(b"png")
                os.kill(os.getpid(), signal.SIGINT)  # mid-write: a temporary file exists
                time.sleep(30)
        """,
    )
    assert (done.returncode, done.stderr) == (130, "curvcal: interrupted\n")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_after_the_exit_is_decided_changes_nothing(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with atomic_output(Path("report.json")) as out:
                out.write(b"{}")
        interrupt.decided()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        """,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "report.json").read_bytes() == b"{}"


def test_ctrl_c_waits_for_a_held_step_then_removes_what_it_wrote(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with interrupt.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                Path("reached").write_text("the held step ran to its end")
                with atomic_output(Path("report.json")) as out:
                    out.write(b"{}")
            time.sleep(30)
        """,
    )
    assert (done.returncode, done.stderr) == (130, "curvcal: interrupted\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["reached"]


def test_a_failed_run_removes_the_outputs_it_had_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after a first output is in place (here: right after the report is written)
    leaves no output behind: exit 2, one line, no report."""
    from curvcal.commands import common
    from curvcal.errors import InputError

    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    real_emit = common.emit

    def emit_then_fail(*args: object, **kwargs: object) -> None:
        real_emit(*args, **kwargs)  # type: ignore[arg-type]
        assert (tmp_path / "report.json").exists()
        raise InputError("--plot", "could not be drawn")

    monkeypatch.setattr(common, "emit", emit_then_fail)
    monkeypatch.chdir(tmp_path)
    assert main(["metrics", str(logits), "-o", "report.json", "--quiet"]) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logits.npz"]


def test_a_run_that_ends_with_a_result_keeps_its_outputs(tmp_path: Path) -> None:
    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    assert main(["metrics", str(logits), "-o", str(tmp_path / "report.json"), "--quiet"]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["command"] == "metrics"
