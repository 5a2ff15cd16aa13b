"""Exceptions a user can act on, and the exit codes the CLI maps them to.

Exit codes (the CLI contract, also in README.md):

====  =========================================================
0     success, or a check passed
1     a check failed (``curvcal check`` / ``curvcal compare``)
2     usage or input error: bad file, bad option, bad data
3     numerical failure: NaN/Inf, no convergence under --strict
70    internal error (a bug in curvcal; rerun with --debug)
130   interrupted (Ctrl-C)
141   stdout closed before the output was written (a broken pipe, as in ``| head``): no message
====  =========================================================
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INPUT = 2
EXIT_NUMERICAL = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell shows for a process killed by it


# -- settings named in messages --------------------------------------------------------------
#
# A setting has one name, its field (``probe_batch``); each reader sees it in its own words: the
# command line as the option (``--probe-batch``), Python as the field, an API function as its
# argument. Kernels and settings name a field by :func:`setting_name`, which words it as the
# context says (:func:`wording`); the context is set in one place per reader: the CLI's entry
# point says "options".


def as_field(field: str) -> str:
    """A setting as Python names it: the field itself (``probe_batch``)."""
    return field


def as_option(field: str) -> str:
    """A setting as the command line names it: ``probe_batch`` -> ``--probe-batch``."""
    return "--" + field.replace("_", "-")


#: how the messages made in this context name the settings (default: by their fields)
_WORDING: contextvars.ContextVar[Callable[[str], str]] = contextvars.ContextVar(
    "curvcal_setting_wording", default=as_field
)


def setting_name(field: str) -> str:
    """Field ``field`` (``probe_batch``) as a message made now names it (:func:`wording`)."""
    return _WORDING.get()(field)


@contextlib.contextmanager
def wording(naming: Callable[[str], str]) -> Iterator[None]:
    """Messages made inside the block name settings by ``naming`` (:func:`as_option` on the
    command line)."""
    token = _WORDING.set(naming)
    try:
        yield
    finally:
        _WORDING.reset(token)


class FormerSpellingWarning(DeprecationWarning):
    """A setting's value written in a former spelling (``hutch++`` for ``hutchpp``), read as
    today's; the command line says it as a warning of the run."""


class CurvcalError(Exception):
    """Base class: an error with a one-line message ``<what>: <why> (<hint>)``.

    ``what`` names the file, option or object at fault, ``why`` says what is wrong with it,
    ``hint`` (optional) says what the user can do about it.
    """

    exit_code: int = EXIT_INPUT

    def __init__(self, what: str, why: str, hint: str | None = None) -> None:
        self.what = what
        self.why = why
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"{self.what}: {self.why}"
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(shorten(word) for word in printable(text).split())  # always one line


#: The control characters curvcal never prints raw (C0 but tab and newline, DEL, C1), each
#: shown as its ``\xNN`` escape: a file named ``a\x1b[2J.pt`` must not clear the terminal,
#: nor an escape sequence recolour or erase a verdict line in a CI log; and the characters
#: that reorder or break a line where they stand (the bidirectional overrides and isolates,
#: U+2028/U+2029), shown as ``\uNNNN``: ``a\u202egnp.pt`` must not read as ``atp.png``.
_CONTROLS = {
    **{
        code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code not in (9, 10)
    },
    **{
        code: f"\\u{code:04x}"
        for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    },
    **{code: f"\\u{code:04x}" for code in (0x2028, 0x2029)},
}


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline, and every character that
    reorders or breaks a line, written as its escape (:data:`_CONTROLS`): what every line
    curvcal prints goes through (the error line, and every string its consoles render)."""
    return text.translate(_CONTROLS)


#: Longest word (an option value, a path) a message repeats whole; longer ones are cut.
LONGEST_WORD = 100


def shorten(word: str, head: int = 60, tail: int = 20, longest: int = LONGEST_WORD) -> str:
    """``word`` if it has at most ``longest`` characters, else its first ``head`` and
    last ``tail`` characters around an ellipsis, with the full length: a 100,000-character
    ``--arch`` must not fill the terminal, and the ends are what tell two values apart."""
    if len(word) <= longest:
        return word
    # The message's own quotes and punctuation stay outside the cut value.
    core = word.lstrip("'\"(").rstrip(":,;)'\"")
    start = word[: len(word) - len(word.lstrip("'\"("))]
    end = word[len(start) + len(core) :]
    close = end[: len(end) - len(end.lstrip("'\")"))]
    return (
        f"{start}{core[:head]}…{core[-tail:]}{close} [{len(core):,} characters]{end[len(close) :]}"
    )


#: Longest word (a name a file supplies: a state dict's key, a module's, a class's, a file's)
#: that a line or table cell shown to a person holds whole; longer ones are cut as
#: :func:`shorten` cuts them, with their length (the JSON output keeps them whole)
LONGEST_SHOWN_WORD = 200
#: Longest string (a table cell, a title, a caption, a line) shown whole to a person; a longer
#: one (many words that are each short enough) keeps its ends and says its length
LONGEST_SHOWN_TEXT = 2000
_LONG_WORD = re.compile(rf"\S{{{LONGEST_SHOWN_WORD + 1},}}")


def bounded(text: str) -> str:
    """``text`` as a person is shown it (every table cell, title, caption and line the
    consoles draw, and the markdown and HTML reports' text): each word longer than
    :data:`LONGEST_SHOWN_WORD` cut in the middle by :func:`shorten`, then, if the whole is
    still longer than :data:`LONGEST_SHOWN_TEXT`, its first and last characters around an
    ellipsis with the full length. A checkpoint key of 300,000 characters is a few lines, not
    thousands; white space and line breaks are kept as they are."""
    if len(text) <= LONGEST_SHOWN_WORD:
        return text
    whole = len(text)
    text = _LONG_WORD.sub(
        lambda word: shorten(word.group(), head=140, tail=40, longest=LONGEST_SHOWN_WORD), text
    )
    if len(text) <= LONGEST_SHOWN_TEXT:
        return text
    head, tail = LONGEST_SHOWN_TEXT * 7 // 10, LONGEST_SHOWN_TEXT // 5
    return f"{text[:head]}…{text[-tail:]} [{whole:,} characters]"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The message of ``exc`` (a library's error, quoted in ours) on one line of at most
    ``limit`` characters; its type's name when it has no message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StdoutClosed(Exception):
    """The reader of stdout went away before the output was written (a broken pipe); the CLI
    ends quietly with :data:`EXIT_BROKEN_PIPE`."""


class InputError(CurvcalError):
    """A bad file, option or dataset given by the user (exit 2)."""

    exit_code = EXIT_INPUT


class SettingsError(InputError):
    """A setting's value refused, by the settings or a kernel: ``what`` is the field at fault
    (``field``, then ``value`` when given: ``--loss focal``) as :func:`setting_name` words it
    (the command line as the option, Python as the field); ``why`` and ``hint`` name other
    settings the same way (exit 2)."""

    def __init__(self, field: str, why: str, hint: str | None = None, *, value: str = "") -> None:
        self.field = field
        super().__init__(setting_name(field) + (f" {value}" if value else ""), why, hint)


class TrustError(InputError):
    """Loading would run code from a file and ``--trust-checkpoint`` was not given (exit 2)."""


class NumericalError(CurvcalError):
    """NaN/Inf in a loss, product or metric, or no convergence under ``--strict`` (exit 3)."""

    exit_code = EXIT_NUMERICAL
