"""The ``curvcal`` command line: a click group and the exit-code contract.

Commands live in :mod:`curvcal.commands`; this module only registers them and turns exceptions
into one-line messages and exit codes (see :mod:`curvcal.errors`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import click

from curvcal import __version__, inputs, interrupt
from curvcal.commands import LazyGroup
from curvcal.commands.common import output_options
from curvcal.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CurvcalError,
    FormerSpellingWarning,
    StdoutClosed,
    as_option,
    printable,
    shorten,
    wording,
)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="curvcal")
@output_options
def cli() -> None:
    """Curvature and calibration of a trained classifier checkpoint.

    \b
    Exit codes: 0 success or check passed, 1 check failed, 2 usage or input
    error, 3 numerical failure, 70 internal error, 130 interrupted, 141 stdout
    closed early (a broken pipe).
    """
    # every file the run opens is recorded as an input, for this invocation only
    click.get_current_context().with_resource(inputs.recording())


def _error(message: str) -> None:
    click.echo(f"curvcal: error: {printable(message)}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (the console script exits with it).

    A run that fails (an error mapped to exit 2, 3 or 70, or an interrupt) removes every output it
    had already written (see :mod:`curvcal.interrupt`); a run that ends with a result (exit 0, a
    failed check's 1, ``--strict``'s 3 beside its report) keeps them.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # the command line names every setting by its option, whoever raised the error
    with interrupt.run_scope(), wording(as_option), _former_spellings_said():
        code, failed = _invoke(args)
        if failed:
            interrupt.discard()
        return code


@contextlib.contextmanager
def _former_spellings_said() -> Iterator[None]:
    """A setting written in a former spelling (an option, a policy's key) is a warning of the
    run (on stderr and in the report's ``warnings``), through the run's reporter or, while the
    options are parsed, held for it: Python's own filters would hide a ``DeprecationWarning``."""
    from curvcal.console import forget_early_warnings, warn_early

    forget_early_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always", FormerSpellingWarning)
        show = warnings.showwarning

        def said(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            if issubclass(category, FormerSpellingWarning):
                from curvcal.commands.common import current_reporter

                reporter = current_reporter()
                if reporter is not None:
                    reporter.warn(str(message))
                else:
                    warn_early(str(message))
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = said
        yield


def _invoke(args: list[str]) -> tuple[int, bool]:
    """The exit code of one invocation, and whether it failed (ended in an exception)."""
    from curvcal.console import stand_in_for_closed_stdout, tolerate_narrow_encodings

    debug = "--debug" in args or bool(os.environ.get("CURVCAL_DEBUG"))
    stand_in_for_closed_stdout()
    tolerate_narrow_encodings()
    try:
        result = cli.main(args=args, prog_name="curvcal", standalone_mode=False)
    except (BrokenPipeError, StdoutClosed):
        # the reader of stdout went away (`curvcal ... | head -c1`): nobody is left to tell,
        # so end quietly with the code a process killed by SIGPIPE has in a shell
        _discard_stdout()
        return EXIT_BROKEN_PIPE, False  # the run ended; only its reader went away
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("curvcal: interrupted", err=True)
        return EXIT_INTERRUPTED, True
    except click.exceptions.Exit as exc:
        return exc.exit_code, exc.exit_code != EXIT_OK
    except click.UsageError as exc:
        where = f"curvcal {exc.ctx.command_path.split(' ', 1)[-1]}" if exc.ctx else "curvcal"
        _error(f"{exc.format_message()} (see '{where} --help')")
        return EXIT_INPUT, True
    except click.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code, True
    except CurvcalError as exc:
        if debug:
            traceback.print_exc()
        _error(exc.message)
        return exc.exit_code, True
    except OSError as exc:
        if exc.errno not in _FULL or exc.filename is not None:
            return _internal(exc, debug), True
        # files curvcal writes name themselves (curvcal.atomic); an unnamed full disk is stdout
        if debug:
            traceback.print_exc()
        _discard_stdout()
        _error(f"stdout: cannot be written: {exc.strerror} (free some space or redirect it)")
        return EXIT_INPUT, True
    except Exception as exc:
        return _internal(exc, debug), True
    return (result if isinstance(result, int) else EXIT_OK), False


#: errno values of a write that found no room (disk full, quota, file size limit)
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _internal(exc: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    text = " ".join(shorten(word) for word in str(exc).split()) or type(exc).__name__
    _error(
        f"internal error: {type(exc).__name__}: {text} "
        "(rerun with --debug for a traceback and please report it)"
    )
    return EXIT_INTERNAL


def _discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null, so that the interpreter's last flush of
    what is still buffered neither fails nor prints "Exception ignored" at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file: in-process
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def run() -> NoReturn:
    """The process entry point (console script and ``python -m curvcal``): exit with main's code.

    Ctrl-C is handled by :mod:`curvcal.interrupt` (installed here, if ``python -m curvcal`` did
    not already install it before any import): exit 130, nothing written, at any moment until
    the exit code is decided. The code is decided when :func:`main` returns, every output in
    place; SIGINT is ignored from then on, the streams are flushed and the process exits with
    that code.
    """
    interrupt.install()
    code = main()
    interrupt.decided()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, broken or None
            stream.flush()
    if code == EXIT_INTERRUPTED:  # an interrupt main caught itself: exit without unwinding
        os._exit(code)
    sys.exit(code)
