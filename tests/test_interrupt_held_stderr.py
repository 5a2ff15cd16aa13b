"""Ctrl-C while the tokenizer's standard error is held (load.texts.text.rust_panics_as) still says
``curvcal: interrupted`` on the real standard error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, signal
    from curvcal import interrupt
    interrupt.install()
    from curvcal.load.texts.text import rust_panics_as
    with interrupt.run_scope(), rust_panics_as("tokenizer"):
        os.kill(os.getpid(), signal.SIGINT)
        import time
        time.sleep(30)
    """
)


def test_an_interrupt_while_stderr_is_held_is_still_said(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 130
    assert done.stderr.strip().splitlines() == ["curvcal: interrupted"]


def test_the_real_stderr_is_known_while_it_is_moved() -> None:
    from curvcal import interrupt

    assert interrupt.stderr_fd() == 2
    with interrupt.stderr_moved(7):
        assert interrupt.stderr_fd() == 7
        with interrupt.stderr_moved(None):  # nothing moved again: still the outer one
            assert interrupt.stderr_fd() == 7
    assert interrupt.stderr_fd() == 2
