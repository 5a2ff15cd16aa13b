"""Every file or folder a run reads is an input, recorded as it is opened; no output replaces one.

The record is kept here, whoever opens what: :func:`curvcal.paths.readable_file` (every
loader's file: checkpoints, tensor and logits files, tables, calibrators, policies, baselines,
JSON configs of model folders) records the file it checked, a loader that hands a whole folder
to a library (transformers, peft, a tokenizer, torchvision, an image folder, a saved dataset)
records the folder with :func:`record`, and :func:`curvcal.load.checkpoints.digest.file_info` records what
it digests. Each entry keeps the role it was read in, the path as given, the resolved path,
the ``(st_dev, st_ino)`` pair and whether it is a folder. A command also *declares* the inputs
its options name (:func:`declare`, called by :func:`curvcal.commands.common.start`), so the
refusal before any work names them by their options.

The no-overwrite rule reads this record, never a list of its own:

* before any work (:func:`curvcal.commands.clashes.refuse_clashes`, from ``start``): each
  output the command line names against every input declared or opened so far;
* when an output is published (:func:`curvcal.atomic.atomic_output`, and a folder created for
  outputs, :func:`refuse_output`): against every input of the run, so a file opened late (an
  adapter's base model folder, found in the adapter's config) is protected as well, with or
  without ``--force``.

A path is an input's when it is the same file (the same resolved path, or the same device and
inode: a hard link) or lies inside an input folder (a file written there would change what
was read, and the folder's digest in the report would no longer describe it).

The record is per run: :func:`recording` opens a fresh one (the CLI group does, for every
invocation) and drops it when the run ends. Outside a run (the library used directly) nothing
is recorded and nothing is refused.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from curvcal.errors import InputError

#: ``(what it is, path)``: an option or argument name (``--data``, ``CHECKPOINT``) and a path.
Named = tuple[str, Path]

HINT = "curvcal never writes over a file it reads, even with --force; name another file"


@dataclass(frozen=True)
class Identity:
    """Where a path really points: its resolved form (absolute, every symbolic link followed),
    its ``(st_dev, st_ino)`` when it exists, and whether it is a folder."""

    resolved: str
    inode: tuple[int, int] | None
    is_dir: bool

    def same_file(self, other: Identity) -> bool:
        """The same resolved path, or the same existing file under another name (a hard link)."""
        if self.resolved == other.resolved:
            return True
        return self.inode is not None and self.inode == other.inode

    def inside(self, folder: Identity) -> bool:
        """Beneath the folder ``folder`` (at any depth)."""
        if not folder.is_dir:
            return False
        base = folder.resolved.rstrip(os.sep) + os.sep  # the root folder ends with one already
        return self.resolved == folder.resolved or self.resolved.startswith(base)


def identity(path: Path, folders: dict[str, str] | None = None) -> Identity:
    """The :class:`Identity` of ``path`` (``~`` expanded, symbolic links and ``..`` followed).

    ``folders`` caches the resolved form of parent folders: the files of one folder (the
    images of an image folder, read one by one) then cost one ``lstat`` and one ``stat`` each,
    not a walk of every component of the path."""
    absolute = os.path.abspath(os.path.expanduser(path))
    resolved = _resolved(absolute, folders)
    try:
        status = os.stat(resolved)
    except (OSError, ValueError):
        return Identity(resolved, None, False)
    return Identity(resolved, (status.st_dev, status.st_ino), stat.S_ISDIR(status.st_mode))


def _resolved(absolute: str, folders: dict[str, str] | None) -> str:
    """``absolute`` with every symbolic link followed; the parent's resolved form from
    ``folders`` when the last component is not a link itself."""
    # os.path.realpath (not Path.resolve) never raises on a symlink loop; a loop or an
    # unreadable path simply has no inode, and the loaders report it in their own words.
    parent, name = os.path.split(absolute)
    if folders is None or not name:
        return os.path.realpath(absolute)
    try:
        if stat.S_ISLNK(os.lstat(absolute).st_mode):
            return os.path.realpath(absolute)
    except (OSError, ValueError):
        return os.path.realpath(absolute)
    real_parent = folders.get(parent)
    if real_parent is None:
        real_parent = folders[parent] = os.path.realpath(parent)
    return os.path.join(real_parent, name)


@dataclass(frozen=True)
class Input:
    """One thing a run reads: ``name`` is the option or argument that named it (``declared``)
    or the role it was opened in (``model folder``, ``policy file``), ``path`` as given."""

    name: str
    path: Path
    identity: Identity
    declared: bool = False

    def described(self) -> str:
        """How a refusal names it: by its option when declared, else by its role."""
        kind = "input folder" if self.identity.is_dir else "input"
        if self.declared:
            return f"the {kind} {self.name} {self.path}"
        return f"the {kind} {self.path} ({self.name})"


@dataclass
class _Record:
    """One run's inputs, and the option that names each of its outputs."""

    inputs: list[Input] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    outputs: dict[str, str] = field(default_factory=dict)
    #: the resolved form of each folder whose files were recorded (see :func:`identity`)
    folders: dict[str, str] = field(default_factory=dict)
    #: the symbolic links beneath each input folder, by the folder's resolved path
    links: dict[str, tuple[tuple[Path, Identity], ...]] = field(default_factory=dict)


_LOCK = threading.Lock()
_RUN: list[_Record] = []  # the active record last; empty outside a run


@contextmanager
def recording() -> Iterator[None]:
    """One run: a fresh, empty record while the block runs, dropped when it ends (an enclosing
    record, if any, comes back)."""
    with _LOCK:
        _RUN.append(_Record())
    try:
        yield
    finally:
        with _LOCK:
            _RUN.pop()


