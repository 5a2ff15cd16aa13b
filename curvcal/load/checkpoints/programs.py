"""Archives that carry a program: TorchScript (``torch.jit.save``) and torch.export
(``torch.export.save``, ``.pt2``). Loading either runs code from the file, so both need
``--trust-checkpoint``."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from curvcal.errors import InputError, TrustError, one_line
from curvcal.load.checkpoints.loaded_model import ModuleFound
from curvcal.load.files.pickles import TRUST_HINT
from curvcal.settings.checkpoint import CheckpointSettings

EXPORTED_MODE_NOTE = (
    "exported programs keep the train/eval mode they were exported in; eval()/train() cannot "
    "switch them"
)


def load_torchscript(path: Path, options: CheckpointSettings, device: torch.device) -> ModuleFound:
    """A TorchScript archive, loaded onto ``device``."""
    _require_trust(path, options, "a TorchScript archive, which carries code")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=device)
    except RuntimeError as exc:
        raise InputError(str(path), f"cannot load TorchScript archive: {one_line(exc)}") from exc
    return ModuleFound(module=module, form="torchscript")


def load_exported(path: Path, options: CheckpointSettings, device: torch.device) -> ModuleFound:
    """A torch.export archive's program as a module, moved to ``device``; it keeps the
    train/eval mode it was exported in (:data:`EXPORTED_MODE_NOTE`)."""
    _require_trust(path, options, "a torch.export archive, which carries a program")
    try:
        with warnings.catch_warnings(), _logged_causes("torch.export") as causes:
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.load(str(path))
            if device.type != "cpu":
                from torch.export.passes import move_to_device_pass

                program = move_to_device_pass(program, device)
    except (RuntimeError, ValueError, KeyError) as exc:
        # torch logs the archive's fault, then raises "... check the warnings above", which a
        # run without --debug never shows: the logged cause is the reason
        reason = causes[-1] if causes else one_line(exc)
        raise InputError(str(path), f"cannot load exported program: {reason}") from exc
    metadata = {"note": EXPORTED_MODE_NOTE}
    return ModuleFound(module=program.module(), form="exported_program", metadata=metadata)


@contextmanager
def _logged_causes(logger_name: str) -> Iterator[list[str]]:
    """Hold back the records of ``logger_name`` at warning level and above while the block runs
    (torch logs an archive's fault with its traceback, which would print before curvcal's
    error line) and give the exceptions they carry, each on one line, for the error to quote;
    the logger's handlers and propagation come back after."""
    causes: list[str] = []

    class _Causes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                causes.append(one_line(record.exc_info[1]))

    logger = logging.getLogger(logger_name)
    saved = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [_Causes(logging.WARNING)], False
    try:
        yield causes
    finally:
        logger.handlers, logger.propagate = saved


def _require_trust(path: Path, options: CheckpointSettings, archive: str) -> None:
    if not options.trust_checkpoint:
        raise TrustError(str(path), f"is {archive} that runs when loaded", TRUST_HINT)
