"""Terminal streams: data on stdout, messages and progress on stderr.

Consoles are created on each call so that the streams are the ones in force at write time (click's
test runner swaps them). ``NO_COLOR`` is honoured by rich itself. Progress is a bar on an
interactive stderr, plain lines every 10% or 30 s elsewhere (a CI log), nothing under ``--quiet``.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from curvcal.errors import InputError, bounded, printable
from curvcal.pace import PLAIN_GRACE_SECONDS, Clock, Pace, PlainLines

_FALLBACK_WIDTH = 120


def _width() -> int | None:
    """Rich picks the terminal's width; off a terminal (CI logs, pipes) use COLUMNS or 120."""
    if "COLUMNS" in os.environ:
        return None
    return _FALLBACK_WIDTH


class _Console(Console):
    """A rich console that lets a broken pipe propagate (rich's own answer is a silent
    ``SystemExit(1)``, "a check failed"); the CLI ends the run quietly with 141.

    It prints text as it is: no markup unless a call asks for it (a file named ``a[/]b.pt`` in
    a table cell was a ``MarkupError``, exit 70, and ``[bold]`` in a name was drawn bold), no
    emoji codes (``:thumbs_up:`` in a name was drawn as 👍), and
    every string it renders (each table cell, title, caption and line) goes through
    :func:`shown_text`: a control character in a name is shown as its escape, never sent to
    the terminal, and a name of 300,000 characters a checkpoint supplies is shown by its ends
    and its length, not over thousands of lines. What :meth:`out` writes (the JSON, YAML and
    XML outputs, machine-read) is written whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)  # x:thumbs_up:.pt was drawn with an emoji
        super().__init__(*args, **kwargs)
        self._whole = False

    def render_str(self, text: str, *args: Any, **kwargs: Any) -> Any:
        return super().render_str(
            printable(text) if self._whole else shown_text(text), *args, **kwargs
        )

    def out(self, *objects: Any, **kwargs: Any) -> None:
        """Write ``objects`` as text, whole (a report for a program, not a table for a
        person); control characters are still escaped."""
        self._whole = True
        try:
            super().out(*objects, **kwargs)
        finally:
            self._whole = False

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def shown_text(text: str) -> str:
    """``text`` as every console shows it to a person: :func:`~curvcal.errors.bounded` (a long
    name cut in the middle, with its length), then :func:`~curvcal.errors.printable` (control
    characters as escapes)."""
    return printable(bounded(text))


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


class ClosedStdout:
    """What ``sys.stdout`` is while the shell started curvcal with stdout closed (``>&-``):
    Python leaves it ``None``, and click and rich then drop what is printed without a word (or
    fail on ``None``, exit 1, which means a check failed). A run that has nothing to print
    (``-q -o FILE``) ends as usual; the first write is an :class:`InputError`, one line and
    exit 2, as a full stdout is."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        raise InputError(
            "stdout",
            "is closed (started with >&-), so the output cannot be written",
            "redirect it to a file or to /dev/null, or leave it open",
        )

    def flush(self) -> None:
        """Nothing is buffered."""

    def isatty(self) -> bool:
        return False


def stand_in_for_closed_stdout() -> None:
    """Put a :class:`ClosedStdout` where Python left no stdout (its descriptor was closed)."""
    if sys.stdout is None:
        sys.stdout = ClosedStdout()


StepCallback = Callable[[int], None]
"""Called by long-running kernels with the number of units of work just finished."""


def _no_plan(*_revised: Any) -> None:
    """A revised plan where no progress is shown."""


class Advance:
    """What :meth:`Reporter.progress` yields: called with the units just finished; its
    :meth:`describe` changes the text before the count (the stage a long run is in) and
    :attr:`plan` the total (a plan revised once the run resolved its settings)."""

    def __init__(
        self,
        step: StepCallback,
        describe: Callable[[str], None] | None = None,
        plan: Callable[[int | None, int, bool, int | None], None] | None = None,
    ) -> None:
        self._step = step
        self._describe = describe
        #: a new total, taken as :meth:`~curvcal.pace.Pace.plan` takes it: ``typical`` of it
        #: (done first) a typical count, not a known one, and the units past ``stage_end`` of
        #: stages not yet begun (nothing when no progress is shown)
        self.plan: Callable[..., None] = plan if plan is not None else _no_plan

    def __call__(self, units: int) -> None:
        self._step(units)

    def describe(self, text: str) -> None:
        if self._describe is not None:
            self._describe(text)


