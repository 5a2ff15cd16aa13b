"""Ctrl-C at any moment ends a run with exit 130 and leaves nothing it wrote.

The command-line entry point calls :func:`install` as its very first statement, before click,
numpy or torch are imported. From then on SIGINT never becomes a ``KeyboardInterrupt`` raised
into whatever code happens to run (a half-finished ``import torch``, a C++ extension calling
back into Python, a numpy reduction): such an exception can surface as an ``ImportError``
("cannot load module more than once"), a ``RecursionError``, or a C++ ``terminate`` (SIGABRT).
Instead the handler removes what the run has written, prints ``curvcal: interrupted`` on
stderr and ends the process with ``os._exit(130)``; a Python signal handler runs between
bytecodes of the main thread, so every loop of Python steps answers it at its next step.

What a run writes is registered here by :mod:`curvcal.atomic`: the temporary file of a write
in progress, and each output once it is moved into place. The register lives for one
:func:`run_scope` (one CLI invocation):

* Ctrl-C before the exit code is decided removes every temporary file and every output of the
  run, then exits 130;
* a run that fails (an exception mapped to exit 2, 3 or 70) removes them too (:func:`discard`);
* the exit code is *decided* when :func:`decided` is called, after the command returned and
  every output is in place; SIGINT is ignored from then on, so an interrupt that arrives later
  leaves the finished outputs and the decided exit code. An interrupt either ends the run with
  130 and nothing written, or comes too late to change anything.

The steps that must not be cut in two (create a temporary file and register it; move it into
place and register the output) run inside :func:`held`, which postpones an interrupt to the end
of the block. Library code that never calls :func:`install` keeps Python's own Ctrl-C.

SIGTERM (a job scheduler, ``kill``, torchrun stopping its workers) ends a run the same way,
outputs and temporary files removed, held steps finished first, but then by the signal itself
(the process's status says SIGTERM, as before curvcal handled it, and nothing is printed: a
launcher such as torchrun sends it to ranks that have already said why they stop). It never
asks a staged computation to stop, and it does not call the :func:`on_stop` hooks (the sender
stops the other ranks itself).

The moment the exit code is decided is also the end of :func:`run_scope` in the process that
installed the handlers: both signals are then ignored (SIGTERM given back to the handler that
was in place before) before the register is cleared, so no signal can land where it would end
the run as interrupted and leave its outputs.

A staged computation whose finished stages are worth keeping (the Hessian analysis: the
eigenvalues done, the trace running) runs inside :func:`stages`: there the first Ctrl-C only
asks it to stop; its progress hook reads :func:`stop_requested` between products (in Python
code, never from the signal handler) and raises
:class:`~curvcal.curvature.progress.Stopped`, which the computation returns with what it
finished. The command then writes those results, whole and atomically, with
``status: interrupted`` and exits 130. A second Ctrl-C, or one before any stage finished,
ends the run as above, nothing written.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from curvcal.errors import EXIT_INTERRUPTED

_MESSAGE = b"curvcal: interrupted\n"


class _Register:
    """The process's interrupt state (one per process; main thread only)."""

    def __init__(self) -> None:
        self.owner: int | None = None  # the pid that installed the handler
        self.active = False  # inside a run_scope
        self.temporary: set[str] = set()
        self.outputs: list[Path] = []
        #: output → the hard link to the file it replaced, put back if the run fails
        self.replaced: dict[Path, str] = {}
        self.holding = 0
        #: the signal (SIGINT or SIGTERM) that arrived during a held step, handled at its end
        self.pending: int | None = None
        #: SIGTERM's handler before :func:`install` (given back once the exit code is decided)
        self.previous_terminate: object = signal.SIG_DFL
        #: called (errors ignored) once the run's files are removed, before the process ends:
        #: under torchrun, telling the other ranks (curvcal.distributed)
        self.on_stop: list[Callable[[], None]] = []
        #: the descriptor ``curvcal: interrupted`` is written to (2 unless it is held elsewhere)
        self.stderr_fd = 2
        self.staged = 0  # inside stages(): the first Ctrl-C asks, it does not stop
        self.stop_asked = False


