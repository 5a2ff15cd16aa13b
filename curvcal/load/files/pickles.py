"""``torch.save`` pickles, loaded without running their code unless trusted.

Every pickle is scanned opcode by opcode first (:func:`curvcal.load.files.formats.unsafe_globals`):
without ``--trust-checkpoint`` one that needs a global outside torch's weights-only allowlist
and ``--allow-global`` is refused, and the rest go through ``torch.load(weights_only=True)``.
Nothing here falls back to an unsafe load by itself.
"""

from __future__ import annotations

import pickle
import re
import struct
import warnings
from pathlib import Path
from typing import Any

import torch

from curvcal.errors import InputError, TrustError, one_line
from curvcal.load.files.allowlist import allowed_classes, could_be_allowed
from curvcal.load.files.formats import (
    PickleGlobals,
    plain_pickle_globals,
    sniff,
    torch_safe_globals,
    unsafe_globals,
)
from curvcal.load.files.state_dict import find_state_dict, is_state_dict
from curvcal.load.limits import check_zip_sizes
from curvcal.settings.checkpoint import CheckpointSettings

TRUST_HINT = "pass --trust-checkpoint only if you trust the file's source"
_DICT_GLOBALS = frozenset({"collections.OrderedDict", "builtins.dict"})


def import_globals(names: tuple[str, ...]) -> list[Any]:
    """Import each ``module.Class`` given with ``--allow-global``, refusing anything but plain
    data classes (the rule is :mod:`curvcal.load.files.allowlist`)."""
    return list(allowed_classes(names))


def is_module_like(scan: PickleGlobals) -> bool:
    """Whether the pickle's top-level object is built by a class other than a dict (a pickled
    module, as far as a scan can tell)."""
    return scan.top_level is not None and scan.top_level not in _DICT_GLOBALS


def refuse_plain_pickle(path: Path) -> None:
    """A plain Python pickle (not written by ``torch.save``) is never loaded: the error lists
    the globals it would import."""
    names = plain_pickle_globals(path)
    listed = f"; it imports {', '.join(names)}" if names else ""
    raise InputError(
        str(path),
        f"is a plain Python pickle, not a torch.save checkpoint{listed}",
        "curvcal reads files written by torch.save or safetensors; "
        "curvcal inspect lists a pickle's globals without running it",
    )


def outside_torch_allowlist(names: tuple[str, ...]) -> tuple[str, ...]:
    """The ``names`` that torch's weights-only unpickler does not admit."""
    safe = torch_safe_globals()
    return tuple(name for name in names if name not in safe)


def load_state_file(path: Path, options: CheckpointSettings) -> dict[str, torch.Tensor]:
    """The state dict in a ``torch.save`` file, through a weights-only load only (a model
    folder's ``pytorch_model.bin``: its globals are never trusted, whatever the options)."""
    allowed = import_globals(options.allow_global)
    return _state_file(path, options.allow_global, allowed, "cpu")


def state_file_shapes(path: Path) -> list[tuple[int, ...]]:
    """The shape of every tensor of the state dict in a ``torch.save`` file, as
    :func:`load_state_file` admits it with no global allowed (transformers' own weights-only
    load admits none), its tensors placed on the ``meta`` device: a zip file's storages are
    never read, a legacy file's are read once and dropped."""
    return [tuple(tensor.shape) for tensor in _state_file(path, (), [], "meta").values()]


def _state_file(
    path: Path, allow_global: tuple[str, ...], allowed: list[Any], device: str
) -> dict[str, torch.Tensor]:
    container = sniff(path)
    if container.kind not in ("torch-zip", "torch-legacy"):
        raise InputError(str(path), f"is a {container.kind} file, not torch.save weights")
    scan = unsafe_globals(path, container, allow_global, allowed)
    if scan.names:
        raise TrustError(
            str(path),
            f"needs {', '.join(scan.names)} to load, which a weights-only load refuses",
            "re-save the folder with safetensors (save_pretrained does by default)",
        )
    obj = weights_only_load(path, allowed, device)
    try:
        _key, state = find_state_dict(obj)
    except LookupError:
        raise InputError(str(path), "holds no state dict") from None
    if not is_state_dict(state):
        raise InputError(str(path), "holds no state dict (str -> tensor)")
    return dict(state)


def refusal_hint(names: tuple[str, ...], module_like: bool) -> str:
    """The trust hint, plus ``--allow-global`` only when every refused global could be a plain
    data class (never for whole modules, functions or anything from a denied module)."""
    if module_like or not all(could_be_allowed(name) for name in names):
        return TRUST_HINT
    flags = " ".join(f"--allow-global {name}" for name in names)
    return f"{TRUST_HINT}; if these are plain data classes you trust, {flags} admits them and runs no code from the file"


def weights_only_load(path: Path, allowed: list[Any], device: str = "cpu") -> Any:
    """``torch.load(weights_only=True)`` admitting ``allowed``, tensors on ``device`` (``meta``:
    shapes and dtypes only), after the archive's sizes are checked; a refusal is a
    :class:`TrustError`, a corrupt file an :class:`InputError`."""
    check_zip_sizes(path)
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            # torch warns while validating a sparse tensor: the refusal of the layout says it
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower():
            refused = re.findall(r"GLOBAL ([\w.]+)", str(exc))
            raise TrustError(
                str(path),
                f"a weights-only load refused it{' (needs ' + ', '.join(refused) + ')' if refused else ''}",
                TRUST_HINT,
            ) from exc
        raise InputError(str(path), f"corrupt pickle: {one_line(exc)}") from exc
    except (
        RuntimeError,
        EOFError,
        ValueError,
        OSError,
        IndexError,
        KeyError,
        # a corrupt legacy pickle calls torch's allow-listed rebuild functions with the wrong
        # arguments, or names a storage it never defines
        TypeError,
        AssertionError,
        # a corrupt legacy persistent id whose storage type is some other allowed object
        # (a dict: "'dict' object has no attribute 'dtype'"); no code from the file runs here
        AttributeError,
        struct.error,  # a legacy file cut inside a storage's size
    ) as exc:
        raise InputError(
            str(path), f"cannot be read (truncated or corrupt?): {one_line(exc)}"
        ) from exc


def full_load(path: Path) -> Any:
    """Full unpickling: runs code from the file. Only reached with ``trust``; the archive's
    sizes are checked first, as for a weights-only load."""
    check_zip_sizes(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (ImportError, AttributeError) as exc:
        raise InputError(
            str(path),
            f"needs code that is not importable here: {one_line(exc)}",
            "install the package that defined the model",
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError, pickle.UnpicklingError) as exc:
        raise InputError(
            str(path), f"cannot be read (truncated or corrupt?): {one_line(exc)}"
        ) from exc


def type_name(obj: Any) -> str:
    """``module.QualifiedName`` of ``obj``'s class."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