def active() -> bool:
    """Whether a run is recording its inputs."""
    return bool(_RUN)


def record(path: Path, role: str) -> None:
    """Record ``path`` (a file or a folder) as an input of the run, read as ``role``; nothing
    outside a run. A path already recorded in that role is not recorded again (an image read
    once per pass over the data costs one look-up)."""
    if not _RUN:
        return
    key = (role, os.fspath(path))
    with _LOCK:
        if not _RUN or key in _RUN[-1].seen:
            return
        folders = _RUN[-1].folders
    given = path if isinstance(path, Path) else Path(path)
    entry = Input(role, given, identity(given, folders))
    with _LOCK:
        if _RUN:
            _RUN[-1].seen.add(key)
            _RUN[-1].inputs.append(entry)


def import_recorded(name: str, role: str) -> ModuleType:
    """Import the user's module ``name`` (a ``py:`` factory's) and record its source file, when
    it has one, as an input read as ``role``. Nothing is written beside it: Python would cache
    the compiled module in a ``__pycache__`` folder next to the user's file, so the import runs
    with ``sys.dont_write_bytecode`` set (what was set before comes back). ``ImportError``
    as :func:`importlib.import_module` raises it."""
    import importlib
    import sys

    was = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        module = importlib.import_module(name)
    finally:
        sys.dont_write_bytecode = was
    source = getattr(module, "__file__", None)
    if isinstance(source, str) and source:
        record(Path(source), role)
    return module


def declare(named: Sequence[Named]) -> None:
    """Record the inputs a command's options name, under those names (before any is opened)."""
    if not _RUN:
        return
    entries = [Input(name, Path(path), identity(Path(path)), declared=True) for name, path in named]
    with _LOCK:
        if _RUN:
            _RUN[-1].inputs[:0] = entries  # named by their options first


def name_outputs(named: Sequence[Named]) -> None:
    """Remember the option that names each output, for the refusal at publication."""
    if not _RUN:
        return
    with _LOCK:
        if _RUN:
            for option, path in named:
                _RUN[-1].outputs[identity(path).resolved] = option


@contextmanager
def opened_within() -> Iterator[list[Input]]:
    """A list that, when the block ends, holds the inputs first recorded while it ran, in the
    order they were opened (what one load read: a checkpoint, the source of its ``py:``
    architecture, the configs of its model folders); it stays empty outside a run."""
    before = {id(entry) for entry in recorded()}
    opened: list[Input] = []
    try:
        yield opened
    finally:
        opened.extend(entry for entry in recorded() if id(entry) not in before)


def recorded() -> tuple[Input, ...]:
    """The inputs of the run so far (declared first, then in the order opened); empty outside
    a run."""
    with _LOCK:
        return tuple(_RUN[-1].inputs) if _RUN else ()


def refuse_input_target(option: str, path: Path, inputs: Sequence[Input]) -> Identity:
    """Raise :class:`InputError` when ``path`` (named by ``option``) is one of ``inputs`` or
    lies inside one of their folders: one line naming the output and the input. Returns the
    identity of ``path``. The same file is looked for among all inputs before any folder."""
    target = identity(path)
    for source in inputs:
        if target.same_file(source.identity):
            raise InputError(f"{option} {path}", f"would replace {source.described()}", HINT)
    for source in inputs:
        if target.inside(source.identity):
            raise InputError(
                f"{option} {path}",
                f"lies inside {source.described()}, which it would change",
                HINT,
            )
    for source in inputs:
        for link, linked in links_beneath(source.identity):
            if target.same_file(linked) or target.inside(linked):
                raise InputError(
                    f"{option} {path}",
                    f"is what {source.path / link} links to, in {source.described()}, which "
                    "it would change",
                    HINT,
                )
    return target


def links_beneath(folder: Identity) -> tuple[tuple[Path, Identity], ...]:
    """Each symbolic link beneath the input folder ``folder`` (at any depth, links to folders
    not followed), relative to the folder, with the :class:`Identity` of what it points to;
    empty for a file.

    A library reads a folder's files through its links (a Hugging Face cache's snapshot folder
    is links into its ``blobs`` folder; a shard or tokenizer file may be a link to a file kept
    elsewhere), and an output written at the link's target would change what the folder holds,
    though that target lies outside it: the target is an input as much as the folder. (A hard
    link is no such way in: an output replaces its own name with a new file, and the folder's
    name keeps the old one.) The walk reads directory entries only, one ``stat`` per link; it
    is done once per folder and run."""
    if not folder.is_dir:
        return ()
    cache = _RUN[-1].links if _RUN else {}
    found = cache.get(folder.resolved)
    if found is None:
        found = cache[folder.resolved] = tuple(_links(Path(folder.resolved)))
    return found


def _links(root: Path) -> Iterator[tuple[Path, Identity]]:
    pending = [root]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                listed = list(entries)
        except OSError:
            continue  # unreadable: its loader says so, or it was never read
        for entry in listed:
            try:
                if entry.is_symlink():
                    yield Path(entry.path).relative_to(root), identity(Path(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
            except OSError:
                continue


def refuse_output(path: Path, option: str | None = None) -> None:
    """Refuse writing ``path`` (a file, or a folder to create for outputs) when it is an input
    of the run or lies inside an input folder; ``option`` names it, else the option the
    command gave it (:func:`name_outputs`), else ``output``. Nothing outside a run."""
    if not _RUN:
        return
    with _LOCK:
        if not _RUN:
            return
        inputs = tuple(_RUN[-1].inputs)
        named = _RUN[-1].outputs
        option = option or named.get(identity(path).resolved) or "output"
    refuse_input_target(option, path, inputs)