_REGISTER = _Register()


def install() -> None:
    """Handle SIGINT and SIGTERM as described above (the entry point's first statement;
    idempotent). A SIGTERM the parent ignores stays ignored."""
    _REGISTER.owner = os.getpid()
    signal.signal(signal.SIGINT, _on_interrupt)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is _on_terminate:
        return
    _REGISTER.previous_terminate = previous if previous is not None else signal.SIG_DFL
    signal.signal(signal.SIGTERM, _on_terminate)


def handles_terminate() -> bool:
    """Whether SIGTERM is handled here (removing what the run wrote), in this process."""
    return _REGISTER.owner == os.getpid() and signal.getsignal(signal.SIGTERM) is _on_terminate


def on_stop(hook: Callable[[], None] | None) -> None:
    """Call ``hook`` when Ctrl-C ends the process (``None``: no hook)."""
    _REGISTER.on_stop[:] = [] if hook is None else [hook]


def decided() -> None:
    """The exit code is decided and every output is in place: ignore SIGINT from now on, and
    give SIGTERM back to the handler it had before."""
    _signals_decided()
    _forget_replaced()
    _REGISTER.temporary.clear()
    _REGISTER.outputs.clear()
    _REGISTER.active = False


def _signals_decided() -> None:
    """Neither signal can end the run as interrupted any more (only where they are ours)."""
    if _REGISTER.owner != os.getpid():
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if signal.getsignal(signal.SIGTERM) is _on_terminate:
        signal.signal(signal.SIGTERM, _REGISTER.previous_terminate)  # type: ignore[arg-type]


def _forget_replaced() -> None:
    """The run kept its outputs: drop the links to the files they replaced."""
    for backup in _REGISTER.replaced.values():
        with suppress(OSError):
            os.unlink(backup)
    _REGISTER.replaced.clear()


@contextmanager
def run_scope() -> Iterator[None]:
    """One CLI invocation: register what it writes, forget it when the invocation ends (the
    caller calls :func:`discard` first when the invocation failed). In the process that
    installed the handlers its end decides the exit code (:func:`decided`): the signals are
    ignored before the register is forgotten, so none lands in between."""
    _REGISTER.temporary.clear()
    _REGISTER.outputs.clear()
    _REGISTER.active = True
    _REGISTER.stop_asked = False
    try:
        yield
    finally:
        _signals_decided()
        _REGISTER.active = False
        _forget_replaced()
        _REGISTER.temporary.clear()
        _REGISTER.outputs.clear()


def stderr_fd() -> int:
    """The descriptor of the real stderr (2, unless :func:`stderr_moved` says otherwise): where
    a last line goes while a library's output is held elsewhere."""
    return _REGISTER.stderr_fd


@contextmanager
def stderr_moved(fd: int | None) -> Iterator[None]:
    """While descriptor 2 is redirected (to hold a library's own report), say ``interrupted``
    on ``fd``, the process's real standard error (``None``: nothing moved)."""
    saved = _REGISTER.stderr_fd
    if fd is not None:
        _REGISTER.stderr_fd = fd
    try:
        yield
    finally:
        _REGISTER.stderr_fd = saved


@contextmanager
def held() -> Iterator[None]:
    """Postpone Ctrl-C to the end of the block (a step that must not be cut in two)."""
    _REGISTER.holding += 1
    try:
        yield
    finally:
        _REGISTER.holding -= 1
        if _REGISTER.holding == 0 and _REGISTER.pending is not None:
            _stop(_REGISTER.pending)


def temporary_created(name: str) -> None:
    """A temporary file now exists (call inside :func:`held`, right after creating it)."""
    if _REGISTER.active:
        _REGISTER.temporary.add(name)


