"""Terminal streams: data on stdout, messages and progress on stderr.

Consoles are created on each call so that the streams are the ones in force at write time (click's
test runner swaps them). ``NO_COLOR`` is honoured by rich itself; progress is shown only on an
interactive stderr and never under ``--quiet``.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_FALLBACK_WIDTH = 120


def _width() -> int | None:
    """Rich picks the terminal's width; off a terminal (CI logs, pipes) use COLUMNS or 120."""
    if "COLUMNS" in os.environ:
        return None
    return _FALLBACK_WIDTH


class _Console(Console):
    """A rich console that lets a broken pipe propagate (rich's own answer is a silent
    ``SystemExit(1)``, "a check failed"); the CLI ends the run quietly with 141."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def stdout_console() -> Console:
    console = _Console(soft_wrap=False)
    if not console.is_terminal:
        console = _Console(width=_width(), soft_wrap=False)
    return console


def stderr_console() -> Console:
    console = _Console(stderr=True)
    if not console.is_terminal:
        console = _Console(stderr=True, width=_width())
    return console


#: What the symbols curvcal prints become on a stream whose encoding lacks them (such as
#: ``PYTHONIOENCODING=ascii`` or a C locale): readable ASCII, ``?`` for anything else.
ASCII_FALLBACK = {
    "λ": "lambda",
    "γ": "gamma",
    "×": "x",
    "−": "-",
    "–": "-",
    "—": "-",
    "…": "...",
    "≤": "<=",
    "≥": ">=",
    "±": "+/-",
    "≈": "~",
    "√": "sqrt",
    "²": "^2",
    "‖": "||",
    "█": "#",
    "┃": "|",
    "·": ".",
    "◀": "<",
    "━": "-",
}
_ASCII_ERRORS = "curvcal-ascii-fallback"


def _ascii_fallback(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start : error.end]
    return "".join(ASCII_FALLBACK.get(char, "?") for char in text), error.end


codecs.register_error(_ASCII_ERRORS, _ascii_fallback)


def tolerate_narrow_encodings() -> None:
    """Make stdout and stderr replace what their encoding cannot write (``λ``, ``×``, the bars
    of a reliability table) by :data:`ASCII_FALLBACK` instead of failing with
    UnicodeEncodeError; streams that can encode them are left as they are."""
    for stream in (sys.stdout, sys.stderr):
        try:
            "λ×█".encode(getattr(stream, "encoding", None) or "utf-8")
        except UnicodeEncodeError:
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                with contextlib.suppress(ValueError, OSError):
                    reconfigure(errors=_ASCII_ERRORS)
        except LookupError:  # an encoding Python does not know: leave it to fail as before
            pass


StepCallback = Callable[[int], None]
"""Called by long-running kernels with the number of units of work just finished."""


class Advance:
    """What :meth:`Reporter.progress` yields: called with the units just finished; its
    :meth:`describe` changes the text before the bar (the stage a long run is in)."""

    def __init__(self, step: StepCallback, describe: Callable[[str], None] | None = None) -> None:
        self._step = step
        self._describe = describe

    def __call__(self, units: int) -> None:
        self._step(units)

    def describe(self, text: str) -> None:
        if self._describe is not None:
            self._describe(text)


class Reporter:
    """Messages and progress for one command run; silent under ``quiet``."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        #: every warning said, in order: a command's report carries each of them in its JSON
        #: ``warnings`` (:func:`curvcal.commands.common.finish`), so none is printed only
        self.warned: list[str] = []

    def info(self, message: str) -> None:
        if not self.quiet:
            stderr_console().print(message, highlight=False)

    def warn(self, message: str) -> None:
        """Warnings are shown even under --quiet, and kept in :attr:`warned` for the JSON
        report."""
        self.warned.append(message)
        stderr_console().print(f"[yellow]curvcal: warning:[/yellow] {message}", highlight=False)

    @contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        """A progress bar on an interactive stderr; yields an :class:`Advance` taking completed
        units (and a new description).

        ``total=None`` when the amount of work is not known in advance (a count, no bar end)."""
        console = stderr_console()
        if self.quiet or not console.is_terminal:
            yield Advance(lambda _n: None)
            return
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}" if total is None else "{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield Advance(
                lambda n: bar.advance(task, n),
                lambda text: bar.update(task, description=text),
            )