#: warnings said before a run's :class:`Reporter` exists (a former spelling read while the
#: options are parsed): the next reporter keeps them for its report
_EARLY: list[str] = []


def _say_warning(message: str) -> None:
    from rich.text import Text

    line = Text.assemble(("curvcal: warning:", "yellow"), " " + shown_text(message))
    stderr_console().print(line, highlight=False)


def warn_early(message: str) -> None:
    """Say ``message`` as a warning before the run's :class:`Reporter` exists; the reporter,
    once made, keeps it for the report's ``warnings`` like its own."""
    _EARLY.append(message)
    _say_warning(message)


def forget_early_warnings() -> None:
    """A new invocation begins: warnings held for an earlier one's reporter are dropped."""
    _EARLY.clear()


class Reporter:
    """Messages and progress for one command run; silent under ``quiet``. ``clock`` times the
    progress (tests pass their own)."""

    def __init__(self, quiet: bool = False, clock: Clock = time.monotonic) -> None:
        self.quiet = quiet
        #: every warning said, in order: a command's report carries each of them in its JSON
        #: ``warnings`` (:func:`curvcal.commands.common.finish`), so none is printed only;
        #: those said before this run's reporter existed (:func:`warn_early`) come first
        self.warned: list[str] = [*_EARLY]
        _EARLY.clear()
        self.clock = clock
        self._began = clock()
        self._held_stage: str | None = None

    def _plain(self, text: str, *, stage: bool = False) -> bool:
        """A line for a stderr that is not a terminal. A stage line is held and written just
        before the next progress line, and no line comes in the first
        :data:`~curvcal.pace.PLAIN_GRACE_SECONDS` of the run: a quick run, or one that stops
        on its input, says only its result or its one error line. Returns whether the line
        was written."""
        if stage:  # said with the next count: a run that stops on bad input says one line
            self._held_stage = text
            return False
        if self.clock() - self._began < PLAIN_GRACE_SECONDS:
            return False
        console = stderr_console()
        if self._held_stage is not None and not stage:
            console.print(self._held_stage, highlight=False, markup=False)
        self._held_stage = None
        console.print(text, highlight=False, markup=False)
        return True

    def info(self, message: str, *, markup: bool = False) -> None:
        """Say ``message`` on stderr (not under ``--quiet``); with ``markup``, it is rich
        markup whose user-given parts the caller escaped."""
        if not self.quiet:
            stderr_console().print(message, highlight=False, markup=markup)

    def stage(self, text: str) -> None:
        """Say which step the run is in (``loading the checkpoint``), as a line on stderr,
        so that the first second of a run already says something."""
        if self.quiet:
            return
        console = stderr_console()
        if console.is_terminal:
            console.print(f"curvcal: {text}", highlight=False, markup=False)
        else:
            self._plain(f"curvcal: {text}", stage=True)

    def warn(self, message: str) -> None:
        """Warnings are shown even under --quiet, and kept in :attr:`warned` for the JSON
        report; each once per run (a model folder's config read by the model's load and again
        by its tokenizer's made transformers say the same thing twice)."""
        if message in self.warned:
            return
        self.warned.append(message)
        _say_warning(message)

    @contextmanager
    def progress(self, description: str, total: int | None) -> Iterator[Advance]:
        """Progress of countable work on stderr; yields an :class:`Advance` taking completed
        units (and a new description, a new total).

        On a terminal, a bar with the count, the total and the time left
        (:class:`~curvcal.pace.Pace`); elsewhere (a CI log) plain lines, one every 10% or
        30 s (:class:`~curvcal.pace.PlainLines`). ``total=None`` when the amount of work is not
        known in advance (a count, no bar end)."""
        console = stderr_console()
        if self.quiet:
            yield Advance(lambda _n: None)
            return
        if not console.is_terminal:
            lines = PlainLines(description, total, self._plain, self.clock)
            yield Advance(lines.advance, lines.describe, lines.pace.plan)
            lines.finish()
            return
        pace = Pace(total, self.clock)
        columns = (
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.fields[pace]}", markup=False),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(description, total=total, pace=pace.text())

            def step(units: int) -> None:
                pace.update(pace.done + units)
                bar.update(task, completed=pace.done, total=pace.total, pace=pace.text())

            def plan(*revised: Any) -> None:  # Pace.plan's arguments, as Advance passes them
                pace.plan(*revised)
                bar.update(task, total=pace.total, pace=pace.text())

            shown = [description]

            def describe(text: str) -> None:
                if text != shown[0]:
                    shown[0] = text
                    pace.restart()
                    bar.update(task, description=text)

            yield Advance(step, describe, plan)
