"""Ctrl-C: a real `python -m curvcal hessian` process gets SIGINT mid-run, exits 130, prints
`curvcal: interrupted` last, leaves no output file (nor a temporary one) and no terminal codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import curvcal

CHECKPOINT = Path(curvcal.__file__).parent / "assets" / "digits_cnn.safetensors"
STARTUP_SECONDS = 4.0  # past `import click` (before which Python itself would take the signal)


def _as_a_shell_starts_it() -> None:
    """SIGINT unblocked and at its default in the child, as a terminal would start curvcal:
    a child inherits the parent's signal mask and ignored signals, and what other tests in
    this process (threads of the libraries they load) leave there is not curvcal's to test."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_exits_130_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(Path(curvcal.__file__).parent.parent), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "curvcal", "hessian", str(CHECKPOINT),
               "--data", "curvcal:digits", "--device", "cpu", "--probes", "29000",
               "--trace-method", "hutchinson", "-o", str(out)]  # fmt: skip
    # Hutchinson keeps the run in its product loop; a 100,000-product Hutch++ would first draw
    # a 9,802 × 33,333 float64 sketch (2.6 GB), which under a loaded machine can outlast the wait.
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    try:
        time.sleep(STARTUP_SECONDS)
        assert process.poll() is None, process.communicate()  # still working
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired as error:
            state = (
                f"parent SIGINT handler {signal.getsignal(signal.SIGINT)!r}, "
                f"blocked {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}"
            )
            raise AssertionError(
                f"no exit 60 s after SIGINT ({state}): {error.stderr!r}"
            ) from error
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert stderr.rstrip().endswith("curvcal: interrupted")
    assert "Traceback" not in stderr and "\x1b" not in stderr and stdout == ""
    assert list(tmp_path.iterdir()) == []
