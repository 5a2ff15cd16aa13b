"""No output replaces an input: every file a run writes is compared with every file it reads.

A run names its inputs (checkpoints, model folders, data files or folders, fit data, logits,
policy, baseline, calibrators) and its outputs (``-o``, ``--plot``, ``--save-logits``, ``--save-calibrator``, the
files of a plot folder) once, and :func:`refuse_clashes` refuses, before any work and whatever
``--force`` says:

* an output that is an input: the same resolved path (symlinks and ``..`` followed) or, when
  both exist, the same file (``st_dev``, ``st_ino``: a hard link);
* an output inside an input folder (an image folder or a model folder, say): a plot written
  there would become one more sample of the dataset, and the folder's digest in the report
  would no longer describe what was read;
* two outputs naming the same file (one would silently replace the other).

Each refusal is one line naming the output with its option and the input it would replace.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from curvcal.errors import InputError

#: ``(what it is, path)``: an option or argument name (``--data``, ``CHECKPOINT``) and a path.
Named = tuple[str, Path]

_HINT = "curvcal never writes over a file it reads, even with --force; name another file"


@dataclass(frozen=True)
class _Identity:
    """Where a path really points: its resolved form, and its (device, inode) when it exists."""

    resolved: Path
    inode: tuple[int, int] | None
    is_dir: bool

    def same_file(self, other: _Identity) -> bool:
        if self.resolved == other.resolved:
            return True
        return self.inode is not None and self.inode == other.inode

    def inside(self, folder: _Identity) -> bool:
        return folder.is_dir and self.resolved.is_relative_to(folder.resolved)


def _identity(path: Path) -> _Identity:
    # os.path.realpath (not Path.resolve) never raises on a symlink loop; a loop or an
    # unreadable path simply has no inode, and the loaders report it in their own words.
    resolved = Path(os.path.realpath(os.path.abspath(os.path.expanduser(path))))
    try:
        status = os.stat(resolved)
    except (OSError, ValueError):
        return _Identity(resolved, None, False)
    return _Identity(resolved, (status.st_dev, status.st_ino), os.path.isdir(resolved))


def data_inputs(option: str, spec: object, data_root: object = None) -> list[Named]:
    """The files or folder a ``--data``-style SPEC reads: a ``folder:`` dataset, a tensor
    file, a text table (``.jsonl``, ``.csv``, ``.parquet``), a ``save_to_disk`` folder (its
    ``state.json`` and ``.arrow`` files), and for ``tv:`` the dataset root (``data_root``,
    ``./data`` by default) whose raw files torchvision reads. Nothing for ``py:``, whose files
    its own code finds, nor for a missing or malformed SPEC, which the data loader reports."""
    if not isinstance(spec, str) or not spec:
        return []
    if spec.startswith("folder:"):
        return [(option, Path(spec[len("folder:") :]))]
    if spec.startswith("curvcal:"):
        from curvcal.assets import demo_data

        return [(option, demo_data())]
    if spec.startswith("tv:"):
        root = Path(str(data_root)) if data_root else Path("data")
        return [("--data-root" if option.startswith("--") else "data_root", root)]
    if spec.startswith("py:"):
        return []
    from curvcal.load.tensorfile import is_tensor_file

    path = Path(spec)
    if is_tensor_file(path):
        return [(option, path)]
    from curvcal.load.text import TEXT_SUFFIXES, is_text_spec, split_spec

    if path.suffix.lower() in TEXT_SUFFIXES:
        return [(option, path)]
    if is_text_spec(spec):
        return [(option, split_spec(spec)[0])]  # the whole saved-dataset folder
    return []


def tokenizer_inputs(option: str, folder: object) -> list[Named]:
    """The ``--tokenizer`` folder (its ``tokenizer.json``, vocabulary and configs are read).
    A tokenizer found in the model folder is covered by that folder's own entry."""
    if isinstance(folder, str | Path) and str(folder):
        return [(option, Path(folder))]
    return []


def checkpoint_inputs(name: str, path: Path, arch: object = None) -> list[Named]:
    """The checkpoint, and a model folder its safetensors metadata names
    (``curvcal.arch = hf:FOLDER``) when no ``--arch`` is given: that folder's ``config.json``
    is read too. The header is read as JSON; no tensor and no code is loaded."""
    named: list[Named] = [(name, path)]
    if arch is not None or path.suffix.lower() != ".safetensors" or not path.is_file():
        return named
    from curvcal.errors import CurvcalError
    from curvcal.load.metadata import ARCH_METADATA_KEY
    from curvcal.load.tensorfile import read_safetensors_metadata

    try:
        metadata = read_safetensors_metadata(path)
    except (CurvcalError, OSError, ValueError):
        return named  # the loader reports a bad header in its own words
    label = f"{name}'s metadata {ARCH_METADATA_KEY}"
    return [*named, *arch_inputs(label, metadata.get(ARCH_METADATA_KEY))]


def arch_inputs(option: str, spec: object) -> list[Named]:
    """The model folder an ``--arch hf:FOLDER`` spec reads (nothing for other specs, whose
    code comes from installed packages)."""
    if isinstance(spec, str) and spec.startswith("hf:") and len(spec) > len("hf:"):
        return [(option, Path(spec[len("hf:") :]))]
    return []


def refuse_clashes(outputs: Sequence[Named], inputs: Sequence[Named]) -> None:
    """Raise :class:`InputError` when an output is an input, lies inside an input folder, or
    names the same file as another output. ``outputs`` are ``(option, path)``; ``inputs`` are
    ``(option or argument, path)``."""
    read = [(name, path, _identity(path)) for name, path in inputs]
    written: list[tuple[str, Path, _Identity]] = []
    for option, path in outputs:
        target = _identity(path)
        for name, source, identity in read:
            if target.same_file(identity):
                raise InputError(
                    f"{option} {path}", f"would replace the input {name} {source}", _HINT
                )
            if target.inside(identity):
                raise InputError(
                    f"{option} {path}",
                    f"lies inside the input folder {name} {source}, which it would change",
                    _HINT,
                )
        for other_option, other, identity in written:
            if target.same_file(identity):
                raise InputError(
                    f"{option} {path}",
                    f"names the same file as {other_option} {other}",
                    "give each output its own file",
                )
        written.append((option, path, target))
