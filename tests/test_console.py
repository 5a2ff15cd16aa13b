"""Progress on stderr: the bar's count and the stage it names."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from curvcal import console as console_module
from curvcal.console import Reporter


def _terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr(
        console_module,
        "stderr_console",
        lambda: Console(file=stream, force_terminal=True, width=120, color_system=None),
    )
    return stream


def test_the_bar_shows_the_stage_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _terminal(monkeypatch)
    with Reporter().progress("Hessian-vector products", None) as advance:
        advance(3)
        advance.describe("Hessian-vector products (Gauss–Newton trace, batch 2)")
    shown = stream.getvalue()
    assert "Gauss–Newton trace, batch 2" in shown
    assert " 3 " in shown  # the count of units done


def test_quiet_and_pipes_show_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _terminal(monkeypatch)
    with Reporter(quiet=True).progress("inference", 10) as advance:
        advance(4)
        advance.describe("elsewhere")
    assert stream.getvalue() == ""
    piped = io.StringIO()
    monkeypatch.setattr(console_module, "stderr_console", lambda: Console(file=piped))
    with Reporter().progress("inference", 10) as advance:
        advance(4)
        advance.describe("elsewhere")
    assert piped.getvalue() == ""
