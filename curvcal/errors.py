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

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INPUT = 2
EXIT_NUMERICAL = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell shows for a process killed by it


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
        return " ".join(shorten(word) for word in text.split())  # always one line


#: Longest word (an option value, a path) a message repeats whole; longer ones are cut.
LONGEST_WORD = 100


def shorten(word: str, head: int = 60, tail: int = 20) -> str:
    """``word`` if it has at most :data:`LONGEST_WORD` characters, else its first ``head`` and
    last ``tail`` characters around an ellipsis, with the full length: a 100,000-character
    ``--arch`` must not fill the terminal, and the ends are what tell two values apart."""
    if len(word) <= LONGEST_WORD:
        return word
    # The message's own quotes and punctuation stay outside the cut value.
    core = word.lstrip("'\"(").rstrip(":,;)'\"")
    start = word[: len(word) - len(word.lstrip("'\"("))]
    end = word[len(start) + len(core) :]
    close = end[: len(end) - len(end.lstrip("'\")"))]
    return (
        f"{start}{core[:head]}…{core[-tail:]}{close} [{len(core):,} characters]{end[len(close) :]}"
    )


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


class TrustError(InputError):
    """Loading would run code from a file and ``--trust-checkpoint`` was not given (exit 2)."""


class NumericalError(CurvcalError):
    """NaN/Inf in a loss, product or metric, or no convergence under ``--strict`` (exit 3)."""

    exit_code = EXIT_NUMERICAL