def temporary_gone(name: str) -> None:
    """A temporary file was moved into place or removed."""
    _REGISTER.temporary.discard(name)


def output_written(path: Path, replaced: str | None = None) -> None:
    """An output of the run is in place (call inside :func:`held`, right after the move);
    ``replaced``: a hard link to the file it replaced (``--force``), put back by
    :func:`discard` and removed once the run has kept its outputs."""
    if not _REGISTER.active:
        return
    if path in _REGISTER.outputs:  # written twice: what it replaced now is this run's own
        if replaced is not None:
            with suppress(OSError):
                os.unlink(replaced)
        return
    _REGISTER.outputs.append(path)
    if replaced is not None:
        _REGISTER.replaced[path] = replaced


def active() -> bool:
    """Whether a CLI invocation is registering what it writes (:func:`run_scope`)."""
    return _REGISTER.active


def discard() -> None:
    """Undo what the current run wrote: remove every temporary file and every output, and put
    back the file an output replaced (so a failed ``--force`` run loses nothing)."""
    for name in _REGISTER.temporary:
        with suppress(OSError):  # already gone
            os.unlink(name)
    for path in _REGISTER.outputs:
        backup = _REGISTER.replaced.pop(path, None)
        with suppress(OSError):
            if backup is not None:
                os.replace(backup, path)
            else:
                os.unlink(path)
    _forget_replaced()
    _REGISTER.temporary.clear()
    _REGISTER.outputs.clear()


@contextmanager
def stages() -> Iterator[None]:
    """A staged computation: the first Ctrl-C sets :func:`stop_requested` instead of ending
    the process (only where :func:`install` handles SIGINT)."""
    _REGISTER.staged += 1
    try:
        yield
    finally:
        _REGISTER.staged -= 1


def stop_requested() -> bool:
    """Whether Ctrl-C asked the staged computation running to stop."""
    return _REGISTER.stop_asked


def stop_now() -> None:
    """End the run as an interrupt outside :func:`stages` does: remove what it wrote, exit 130."""
    _stop()


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _REGISTER.owner:  # a forked worker: its parent speaks for the run
        os._exit(EXIT_INTERRUPTED)
    if _REGISTER.staged and not _REGISTER.stop_asked and not _REGISTER.holding:
        _REGISTER.stop_asked = True
        return
    if _REGISTER.holding:
        if _REGISTER.pending is None:  # a SIGTERM already waiting stays a SIGTERM
            _REGISTER.pending = signal.SIGINT
        return
    _stop()


def _on_terminate(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _REGISTER.owner:  # a forked worker: ends by the signal, as it would have
        _end_by(signal.SIGTERM)
    if _REGISTER.holding:
        _REGISTER.pending = signal.SIGTERM  # a later Ctrl-C does not make it an interrupt
        return
    _stop(signal.SIGTERM)


def _end_by(signum: int) -> None:
    """End the process by ``signum`` at its default action (``128 + signum`` should it not)."""
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def _stop(signum: int = signal.SIGINT) -> None:
    """Remove what the run wrote and end the process: after Ctrl-C, tell the other ranks, say
    so in one line and exit 130; after SIGTERM, by the signal itself."""
    for each in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the cleanup
        signal.signal(each, signal.SIG_IGN)
    discard()
    if signum == signal.SIGTERM:
        _end_by(signal.SIGTERM)
    for hook in _REGISTER.on_stop:
        with suppress(Exception):
            hook()
    message = _MESSAGE
    with suppress(OSError, ValueError):  # a closed stderr
        if sys.stderr is not None and sys.stderr.isatty():
            message = b"\x1b[?25h\n" + message  # a progress bar hid the cursor mid-line
    with suppress(OSError):
        os.write(_REGISTER.stderr_fd, message)
    os._exit(EXIT_INTERRUPTED)
